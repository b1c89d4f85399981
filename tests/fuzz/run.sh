#!/usr/bin/env bash
# Fuzzes every reader with libFuzzer for SECONDS each: builds the `fuzz` preset (clang, ASan +
# UBSan), makes the seed corpora, and runs each target on them, keeping what it finds new in
# build-fuzz/corpus/<target> (reused by the next run), then replays that corpus with
# LeakSanitizer. A crash, out-of-memory, timeout or leak stops that target and leaves its input
# in build-fuzz/findings/. Prints executions per target.
# usage: [RUNS=N] tests/fuzz/run.sh SECONDS [TARGET...]    (needs build/app/kvscope for the seeds)
#        RUNS stops a target after N executions if that comes before SECONDS.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:?usage: run.sh SECONDS [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_kv_config fuzz_safetensors fuzz_analysis_json fuzz_bundle fuzz_pt)
[ -x build/app/kvscope ] || { echo "run.sh: build the default preset first (its kvscope makes the seed bundles)" >&2; exit 2; }
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${targets[@]}" >/dev/null
bash tests/fuzz/make_seeds.sh build/app/kvscope build-fuzz/seeds
mkdir -p build-fuzz/findings
status=0
for target in "${targets[@]}"; do
    corpus=build-fuzz/corpus/$target
    mkdir -p "$corpus"
    log=build-fuzz/findings/$target.log
    # Fuzzing itself without leak checks (an LSan scan after every input costs 100x the
    # input); each input may take 10 s and 4 GB before it counts as a finding.
    if ASAN_OPTIONS=detect_leaks=0 build-fuzz/tests/fuzz/$target -max_total_time="$seconds" -runs="${RUNS:--1}" -timeout=10 \
           -rss_limit_mb=4096 -detect_leaks=0 -print_final_stats=1 -artifact_prefix="build-fuzz/findings/$target-" \
           "$corpus" "build-fuzz/seeds/$target" >"$log" 2>&1; then
        result=ok
    else
        result="FINDING (see $log)"
        status=1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    # Then every input of the corpus it grew once more, with LeakSanitizer on (leaks inside
    # libhdf5 and libtorch on their own error paths suppressed: lsan.supp).
    if ! ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=tests/fuzz/lsan.supp \
           build-fuzz/tests/fuzz/$target -runs=0 -artifact_prefix="build-fuzz/findings/$target-" \
           "$corpus" >"$log.leaks" 2>&1; then
        result="$result; LEAK (see $log.leaks)"
        status=1
    fi
    printf '%-20s %12s executions, %6s inputs in its corpus  %s\n' "$target" "${runs:-?}" \
        "$(ls "$corpus" | wc -l)" "$result"
done
exit $status
