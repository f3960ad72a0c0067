#!/usr/bin/env python3
"""hddemu: a seek-cost emulator for one rotational disk, as a FUSE file.

Exposes MOUNT/disk.img, backed by IMAGE (keep it on tmpfs so the backing
store adds no cost of its own), where every read and write waits as long as
a single-actuator disk would take to serve it:

    same place as the last access ends      transfer only
    forward gap <= --track (head passes it) gap / bandwidth + transfer
    anything else (a seek)                  seek_min + (seek_full - seek_min)
                                              * sqrt(distance / span)
                                            + rotational latency + transfer

with transfer = length / bandwidth. Requests are served one at a time in
arrival order (one head; no NCQ reordering): each finishes at
max(now, previous finish) + service time, where an arrival less than
--credit-ms (2) after the previous finish counts as back-to-back. Defaults: 150 MB/s, 0.5 ms
track-to-track, 8 ms full stroke across the whole image, 7200 rpm (4.17 ms
mean rotational latency, charged in full on every seek so runs are
deterministic), 1 MiB track window.

MOUNT/stats is the direct evidence: JSON counters (requests, bytes, seeks,
total and mean seek distance, emulated busy seconds) since the last reset.
MOUNT/ctl takes "on" (charge time and count), "off" (serve at memory
speed, still track the head) or "reset" (zero the counters). Starts off.

Use with losetup on MOUNT/disk.img (then queue/rotational=1 on the loop
device); see README.md. Needs python3-fusepy (Debian) and /dev/fuse.
"""
import argparse
import errno
import json
import math
import os
import stat
import threading
import time

try:
    import fusepy as fuse  # Debian's python3-fusepy
except ImportError:  # pip's fusepy
    import fuse


class Disk:
    """Head position, service clock and counters of one emulated disk."""

    def __init__(self, a, size):
        self.bw = a.bw_mbs * 1e6
        self.seek_min = a.seek_min_ms / 1e3
        self.seek_full = a.seek_full_ms / 1e3
        self.rot = 30.0 / a.rpm  # half a revolution, in seconds
        self.track = a.track
        self.span = max(size, 1)
        self.credit = a.credit_ms / 1e3
        self.trace = open(a.trace, "w", buffering=1) if a.trace else None
        self.lock = threading.Lock()
        self.pos = 0
        self.busy_until = 0.0
        self.enabled = a.on
        self.reset()

    def reset(self):
        self.c = dict(requests=0, reads=0, writes=0, bytes_read=0,
                      bytes_written=0, sequential=0, short_skips=0,
                      skip_bytes=0, seeks=0, seek_distance=0,
                      busy_s=0.0, seek_s=0.0)

    def service(self, off, n, write):
        """Charge one request; returns the monotonic time it completes."""
        with self.lock:
            gap = off - self.pos
            self.pos = off + n
            if not self.enabled:
                return 0.0
            c = self.c
            if gap == 0:
                pos_cost = 0.0
                c["sequential"] += 1
            elif 0 < gap <= self.track:
                pos_cost = gap / self.bw
                c["short_skips"] += 1
                c["skip_bytes"] += gap
            else:
                d = abs(gap)
                pos_cost = (self.seek_min
                            + (self.seek_full - self.seek_min) * math.sqrt(min(d, self.span) / self.span)
                            + self.rot)
                c["seeks"] += 1
                c["seek_distance"] += d
                c["seek_s"] += pos_cost
            t = pos_cost + n / self.bw
            now = time.monotonic()
            # Back-to-back: a request arriving within `credit` of the last
            # one's modelled finish starts at that finish, so the emulator's
            # own per-request cost (FUSE round trip, sleep wake-up) does not
            # add to the disk's; a real disk would have had it queued.
            start = self.busy_until if now - self.busy_until < self.credit else now
            self.busy_until = start + t
            c["requests"] += 1
            c["busy_s"] += t
            if write:
                c["writes"] += 1
                c["bytes_written"] += n
            else:
                c["reads"] += 1
                c["bytes_read"] += n
            return self.busy_until

    def wait(self, until, off=0, n=0):
        t0 = time.monotonic()
        d = until - t0
        if d > 0:
            time.sleep(d)
        if self.trace:
            t1 = time.monotonic()
            self.trace.write(f"{t0:.6f} {off} {n} {until:.6f} {t1:.6f} {t1 - until:.6f}\n")

    def stats(self):
        with self.lock:
            s = dict(self.c)
            s["enabled"] = self.enabled
        s["mean_seek_distance"] = s["seek_distance"] / s["seeks"] if s["seeks"] else 0
        s["model"] = dict(bw_mbs=self.bw / 1e6, seek_min_ms=self.seek_min * 1e3,
                          seek_full_ms=self.seek_full * 1e3, rot_latency_ms=self.rot * 1e3,
                          track=self.track, span=self.span)
        return (json.dumps(s, sort_keys=True) + "\n").encode()


