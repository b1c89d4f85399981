#!/usr/bin/env bash
# Installs the Debian 12 packages kvscope needs, only those that are missing.
# Idempotent and non-interactive; run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake
  qt6-base-dev qt6-base-dev-tools qt6-svg-dev
  libqcustomplot-dev libqcustomplot2.1-qt6
  libtorch-dev libhdf5-dev zlib1g-dev nlohmann-json3-dev liburing-dev
  # kvscope-mpi, sweeps shared over MPI ranks, and its exactness test (mpirun)
  openmpi-bin libopenmpi-dev
  # a fast BLAS for libtorch's fp32 matmuls (the default reference BLAS is 10x slower)
  libopenblas0-pthread
  # looking at the GUI headless, and the tests that do
  xvfb xauth imagemagick chromium
  # the Python capture side and its tests
  python3-torch python3-h5py python3-numpy
  # the KV cache config's schema (docs/kv-cache-config.schema.json), checked by the capture tests
  python3-jsonschema
  # the packaging test: the .deb (dpkg-shlibdeps comes with build-essential's dpkg-dev), its
  # desktop entry, and pip-installing the capture package into a scratch virtual environment
  desktop-file-utils python3-venv python3-pip python3-setuptools python3-wheel
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "kvscope setup: installing ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
