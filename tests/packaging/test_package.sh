#!/usr/bin/env bash
# The .deb as a user gets it: build it, unpack it into a scratch root, run the installed
# kvscope (version, synth, analyze, report, the import helper), validate the desktop entry,
# and pip-install the capture package into a scratch virtual environment.
# usage: test_package.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
build=$1 src=$2 version=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$work/cpack" >/dev/null)
deb=$(ls "$work"/cpack/kvscope_"$version"_*.deb) || fail "no kvscope_${version} .deb"
# Into a variable first: `dpkg-deb | grep -q` under pipefail fails whenever grep exits before
# dpkg-deb has written everything (SIGPIPE).
info=$(dpkg-deb -I "$deb")
grep -q "Depends:.*libqt6widgets6" <<<"$info" || fail "Depends lacks the Qt runtime"
if grep "Depends:" <<<"$info" | grep -q -- "-dev"; then fail "depends on -dev packages"; fi
dpkg-deb -x "$deb" "$work/root"
root=$work/root
kvscope=$root/usr/bin/kvscope

[ "$("$kvscope" --version)" = "kvscope $version" ] || fail "kvscope --version: $("$kvscope" --version)"
grep -q "^  check " <<<"$("$kvscope" --help)" || fail "--help does not list check"
grep -q "usage: kvscope analyze" <<<"$("$kvscope" analyze --help)" || fail "analyze --help"
set +e
"$kvscope" analyze --no-such-option x.h5 >/dev/null 2>"$work/err"; rc=$?
set -e
[ $rc -eq 2 ] && grep -q "usage: kvscope analyze" "$work/err" || fail "an unknown option gives the usage and exit 2 (got $rc)"

cd "$work"
"$kvscope" synth small.h5 --layers 4 --hidden 64 --query-heads 4 --kv-heads 2 --head-dim 16 --prompts 12,16 --decode 6 \
    --fault rope_offset >/dev/null
grep -q "worst cells" <<<"$("$kvscope" analyze small.h5)" || fail "analyze from the package"
QT_QPA_PLATFORM=offscreen "$kvscope" report small.h5 -o report >/dev/null || fail "report from the package"
[ -s report/report.html ] && ls report/*.png >/dev/null || fail "report wrote no HTML or PNG"
grep -q "kvscope $version" report/report.html || fail "the report does not say which kvscope wrote it"
# The import runs the packaged helper (/usr/lib/kvscope/kvscope-import): its own message, not "cannot run".
mkdir empty
set +e
"$kvscope" import empty -o imported.h5 >/dev/null 2>"$work/err"; rc=$?
set -e
[ $rc -eq 2 ] || fail "import of an empty folder should fail"
if grep -q "cannot run the import helper\|crashed" "$work/err"; then fail "the packaged import helper: $(cat "$work/err")"; fi
grep -q "empty" "$work/err" || fail "import error does not name the folder: $(cat "$work/err")"

desktop-file-validate "$root/usr/share/applications/kvscope.desktop" || fail "desktop entry"
grep -q "^Exec=kvscope %f" "$root/usr/share/applications/kvscope.desktop" || fail "desktop entry Exec"

# The capture package: where Debian's python3 finds it, and pip-installed into an engine's venv.
PYTHONPATH=$root/usr/lib/python3/dist-packages /usr/bin/python3 -c \
    "import kvscope_capture, kvscope_capture.vllm, sys; sys.exit(kvscope_capture.__version__ != '$version')" \
    || fail "packaged kvscope_capture"
/usr/bin/python3 -m venv --system-site-packages venv
cp -r "$src/capture" capture
# Offline, and Debian names its h5py distribution "h5py.-debian-h5py-serial", which pip cannot
# match to "h5py": install without resolving; the declared dependencies are checked below and
# the system's numpy and h5py serve the import.
venv/bin/python -m pip install --quiet --no-index --no-build-isolation --no-deps ./capture >/dev/null || fail "pip install ./capture"
venv/bin/python - <<PY || fail "the pip-installed capture package"
import kvscope_capture, importlib.metadata as md, os
assert "/venv/" in kvscope_capture.__file__, kvscope_capture.__file__
assert kvscope_capture.__version__ == "$version", kvscope_capture.__version__
import kvscope_capture.vllm  # the GPU capture: its connector module is vLLM's to import
assert os.path.exists(os.path.join(os.path.dirname(kvscope_capture.vllm.__file__), "connector.py"))
assert md.version("kvscope-capture") == "$version"
requires = " ".join(md.requires("kvscope-capture") or [])
assert "numpy" in requires and "h5py" in requires, requires
PY
echo "package test passed: $(basename "$deb")"
