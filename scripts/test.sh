#!/usr/bin/env bash
# The whole test suite: unit, property, integration and fault tests of every
# crate, then the benchmark suite's smoke mode so bench/ cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# No module imports another that imports it back (issue 16), no folder
# another folder of its level (issue 37); fails fast. Then the check's own tests.
python3 scripts/module_cycles.py
python3 scripts/test_module_cycles.py
python3 scripts/doc_paths.py
command -v cargo >/dev/null 2>&1 || export PATH="$HOME/.cargo/bin:$PATH"
# Release profile: the integration tests move real data through real
# daemons; the test build also produces target/release/ramsys for the
# benchmark smoke run below.
# The WAN emulator first: tests/streams.rs runs a long path through it.
cargo build --release -p wanem
log=$(mktemp)
rc=0
# Every test binary runs (--no-fail-fast): one run names every failure.
# A hung test must end the run red with its name printed (cargo names a
# test running over 60 s), not outlast CI's own limit: 40 min is ~4x a run.
timeout -k 30 2400 cargo test --workspace --release --no-fail-fast -- --test-threads 2 2>&1 | tee "$log" || rc=$?
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || echo "tests: killed after 40 min; the test named 'running for over 60 seconds' above hung" >&2
# One line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ {p += $4; f += $6; i += $8; n++}
     END {printf "tests: %d passed, %d failed, %d ignored in %d test binaries\n", p, f, i, n}' "$log"
rm -f "$log"
[ "$rc" -eq 0 ] || exit "$rc"
cargo build --release -p ramsys
# The Debian package: build, dpkg -i, systemd-analyze verify, the daemon
# started as its unit starts it, a transfer, dpkg --purge (~20 s).
bash scripts/test-package.sh --no-build
# The Grafana dashboard against Debian's Prometheus scraping a daemon
# during transfers: every queried metric exists, throughput moves (~20 s).
python3 scripts/test-dashboard.py
# bench/hddemu's seek-cost model (pure Python; no FUSE needed).
if [ -d bench/hddemu ]; then
    python3 -m unittest discover -s bench/hddemu
fi
if [ -f bench/run.py ]; then
    python3 bench/run.py --smoke
fi
