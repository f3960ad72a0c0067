#!/usr/bin/env python3
"""Every file a document names in backticks exists (issue 37: docs follow
the moves). A name with a '/' must be the tail of a tracked path; a bare
file name must be some tracked file's name. Prints the stale ones and
exits 1."""
import re, subprocess, sys

files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
names = {f.rsplit("/", 1)[-1] for f in files}
# Folder module paths too: `roles/server` for roles/server/mod.rs or roles/server.rs.
tails = set()
for f in files:
    parts = f.split("/")
    for i in range(len(parts)):
        tails.add("/".join(parts[i:]))
        tails.add("/".join(parts[i:-1]))

tok = re.compile(r"`([A-Za-z0-9_./-]+\.(?:rs|py|sh|md|toml))(?::\d+)?`")
bad = []
docs = [f for f in files if f.endswith(".md")]
for d in docs:
    text = open(d, encoding="utf-8", errors="replace").read()
    for n, line in enumerate(text.splitlines(), 1):
        for m in tok.finditer(line):
            p = m.group(1)
            # Absolute paths are the operator's; ../ leaves the repository.
            if p.startswith(("/", "../")) or "*" in p:
                continue
            p = p.removeprefix("./")
            ok = p in tails if "/" in p else p in names
            if not ok:
                bad.append(f"{d}:{n}: `{m.group(1)}` names no file in the tree")
for b in bad:
    print(b)
print(f"doc paths: {len(bad)} stale" if bad else "doc paths: all exist")
sys.exit(1 if bad else 0)
