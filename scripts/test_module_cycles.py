#!/usr/bin/env python3
"""Tests of scripts/module_cycles.py on made-up crates (issue 37): a
folder-level cycle that no two files close fails, a tree whose folders
import downwards passes, and an item the crate root re-exports counts as
an edge to the module that defines it."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "module_cycles.py")


def crate(files):
    """A crates/ dir with one crate `c` holding `files` (path -> text)."""
    root = tempfile.mkdtemp()
    for path, text in files.items():
        p = os.path.join(root, "c", "src", path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    return root


def run(root):
    r = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
    return r.returncode, r.stdout


class FolderCycles(unittest.TestCase):
    def test_folders_importing_each_other_fail_without_a_file_cycle(self):
        # data::files -> sync::journal and sync::sink -> data::files: no
        # file imports one that imports it back, but data/ <-> sync/.
        root = crate({
            "lib.rs": "pub mod data;\npub mod sync;\n",
            "data/mod.rs": "pub mod files;\n",
            "data/files.rs": "use crate::sync::journal::Row;\npub struct Table;\n",
            "sync/mod.rs": "pub mod journal;\npub mod sink;\n",
            "sync/journal.rs": "pub struct Row;\n",
            "sync/sink.rs": "use crate::data::files::Table;\n",
        })
        code, out = run(root)
        self.assertEqual(code, 1, out)
        self.assertIn("folder cycle in src/: data <-> sync", out)
        self.assertNotIn("module cycle:", out)
        self.assertIn("data::files -> sync::journal", out)

    def test_a_cycle_inside_a_sub_folder_names_that_folder(self):
        root = crate({
            "lib.rs": "pub mod roles;\n",
            "roles/mod.rs": "pub mod a;\npub mod b;\n",
            "roles/a/mod.rs": "pub mod x;\npub mod y;\n",
            "roles/a/x.rs": "use crate::roles::b::p::P;\npub struct X;\n",
            "roles/a/y.rs": "pub struct Y;\n",
            "roles/b/mod.rs": "pub mod p;\npub mod q;\n",
            "roles/b/p.rs": "pub struct P;\n",
            "roles/b/q.rs": "use crate::roles::a::y::Y;\n",
        })
        code, out = run(root)
        self.assertEqual(code, 1, out)
        self.assertIn("folder cycle in roles/: roles::a <-> roles::b", out)

    def test_downward_folders_pass(self):
        root = crate({
            "lib.rs": "pub mod roles;\npub mod types;\npub use types::err::Error;\n",
            "roles/mod.rs": "pub mod sink;\n",
            "roles/sink.rs": "use crate::types::err::Error;\n",
            "types/mod.rs": "pub mod err;\n",
            "types/err.rs": "pub struct Error;\n",
        })
        code, out = run(root)
        self.assertEqual(code, 0, out)
        self.assertIn("module cycles: none", out)

    def test_a_root_re_export_is_an_edge_to_its_module(self):
        # types::err takes crate::Sink, which lib.rs re-exports from roles:
        # that is types -> roles, closing a circle with roles -> types.
        root = crate({
            "lib.rs": "pub mod roles;\npub mod types;\npub use roles::sink::Sink;\n",
            "roles/mod.rs": "pub mod sink;\n",
            "roles/sink.rs": "use crate::types::err::Error;\npub struct Sink;\n",
            "types/mod.rs": "pub mod err;\n",
            "types/err.rs": "pub struct Error;\nfn f(_: crate::Sink) {}\n",
        })
        code, out = run(root)
        self.assertEqual(code, 1, out)
        self.assertIn("roles <-> types", out)


if __name__ == "__main__":
    unittest.main()
