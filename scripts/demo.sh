#!/usr/bin/env bash
# Demo: build ramsys, generate a tree, start a local daemon on loopback,
# copy the tree through it and print the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
command -v cargo >/dev/null 2>&1 || export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p ramsys
BIN="${CARGO_TARGET_DIR:-target}/release/ramsys"
WORK=$(mktemp -d /tmp/ramsys-demo.XXXXXX)
trap 'kill $DPID 2>/dev/null || true; rm -rf "$WORK"' EXIT
export RAMSYS_KEY_FILE="$WORK/key"
python3 - "$WORK/data" <<'PY'
import os, random, sys
root = sys.argv[1]; rnd = random.Random(2015)
for d in range(50):
    p = os.path.join(root, f"dir{d:02}", f"sub{d % 7}")
    os.makedirs(p, exist_ok=True)
    for f in range(100):
        n = int(rnd.lognormvariate(9.5, 1.5)) % (4 << 20)
        with open(os.path.join(p, f"file{f:03}.bin"), "wb") as fh:
            fh.write(os.urandom(n))
with open(os.path.join(root, "large.bin"), "wb") as fh:
    fh.write(os.urandom(256 << 20))
PY
mkdir -p "$WORK/export"
"$BIN" serve --listen 127.0.0.1:0 --root "$WORK/export" > "$WORK/daemon.out" &
DPID=$!
for _ in $(seq 50); do grep -q listening "$WORK/daemon.out" 2>/dev/null && break; sleep 0.1; done
ADDR=$(sed -n 's/^listening on //p' "$WORK/daemon.out")
echo "daemon on $ADDR serving $WORK/export"
du -sh "$WORK/data"
"$BIN" cp -r "$WORK/data" "ramsys://$ADDR/"
"$BIN" cp -r --json "$WORK/data" "ramsys://$ADDR/again" | tail -1
diff -r "$WORK/data" "$WORK/export/data" && echo "verified: destination identical to source"
