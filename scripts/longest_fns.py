#!/usr/bin/env python3
"""The longest functions of the workspace (issue 16: none in the engine or
the binary over ~120 lines without a comment saying why).

Counts the lines from a `fn` line to its closing brace, tests excluded
(a file's `#[cfg(test)]` module and the `tests.rs` files such modules
live in).
Usage: scripts/longest_fns.py [N] [DIR...]   (default 15, crates/*/src)
"""
import glob
import re
import sys


FN_RE = re.compile(r"^(\s*)(?:pub(?:\([a-z]+\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\S+\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def functions(path):
    """(lines, where, name) of every function with a body. The code is
    rustfmt'd (CI checks it), so a body ends at the first line that is a
    closing brace at the indentation of its `fn` line."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]"):
            break
        m = FN_RE.match(line)
        if not m:
            continue
        end = m.group(1) + "}"
        for j in range(i, len(lines)):
            if lines[j].rstrip().endswith(";") and j == i:
                break
            if lines[j] == end or (j == i and line.rstrip().endswith("}")):
                out.append((j - i + 1, f"{path}:{i + 1}", m.group(2)))
                break
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    dirs = sys.argv[2:] or sorted(glob.glob("crates/*/src"))
    found = []
    for d in dirs:
        for p in glob.glob(f"{d}/**/*.rs", recursive=True):
            if p.endswith("/tests.rs"):
                continue
            found.extend(functions(p))
    for length, where, name in sorted(found, reverse=True)[:n]:
        print(f"{length:5} {name:32} {where}")


if __name__ == "__main__":
    main()
