#!/usr/bin/env python3
"""Fail when modules of a crate import each other in a circle (issue 16).

Nodes are the file modules of each crate under crates/*/src (`storage::uring`,
`data::reader`, ...). An edge A -> B is a path `crate::B::...` (or `super::`
resolved to it) written in A outside its `#[cfg(test)]` module: tests may
reach anywhere. A reference to a directory module's own item (`crate::data::X`
declared in data/mod.rs) is an edge to that mod.rs; a parent's `mod child;`
declaration is not an edge, and a private child module (`mod x;`, not
`pub mod x;`) counts as part of its parent. Every strongly connected component with more
than one module is a cycle; the script prints each and exits 1.

Usage: scripts/module_cycles.py [CRATES_DIR]   (default: crates)
"""
import os
import re
import sys

PATH_RE = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)


def modules(src):
    """file path -> module path tuple, for one crate's src dir."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                mod = ()
            elif rel[-1] == "mod":
                mod = tuple(rel[:-1])
            else:
                mod = tuple(rel)
            if rel[0] == "bin":
                continue
            out[p] = mod
    return out


def strip_tests(text):
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def resolve(mod, is_dir_mod, head, segs, known):
    """The module a path names: the longest known prefix."""
    if head == "crate":
        base = ()
    else:  # super: the parent of this module (of its directory for mod.rs)
        base = mod[:-1]
    # super::super::x
    while segs and segs[0] == "super":
        base = base[:-1]
        segs = segs[1:]
    full = base + tuple(segs)
    for n in range(len(full), -1, -1):
        if full[:n] in known:
            return full[:n]
    return None


def edges_of(path, mod, known):
    text = strip_comments(strip_tests(open(path, encoding="utf-8").read()))
    is_dir_mod = path.endswith("mod.rs") or path.endswith("lib.rs") or path.endswith("main.rs")
    out = set()
    refs = []
    for m in USE_GROUP_RE.finditer(text):
        head, prefix = m.group(1), [s for s in m.group(2).split("::") if s]
        for item in re.split(r"[,\s]+", m.group(3)):
            item = item.strip().split("::")
            item = [s for s in item if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", s)]
            if item and item[0] != "self":
                refs.append((head, prefix + item))
            elif item == ["self"] or item[:1] == ["self"]:
                refs.append((head, prefix))
    text = USE_GROUP_RE.sub("", text)
    for m in PATH_RE.finditer(text):
        refs.append((m.group(1), [s for s in m.group(2).split("::") if s]))
    for head, segs in refs:
        target = resolve(mod, is_dir_mod, head, segs, known)
        if target is None or target == mod:
            continue
        # A module's use of its own ancestors' items through `super` or
        # `crate` counts; its ancestors only count as a target if the item
        # is declared there (the longest-prefix rule above).
        out.add(target)
    return out


def sccs(graph):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) if m else "(crate root)"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "crates"
    bad = 0
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not os.path.isdir(src):
            continue
        mods = modules(src)
        known = set(mods.values())
        # A private submodule (`mod x;`, not `pub mod x;`) is a part of its
        # parent (e.g. data::reader's io_uring loop): one node with it.
        owner = {}
        for path, mod in mods.items():
            text = strip_comments(strip_tests(open(path, encoding="utf-8").read()))
            if mod == ():
                continue  # a binary's top-level modules are all private
            for m in re.finditer(r"^\s*mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", text, re.M):
                owner[mod + (m.group(1),)] = mod

        def node(m):
            while m in owner:
                m = owner[m]
            return m

        graph = {}
        for path, mod in mods.items():
            # The crate root re-exports and declares; it is no cycle member.
            if mod == ():
                continue
            me = node(mod)
            graph.setdefault(me, set()).update(
                node(t) for t in edges_of(path, mod, known) if t != () and node(t) != me
            )
        for comp in sccs(graph):
            if len(comp) > 1:
                bad += 1
                print(f"{crate}: module cycle: " + " <-> ".join(sorted(name(m) for m in comp)))
    if bad:
        print(f"{bad} module cycle(s): move the shared piece down (docs/ARCHITECTURE.md)")
        return 1
    print("module cycles: none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
