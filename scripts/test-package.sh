#!/usr/bin/env bash
# CI test of the Debian package (issue 20): build it, install it with dpkg,
# check the unit with `systemd-analyze verify`, start the daemon as the
# unit's ExecStart does (its user, environment files and sandbox, emulated:
# systemd is not PID 1 in CI), move a small tree through it on loopback
# with the installed binary as the agent, then purge the package and check
# that nothing of it is left. Needs root (CI runs as root) and a machine
# without ramsys installed; about 10-20 s once the binary is built.
#
#   scripts/test-package.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "test-package: $*"; }
fail() { echo "test-package: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || { say "skipped: needs root (dpkg -i, a system user)"; exit 0; }
command -v dpkg >/dev/null || { say "skipped: not a Debian system (no dpkg)"; exit 0; }
# Leave the machine as it was: refuse to run over an existing install.
if dpkg -s ramsys >/dev/null 2>&1; then fail "the ramsys package is installed here; purge it first"; fi
if getent passwd ramsys >/dev/null; then fail "a ramsys user exists here; the test would delete it"; fi
for p in /srv/ramsys /var/lib/ramsys /etc/ramsys; do
    [ ! -e "$p" ] || fail "$p exists here; the test would delete it"
done

# systemd-analyze (the systemd package; no need for it to run), strip and
# objdump (binutils), setpriv and unshare (util-linux).
need=()
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v objdump >/dev/null || need+=(binutils)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

t0=$(date +%s)
deb=$(bash scripts/build-deb.sh "$@" | tail -1)
work=$(mktemp -d /tmp/ramsys-pkg.XXXXXX)
daemon=""
cleanup() {
    set +e
    if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; fi
    rm -rf /srv/ramsys/pkgtest
    DEBIAN_FRONTEND=noninteractive dpkg --purge ramsys >/dev/null 2>&1
    if getent passwd ramsys >/dev/null; then
        echo "test-package: the ramsys user is still here (a process of it left?): $(pgrep -u ramsys -a)" >&2
    fi
    rm -rf "$work"
}
trap cleanup EXIT

say "installing $deb"
DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -i"; }
unit=/lib/systemd/system/ramsys.service
[ -x /usr/bin/ramsys ] || fail "no /usr/bin/ramsys after install"
getent passwd ramsys >/dev/null || fail "postinst did not create the ramsys user"
[ "$(stat -c %U:%a /var/lib/ramsys)" = ramsys:700 ] || fail "/var/lib/ramsys: $(stat -c %U:%a /var/lib/ramsys)"
dpkg-query -W -f='${Conffiles}\n' ramsys | grep -q /etc/ramsys/ramsys.toml || fail "ramsys.toml is not a conffile"

say "systemd-analyze verify $unit"
systemd-analyze verify "$unit" >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "systemd-analyze verify"; }
# A clean unit says nothing; anything naming it is a problem.
if grep -i 'ramsys' "$work/verify.log"; then fail "systemd-analyze verify complains about the unit"; fi

# The unit's own settings, read from the installed file.
key() { sed -n "s/^$1=//p" "$unit" | tail -1; }
user=$(key User); group=$(key Group)
execstart=$(key ExecStart)
rw_paths=$(key ReadWritePaths)
state=/var/lib/$(key StateDirectory)
[ "$(key ProtectSystem)" = strict ] && [ "$(key NoNewPrivileges)" = yes ] && [ "$(key PrivateTmp)" = yes ] \
    || fail "the unit lost its hardening"
# Where to listen: what an operator writes into the environment file
# (loopback, a free port; metrics too, for the status check below).
cat >>/etc/default/ramsys <<CONF
RAMSYS_LISTEN=127.0.0.1:0
RAMSYS_OPTS="--metrics 127.0.0.1:0"
CONF
# Environment=, then EnvironmentFile= over it, then ExecStart's $VAR and
# ${VAR} expanded as systemd does for these simple values.
argv=$(
    set -a
    for kv in $(key Environment); do eval "$kv"; done
    # shellcheck disable=SC1091
    . /etc/default/ramsys
    eval "set -- $execstart"
    printf '%q ' "$@"
)
say "ExecStart as $user: $argv"