class Fs(fuse.Operations):
    def __init__(self, image, disk):
        self.fd = os.open(image, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        self.disk = disk
        self.t0 = time.time()

    def getattr(self, path, fh=None):
        base = dict(st_uid=0, st_gid=0, st_nlink=1, st_atime=self.t0,
                    st_mtime=self.t0, st_ctime=self.t0)
        if path == "/":
            return dict(base, st_mode=stat.S_IFDIR | 0o755, st_nlink=2, st_size=0)
        if path == "/disk.img":
            return dict(base, st_mode=stat.S_IFREG | 0o600, st_size=self.size)
        if path == "/stats":
            return dict(base, st_mode=stat.S_IFREG | 0o444, st_size=4096)
        if path == "/ctl":
            return dict(base, st_mode=stat.S_IFREG | 0o200, st_size=0)
        raise fuse.FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        return [".", "..", "disk.img", "stats", "ctl"]

    def open(self, path, flags):
        if path not in ("/disk.img", "/stats", "/ctl"):
            raise fuse.FuseOSError(errno.ENOENT)
        return 0

    def read(self, path, size, offset, fh):
        if path == "/stats":
            return self.disk.stats()[offset:offset + size]
        if path != "/disk.img":
            raise fuse.FuseOSError(errno.EINVAL)
        size = max(0, min(size, self.size - offset))
        until = self.disk.service(offset, size, False)
        data = os.pread(self.fd, size, offset)
        self.disk.wait(until, offset, size)
        return data

    def write(self, path, data, offset, fh):
        if path == "/ctl":
            cmd = data.decode(errors="replace").strip()
            d = self.disk
            with d.lock:
                if cmd == "on":
                    d.enabled = True
                elif cmd == "off":
                    d.enabled = False
                elif cmd == "reset":
                    d.reset()
                else:
                    raise fuse.FuseOSError(errno.EINVAL)
            return len(data)
        if path != "/disk.img":
            raise fuse.FuseOSError(errno.EACCES)
        if offset + len(data) > self.size:
            raise fuse.FuseOSError(errno.ENOSPC)
        until = self.disk.service(offset, len(data), True)
        n = os.pwrite(self.fd, data, offset)
        self.disk.wait(until)
        return n

    def truncate(self, path, length, fh=None):
        if path == "/ctl":
            return 0
        raise fuse.FuseOSError(errno.EPERM)

    def fsync(self, path, datasync, fh):
        return 0

    def flush(self, path, fh):
        return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("image", help="backing image (created sparse if --size is given and it is missing)")
    p.add_argument("mount", help="empty directory to mount on")
    p.add_argument("--size", type=int, help="image size in bytes when creating it")
    p.add_argument("--bw-mbs", type=float, default=150.0)
    p.add_argument("--seek-min-ms", type=float, default=0.5)
    p.add_argument("--seek-full-ms", type=float, default=8.0)
    p.add_argument("--rpm", type=float, default=7200.0)
    p.add_argument("--track", type=int, default=1 << 20, help="forward gap (bytes) read through instead of seeking")
    p.add_argument("--credit-ms", type=float, default=2.0,
                   help="idle shorter than this between requests counts as back-to-back (hides the emulator's own overhead)")
    p.add_argument("--trace", help="append one line per request: arrival offset length due woke lateness")
    p.add_argument("--on", action="store_true", help="start with emulation on")
    a = p.parse_args()
    if not os.path.exists(a.image):
        if not a.size:
            p.error(f"{a.image} does not exist; give --size to create it")
        with open(a.image, "wb") as f:
            f.truncate(a.size)
    size = os.stat(a.image).st_size
    fs = Fs(a.image, Disk(a, size))
    # direct_io: no page cache on the FUSE file, so every block request of the
    # loop device above reaches the model (drop_caches then empties the loop
    # device's and the file system's caches, which are the only ones left).
    fuse.FUSE(fs, a.mount, foreground=True, direct_io=True, default_permissions=False)


if __name__ == "__main__":
    main()
