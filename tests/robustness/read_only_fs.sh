#!/usr/bin/env bash
# The bundle on a read-only file system (a tmpfs remounted read-only, in a private mount
# namespace): inspect, analyze, check, report, export and the app itself open and read it.
# Skipped (exit 77) where this machine cannot make a mount namespace.
# usage: read_only_fs.sh KVSCOPE BUNDLE OUT
set -euo pipefail
kvscope=$1 bundle=$2 out=$3
if ! unshare -rm true 2>/dev/null; then
    echo "read_only_fs: no mount namespace here (unshare -rm failed): skipped"
    exit 77
fi
rm -rf "$out"
mkdir -p "$out/ro" "$out/results"
exec unshare -rm bash -euo pipefail -c '
    kvscope=$1 bundle=$2 out=$3
    mount -t tmpfs none "$out/ro"
    cp "$bundle" "$out/ro/capture.h5"
    mount -o remount,ro "$out/ro"
    if touch "$out/ro/x" 2>/dev/null; then echo "the mount is not read-only"; exit 1; fi
    ro=$out/ro/capture.h5 res=$out/results
    "$kvscope" inspect "$ro" >/dev/null
    "$kvscope" analyze "$ro" --json "$res/analysis.json" >/dev/null
    "$kvscope" check "$ro" >/dev/null || [ $? -eq 1 ]   # 1: thresholds failed, still read
    "$kvscope" report "$ro" -o "$res/report" >/dev/null
    "$kvscope" export "$ro" "$res/export.h5" --layers 0 >/dev/null
    QT_QPA_PLATFORM=offscreen "$kvscope" "$ro" --screenshot "$res/window.png" >/dev/null
    test -s "$res/analysis.json" && test -s "$res/report/report.html" && test -s "$res/export.h5" && test -s "$res/window.png"
    echo "read-only file system: inspect, analyze, check, report, export and the app read $ro"
' bash "$kvscope" "$bundle" "$out"
