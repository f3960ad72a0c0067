#!/usr/bin/env python3
"""Fail when modules of a crate import each other in a circle (issue 16),
or when the folders of one level do (issue 37).

Nodes are the file modules of each crate under crates/*/src (`storage::uring`,
`data::reader`, ...). An edge A -> B is a path `crate::B::...` (or `super::`
resolved to it) written in A outside its `#[cfg(test)]` module: tests may
reach anywhere. A reference to a directory module's own item (`crate::data::X`
declared in data/mod.rs) is an edge to that mod.rs; an item the crate root
re-exports (`crate::Stats`, `pub use types::stats::Stats;` in lib.rs) is an
edge to the module it comes from; a parent's `mod child;` declaration is not
an edge, and a private child module (`mod x;`, not `pub mod x;`) counts as
part of its parent. Every strongly connected component with more than one
module is a cycle; the script prints each and exits 1.

Folder levels (issue 37): the folder tree is read as layers, so at every
folder (the crate root, `roles/`, `roles/sink/`, ...) its children (files and
sub-folders, each with everything below it) must import each other without a
circle too: an edge A -> B between two modules counts as an edge between the
children of their nearest common folder that hold them. A file-level cycle
needs two files; a folder-level cycle such as data/ <-> sync/ can pass the
file check (data::sinkfiles -> sync::journal, sync::sink -> data::sinkfiles)
and is still a circle a reader has to break in their head.

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


def root_reexports(src, known):
    """`pub use a::b::C;` / `pub use a::b::{C, D};` in lib.rs: name -> module."""
    out = {}
    lib = os.path.join(src, "lib.rs")
    if not os.path.exists(lib):
        return out
    text = strip_comments(strip_tests(open(lib, encoding="utf-8").read()))
    for m in re.finditer(r"^pub use\s+([A-Za-z0-9_:]+?)(?:::\{([^}]*)\}|::([A-Za-z_][A-Za-z0-9_]*))\s*;", text, re.M):
        prefix = tuple(s for s in m.group(1).split("::") if s and s != "crate")
        names = [n.strip() for n in (m.group(2) or m.group(3)).split(",") if n.strip()]
        for n in names:
            full = prefix + (n,) if m.group(2) else prefix + (m.group(3),)
            for k in range(len(full), 0, -1):
                if full[:k] in known:
                    out[n] = full[:k]
                    break
    return out


def edges_of(path, mod, known, reexports=None):
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
        if target == () and head == "crate" and segs and reexports and segs[0] in reexports:
            target = reexports[segs[0]]
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


def folder_cycles(graph):
    """Cycles between the children of each folder: [(folder, [child, ...])]."""
    levels = {}
    for a, outs in graph.items():
        for b in outs:
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            if n == len(a) or n == len(b):
                continue  # one holds the other: the file-level check's case
            folder = a[:n]
            levels.setdefault(folder, {}).setdefault(a[: n + 1], set()).add(b[: n + 1])
    out = []
    for folder, g in sorted(levels.items()):
        for comp in sccs(g):
            if len(comp) > 1:
                out.append((folder, sorted(comp)))
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
        reexports = root_reexports(src, known)
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
                node(t) for t in edges_of(path, mod, known, reexports) if t != () and node(t) != me
            )
        for comp in sccs(graph):
            if len(comp) > 1:
                bad += 1
                print(f"{crate}: module cycle: " + " <-> ".join(sorted(name(m) for m in comp)))
        for folder, comp in folder_cycles(graph):
            bad += 1
            where = name(folder) + "/" if folder else "src/"
            print(f"{crate}: folder cycle in {where}: " + " <-> ".join(name(m) for m in comp))
            # Each arrow between the members, with one import behind it: the
            # arrow with the fewest imports is usually the one to break.
            arrows = {}
            for path, mod in sorted(mods.items()):
                src_child = next((a for a in comp if mod[: len(a)] == a), None)
                if src_child is None:
                    continue
                for t in sorted(edges_of(path, mod, known, reexports)):
                    dst = next((b for b in comp if t[: len(b)] == b and b != src_child), None)
                    if dst is not None:
                        arrows.setdefault((src_child, dst), []).append(f"{name(mod)} -> {name(t)}")
            for (a, b), why in sorted(arrows.items(), key=lambda x: len(x[1])):
                print(f"    {name(a)} -> {name(b)}: {len(why)} import(s), e.g. {why[0]}")
    if bad:
        print(f"{bad} module or folder cycle(s): move the shared piece down (docs/ARCHITECTURE.md)")
        return 1
    print("module cycles: none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
