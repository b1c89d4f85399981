#!/usr/bin/env bash
# kvscope-mpi gives the JSON kvscope gives, byte for byte, at 1, 2 and 3 ranks: on a sweep of
# bundles of one model (faults, prefix caching, a two-way capture, a corrupt file, different
# prompt counts and lengths; then a bundle with a damaged chunk too) and on one bundle whose
# prompts are shared out over the ranks. check's verdict and exit code are the same too (the
# corrupt bundle fails: exit 1; --strict: 2; the damaged data: 2, named). Nothing hangs.
# Usage: mpi_exactness.sh KVSCOPE KVSCOPE_MPI
set -euo pipefail
kvscope=$1
kvscope_mpi=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# CI runs as root; more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { mpirun --oversubscribe -np "$1" "$kvscope_mpi" "${@:2}"; }

shape=(--layers 4 --hidden 256 --query-heads 4 --kv-heads 2 --head-dim 64 --decode 6)
sweep=$work/sweep
mkdir -p "$sweep"
"$kvscope" synth "$sweep/a.h5" "${shape[@]}" --prompts 40,60,50 --seed 4 --fault rope_offset --fault-layer 2 >/dev/null
"$kvscope" synth "$sweep/b.h5" "${shape[@]}" --prompts 30,70 --seed 5 --fault prefix_reuse >/dev/null
"$kvscope" synth "$sweep/c.h5" "${shape[@]}" --prompts 44 --seed 6 --two-way >/dev/null
"$kvscope" synth "$sweep/d.h5" "${shape[@]}" --prompts 52,36,28,64 --seed 7 >/dev/null
"$kvscope" synth "$sweep/e.h5" "${shape[@]}" --prompts 48 --seed 8 --fault dead_head --fault-layer 1 >/dev/null
head -c 4096 "$sweep/d.h5" > "$sweep/f-corrupt.h5"

fail() { echo "FAIL: $*" >&2; exit 1; }

"$kvscope" analyze "$sweep" --json "$work/one.json" 2>"$work/warning" >/dev/null
grep -q "f-corrupt.h5" "$work/warning" || fail "the corrupt bundle is not named: $(cat "$work/warning")"
grep -q '"name":"f-corrupt"' "$work/one.json" || fail "the JSON does not list the corrupt bundle"
for np in 1 2 3; do
  mpi "$np" analyze "$sweep" --json "$work/mpi$np.json" >/dev/null 2>"$work/mpi$np.err" || fail "kvscope-mpi -np $np analyze: exit $?"
  cmp "$work/one.json" "$work/mpi$np.json" || fail "-np $np: the sweep's JSON differs from one process's"
  grep -q "f-corrupt.h5" "$work/mpi$np.err" || fail "-np $np does not name the corrupt bundle"
  [ "$(grep -c "left out" "$work/mpi$np.err")" -eq 1 ] || fail "-np $np: warned other than once: $(cat "$work/mpi$np.err")"
done
echo "sweep of $(ls "$sweep" | wc -l) bundles: the same JSON at 1, 2 and 3 ranks"

# A bundle that opens but whose data is damaged (a chunk of one layer's reference fails its
# checksum): the rank that analyses that prompt reports it, by file and dataset, in the result.
cp "$sweep/e.h5" "$sweep/g-damaged.h5"
/usr/bin/python3 - "$sweep/g-damaged.h5" <<'PY'
import sys, h5py
path = sys.argv[1]
with h5py.File(path, "r") as f:
    d = f["prompts/prompt_0/reference/expected/model.layers.2.self_attn/k"]
    info = d.id.get_chunk_info(0)
with open(path, "r+b") as raw:
    raw.seek(info.byte_offset + 16)
    raw.write(bytes(b ^ 0xFF for b in raw.read(64)))
PY
"$kvscope" analyze "$sweep" --json "$work/damaged.json" >/dev/null 2>&1
grep -q "g-damaged.h5" "$work/damaged.json" || fail "the damaged bundle's problem is not in the JSON"
for np in 2 3; do
  mpi "$np" analyze "$sweep" --json "$work/damaged$np.json" >/dev/null 2>&1 || fail "-np $np with a damaged bundle: exit $?"
  cmp "$work/damaged.json" "$work/damaged$np.json" || fail "-np $np: the JSON with a damaged bundle differs"
done
set +e
mpi 3 check "$sweep" >/dev/null 2>"$work/check3.err"; damaged=$?
set -e
[ "$damaged" -eq 2 ] || fail "kvscope-mpi check of a damaged bundle exits $damaged, not 2"
grep -q "g-damaged.h5" "$work/check3.err" || fail "check does not name the damaged bundle: $(cat "$work/check3.err")"
echo "a damaged bundle: named in the result at 2 and 3 ranks, the same JSON; check exits 2 naming it"
rm "$sweep/g-damaged.h5"

"$kvscope" analyze "$sweep/d.h5" --json "$work/d.json" >/dev/null
for np in 2 3; do
  mpi "$np" analyze "$sweep/d.h5" --json "$work/d$np.json" >/dev/null
  cmp "$work/d.json" "$work/d$np.json" || fail "-np $np: one bundle's JSON differs"
done
echo "one bundle of 4 prompts: the same JSON at 2 and 3 ranks"

set +e
"$kvscope" check "$sweep" --json "$work/verdict.json" >"$work/check.out"; one=$?
mpi 2 check "$sweep" --json "$work/verdict2.json" >"$work/check2.out"; two=$?
mpi 2 check "$sweep" --strict >/dev/null 2>&1; strict=$?
set -e
[ "$one" -eq 1 ] || fail "check of a sweep with a corrupt bundle exits $one, not 1"
[ "$two" -eq 1 ] || fail "kvscope-mpi check exits $two, not 1"
[ "$strict" -eq 2 ] || fail "kvscope-mpi check --strict exits $strict, not 2"
grep -q "FAIL bundle f-corrupt left out: .*f-corrupt.h5" "$work/check2.out" || fail "check does not name the corrupt bundle"
cmp "$work/check.out" "$work/check2.out" || fail "the verdicts differ"
cmp "$work/verdict.json" "$work/verdict2.json" || fail "the verdict JSONs differ"
echo "check: exit 1 naming the corrupt bundle, the same at 2 ranks; --strict: exit 2"
