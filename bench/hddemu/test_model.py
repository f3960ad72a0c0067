"""Cost model of hddemu (no FUSE needed): python3 -m unittest discover -s bench/hddemu"""
import math
import sys
import types
import unittest
from pathlib import Path

# hddemu imports a FUSE binding at load time; the model does not use it.
if "fusepy" not in sys.modules:
    stub = types.ModuleType("fusepy")
    stub.Operations = object
    stub.FuseOSError = OSError
    sys.modules["fusepy"] = stub
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hddemu  # noqa: E402

MB = 1_000_000
SIZE = 1 << 30


def disk(**kw):
    a = dict(bw_mbs=100.0, seek_min_ms=1.0, seek_full_ms=9.0, rpm=6000.0, track=1 << 20,
             credit_ms=2.0, trace=None, on=True)
    a.update(kw)
    return hddemu.Disk(types.SimpleNamespace(**a), SIZE)


class Model(unittest.TestCase):
    def test_sequential_costs_transfer_only(self):
        d = disk()
        d.service(0, MB, False)
        d.service(MB, MB, False)
        self.assertEqual(d.c["sequential"], 2)
        self.assertEqual(d.c["seeks"], 0)
        self.assertAlmostEqual(d.c["busy_s"], 0.02)

    def test_short_forward_gap_is_read_past(self):
        d = disk()
        d.service(0, 4096, False)
        d.service(4096 + 500_000, 4096, False)
        self.assertEqual(d.c["short_skips"], 1)
        self.assertEqual(d.c["skip_bytes"], 500_000)
        self.assertAlmostEqual(d.c["busy_s"], (4096 * 2 + 500_000) / 100e6)

    def test_backward_and_far_accesses_seek(self):
        d = disk()
        d.service(0, 4096, False)
        far = SIZE // 4
        d.service(far, 4096, False)  # forward, beyond the track window
        d.service(0, 4096, True)  # backward: a seek even though it is near
        self.assertEqual(d.c["seeks"], 2)
        self.assertEqual(d.c["seek_distance"], (far - 4096) + (far + 4096))
        rot = 30.0 / 6000.0
        one = 0.001 + 0.008 * math.sqrt((far - 4096) / SIZE) + rot
        two = 0.001 + 0.008 * math.sqrt((far + 4096) / SIZE) + rot
        self.assertAlmostEqual(d.c["seek_s"], one + two)
        self.assertEqual((d.c["reads"], d.c["writes"]), (2, 1))
        self.assertEqual((d.c["bytes_read"], d.c["bytes_written"]), (8192, 4096))

    def test_off_tracks_the_head_without_counting(self):
        d = disk(on=False)
        d.service(SIZE // 2, 4096, False)
        self.assertEqual(d.c["requests"], 0)
        d.enabled = True
        d.service(SIZE // 2 + 4096, 4096, False)  # continues where the head is
        self.assertEqual((d.c["sequential"], d.c["seeks"]), (1, 0))

    def test_reset_and_stats(self):
        d = disk()
        d.service(SIZE // 2, 4096, False)
        self.assertIn(b'"seeks": 1', d.stats())
        d.reset()
        self.assertIn(b'"seeks": 0', d.stats())


if __name__ == "__main__":
    unittest.main()