# The sandbox, as far as it matters for what the daemon may touch:
# ProtectSystem=strict (everything read-only) but ReadWritePaths= and the
# StateDirectory=, PrivateTmp=, NoNewPrivileges=, no capabilities, and
# the unit's LimitNOFILE= and LimitMEMLOCK=.
memlock=$(key LimitMEMLOCK | sed s/infinity/unlimited/)
sandboxed() {
    local s="mount --make-rprivate /"
    for p in $rw_paths "$state"; do s+=" && mount --bind $p $p"; done
    s+=" && mount -o remount,bind,ro / && mount -t tmpfs -o mode=1777 tmpfs /tmp"
    # (Best effort: raising a hard limit needs CAP_SYS_RESOURCE, which
    # systemd has and some containers do not.)
    s+=" && { { ulimit -n $(key LimitNOFILE); ulimit -l $memlock; } 2>/dev/null || true; }"
    s+=" && exec setpriv --reuid=$user --regid=$group --init-groups --no-new-privs --bounding-set=-all --inh-caps=-all -- $1"
    # exec: run in ( ) or &, the daemon's pid is the one $! gives.
    exec unshare --mount sh -c "$s"
}
if unshare --mount true 2>/dev/null; then
    # The emulation holds: /var/tmp is writable by anyone but not in there,
    # the export root is.
    if (sandboxed "touch /var/tmp/ramsys-pkgtest") 2>/dev/null; then
        rm -f /var/tmp/ramsys-pkgtest
        fail "the sandbox emulation lets the service write /var/tmp"
    fi
    (sandboxed "touch /srv/ramsys/probe") || fail "the sandbox emulation keeps the service from its root"
    rm -f /srv/ramsys/probe
    sandboxed "$argv" >"$work/daemon.out" 2>"$work/daemon.err" &
else
    say "no mount namespace here: running without the ProtectSystem/PrivateTmp emulation"
    # shellcheck disable=SC2086
    eval "setpriv --reuid=$user --regid=$group --init-groups --no-new-privs -- $argv" >"$work/daemon.out" 2>"$work/daemon.err" &
fi
daemon=$!
for _ in $(seq 100); do
    grep -q '^metrics on' "$work/daemon.out" 2>/dev/null && break
    kill -0 "$daemon" 2>/dev/null || { cat "$work/daemon.err"; fail "the daemon exited"; }
    sleep 0.1
done
addr=$(sed -n 's/^listening on //p' "$work/daemon.out")
metrics=$(sed -n 's/^metrics on //p' "$work/daemon.out")
[ -n "$addr" ] && [ -n "$metrics" ] || { cat "$work/daemon.err"; fail "the daemon did not start"; }
[ "$(stat -c %U "/proc/$daemon")" = "$user" ] || fail "the daemon does not run as $user"
if sh -c "ulimit -l $memlock" 2>/dev/null; then
    grep -q '^Max locked memory *unlimited' "/proc/$daemon/limits" || fail "LimitMEMLOCK= not applied"
else
    say "cannot raise RLIMIT_MEMLOCK here (no CAP_SYS_RESOURCE): LimitMEMLOCK= not emulated"
fi
say "daemon (pid $daemon) listening on $addr"

# Key generation on first start: the daemon made it, 0600, its own.
[ "$(stat -c %U:%a "$state/key")" = "$user:600" ] || fail "key: $(stat -c %U:%a "$state/key" 2>&1)"

# A real small transfer with the installed binary: push a tree, pull it back.
src="$work/src"
mkdir -p "$src/sub/deeper"
head -c 3M /dev/urandom >"$src/big.bin"
head -c 1234 /dev/urandom >"$src/sub/small.bin"
echo hello >"$src/sub/deeper/hello.txt"
ln -s ../big.bin "$src/sub/link"
k=(--key-file "$state/key")
/usr/bin/ramsys cp -r "${k[@]}" "$src" "ramsys://$addr/pkgtest" >"$work/push.log" 2>&1 \
    || { cat "$work/push.log" "$work/daemon.err"; fail "push to the installed daemon"; }
[ "$(stat -c %U /srv/ramsys/pkgtest/big.bin)" = "$user" ] || fail "pushed files are not owned by $user"
/usr/bin/ramsys cp -r "${k[@]}" "ramsys://$addr/pkgtest" "$work/back" >"$work/pull.log" 2>&1 \
    || { cat "$work/pull.log" "$work/daemon.err"; fail "pull from the installed daemon"; }
diff -r --no-dereference "$src" "$work/back" || fail "the tree came back different"
/usr/bin/ramsys status "${k[@]}" "ramsys://$addr" --json >"$work/status.json" || fail "ramsys status"
python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['totals']; sys.exit(0 if t['bytes_in'] > 0 and t['bytes_out'] > 0 else 1)" \
    "$work/status.json" || fail "status shows no bytes in or out: $(cat "$work/status.json")"
curl_metrics=$(python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://$metrics/metrics').read().decode())")
grep -q '^ramsys_bytes_total{direction="in"} [1-9]' <<<"$curl_metrics" || fail "metrics show no bytes in"

kill "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=""
# Logs went to stderr (the journal under systemd), without colour codes.
grep -q 'serving /srv/ramsys' "$work/daemon.err" || { cat "$work/daemon.err"; fail "no start-up line on stderr"; }
if grep -q $'\e\[' "$work/daemon.err"; then fail "colour codes in the log"; fi

rm -rf /srv/ramsys/pkgtest
DEBIAN_FRONTEND=noninteractive dpkg --purge ramsys >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg --purge"; }
for p in /usr/bin/ramsys "$unit" /etc/ramsys /etc/default/ramsys /var/lib/ramsys /srv/ramsys; do
    [ ! -e "$p" ] || fail "$p left behind by dpkg --purge"
done
if getent passwd ramsys >/dev/null; then fail "the ramsys user is left behind"; fi
say "ok ($(( $(date +%s) - t0 )) s)"
