#!/usr/bin/env bash
# The whole test suite: unit, property, integration and fault tests of every
# crate, then the benchmark suite's smoke mode so bench/ cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
command -v cargo >/dev/null 2>&1 || export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p ramsys
cargo test --workspace --release -- --test-threads 2
if [ -f bench/run.py ]; then
    python3 bench/run.py --smoke
fi
