#!/usr/bin/env python3
"""Mutates a small valid capture bundle N times (random byte flips, overwritten runs,
truncations) and runs `kvscope analyze --json` on each. Every outcome is one of:

  error      a clean error (exit 2) naming the file
  partial    analysed, with the damaged part reported as a problem (marked in the output)
  unchanged  analysed, every number identical to the intact file's (the bytes hit were unused)
  changed    analysed without any problem reported, numbers different: corruption shown as data
  guarded    libhdf5 crashed in kvscope's guard process (reported as an error, but a crash)
  crash      killed by a signal, or an exit code kvscope never uses
  hang       over the time limit

Files that end `changed`, `guarded`, `crash` or `hang` are kept in OUT/ for reproduction.

usage: mutate_bundles.py KVSCOPE SEED_BUNDLE OUT_DIR [--count 10000] [--jobs 2] [--timeout 20]
"""
import argparse
import concurrent.futures
import json
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


def analyse(kvscope, path, timeout):
    """(exit code, stderr, the analysis JSON or None); raises TimeoutExpired."""
    json_path = path + ".json"
    p = subprocess.run([kvscope, "analyze", path, "--json", json_path], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=timeout)
    result = None
    if p.returncode == 0 and os.path.exists(json_path):
        with open(json_path) as f:
            result = json.load(f)
        result.pop("bundle", None)  # the path differs, nothing else may
    return p.returncode, p.stderr.decode(errors="replace"), result


def has_problems(result):
    return bool(result.get("problems")) or any(prompt.get("problems") for prompt in result.get("prompts", []))


def run_one(args):
    kvscope, seed_bytes, intact, index, seed, out_dir, timeout = args
    rng = random.Random(seed * 1_000_003 + index)
    data = mutate(seed_bytes, rng)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"m{index}.h5")
        with open(path, "wb") as f:
            f.write(data)
        try:
            code, stderr, result = analyse(kvscope, path, timeout)
        except subprocess.TimeoutExpired:
            shutil.copy(path, os.path.join(out_dir, f"hang-{index}.h5"))
            return "hang", index, ""
        if code < 0 or code > 2:
            kind = "crash"
        elif code == 2:
            kind = "guarded" if "crashed the HDF5 library" in stderr else "error"
        elif result is None:
            kind = "crash"  # exit 0 without its JSON
        elif has_problems(result):
            kind = "partial"
        else:
            kind = "unchanged" if result == intact else "changed"
        if kind in ("changed", "guarded", "crash"):
            shutil.copy(path, os.path.join(out_dir, f"{kind}-{index}.h5"))
        return kind, index, stderr.strip()[-300:]


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
    code, stderr, intact = analyse(a.kvscope, a.seed_bundle, a.timeout)
    if code != 0 or intact is None or has_problems(intact):
        sys.exit(f"the seed bundle does not analyse cleanly: {stderr}")
    counts = dict.fromkeys(("error", "partial", "unchanged", "changed", "guarded", "crash", "hang"), 0)
    jobs = [(a.kvscope, seed_bytes, intact, i, a.seed, a.out_dir, a.timeout) for i in range(a.count)]
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for kind, index, detail in pool.map(run_one, jobs):
            counts[kind] += 1
            if kind in ("changed", "guarded", "crash", "hang"):
                print(f"{kind} #{index}: {detail}", file=sys.stderr)
    print(" ".join(f"{k} {v}" for k, v in counts.items()))
    return 1 if any(counts[k] for k in ("changed", "guarded", "crash", "hang")) else 0


if __name__ == "__main__":
    sys.exit(main())
