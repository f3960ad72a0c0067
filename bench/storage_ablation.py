#!/usr/bin/env python3
"""Storage ablation (issue 4): median of 3, MB/s and CPU s/GB, warm and cold."""
import json, os, statistics, subprocess, sys, shutil
B = sys.argv[1]
ROOT = "/var/tmp/sbench"
os.environ["RAMSYS_KEY_FILE"] = "/tmp/k"
CONFIGS = [
    ("full (default)", []),
    ("--no-direct", ["--no-direct"]),
    ("--io-engine uring", ["--io-engine", "uring"]),
    ("--io-engine sync", ["--io-engine", "sync"]),
    ("--no-sort", ["--no-sort"]),
    ("--device-threads 4", ["--device-threads", "4"]),
]
only = sys.argv[2:] or ["bulk", "mixed"]
def drop():
    subprocess.run(["sync"]); open("/proc/sys/vm/drop_caches", "w").write("3\n")
def warm(src):
    subprocess.run(f"find {src} -type f -exec cat {{}} + > /dev/null", shell=True)
def run(src, extra, cold):
    dst = f"{ROOT}/dst"
    shutil.rmtree(dst, ignore_errors=True); os.mkdir(dst)
    if cold: drop()
    else: warm(src)
    o = subprocess.run([B, "cp", "-r", "--json", *extra, src, dst + "/"], capture_output=True, text=True, timeout=300)
    line = [l for l in o.stdout.splitlines() if '"summary"' in l][-1]
    s = json.loads(line)
    assert s["ok"], o.stdout + o.stderr
    return s["mb_s"], s["cpu_s"] / (s["bytes"] / 1e9)
rows = []
for w in only:
    src = f"{ROOT}/{w}"
    for name, extra in CONFIGS:
        for cold in (False, True):
            r = [run(src, extra, cold) for _ in range(3)]
            mb = statistics.median(x[0] for x in r); cpu = statistics.median(x[1] for x in r)
            print(f"| {w} | {'cold' if cold else 'warm'} | {name} | {mb:.0f} | {cpu:.2f} |", flush=True)
