#!/usr/bin/env bash
# Installs what dfp needs from Debian 12's own packages (nothing else is downloaded).
# Runs apt-get only when something is missing. gnuplot-nox draws the report plots (without it the
# report still writes its tables, data and HTML). clang-14 and libclang-rt-14-dev build the
# libFuzzer targets (ctest -L fuzz; without them only the corpus replay is built). pybind11, NumPy
# and pytest build and test the Python package for /usr/bin/python3 (docs/python.md); pip and venv
# install it with `pip install .` (tested in a venv); PyTorch and torchvision run the dfp.torch
# bridge's tests (without them those tests are skipped). Open MPI
# (libopenmpi-dev, openmpi-bin: mpicc's headers and mpirun) builds and tests data-parallel
# training (docs/design/distributed.md); without it the build leaves it out.
set -euo pipefail
pkgs=(cmake g++ make libdnnl-dev libtbb-dev libxsimd-dev libgtest-dev libbenchmark-dev zlib1g-dev
      pkg-config libturbojpeg0-dev dataset-fashion-mnist gnuplot-nox clang-14 libclang-rt-14-dev
      nlohmann-json3-dev libcli11-dev pybind11-dev python3-dev python3-pybind11 python3-numpy python3-pytest
      python3-pip python3-venv python3-torch python3-torchvision libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "dfp: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
