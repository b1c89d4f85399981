#!/usr/bin/env python3
"""Mutates a small valid capture bundle N times (random byte flips, overwritten runs,
truncations) and runs `kvscope analyze` on each: counts clean errors (exit 2), analyses
(exit 0), crashes (killed by a signal) and hangs (over the time limit). Mutated files that
crash or hang are kept in OUT/ for reproduction.

usage: mutate_bundles.py KVSCOPE SEED_BUNDLE OUT_DIR [--count 10000] [--jobs 2] [--timeout 20]
"""
import argparse
import concurrent.futures
import os
import random
import shutil
import subprocess
import sys
import tempfile


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(3)
    if kind == 0:  # flip a few bits anywhere
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # overwrite a run with random bytes
        start = rng.randrange(len(b))
        n = rng.randint(1, 64)
        for i in range(start, min(len(b), start + n)):
            b[i] = rng.randrange(256)
    else:  # truncate
        del b[rng.randrange(1, len(b)):]
    return bytes(b)


def run_one(args):
    kvscope, seed_bytes, index, seed, out_dir, timeout = args
    rng = random.Random(seed * 1_000_003 + index)
    data = mutate(seed_bytes, rng)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"m{index}.h5")
        with open(path, "wb") as f:
            f.write(data)
        try:
            p = subprocess.run([kvscope, "analyze", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            shutil.copy(path, os.path.join(out_dir, f"hang-{index}.h5"))
            return "hang", index, ""
        if p.returncode < 0 or p.returncode > 2:
            shutil.copy(path, os.path.join(out_dir, f"crash-{index}.h5"))
            return "crash", index, p.stderr.decode(errors="replace")[-300:]
        return {0: "analysed", 1: "analysed", 2: "error"}[p.returncode], index, ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvscope")
    ap.add_argument("seed_bundle")
    ap.add_argument("out_dir")
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    seed_bytes = open(a.seed_bundle, "rb").read()
    counts = {"analysed": 0, "error": 0, "crash": 0, "hang": 0}
    jobs = [(a.kvscope, seed_bytes, i, a.seed, a.out_dir, a.timeout) for i in range(a.count)]
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for kind, index, detail in pool.map(run_one, jobs):
            counts[kind] += 1
            if kind in ("crash", "hang"):
                print(f"{kind} #{index}: {detail.strip()}", file=sys.stderr)
    print(" ".join(f"{k} {v}" for k, v in counts.items()))
    return 1 if counts["crash"] or counts["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
