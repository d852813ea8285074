#!/usr/bin/env bash
# Installs the Debian packages mxtrain builds and runs with, if any are missing.
# Idempotent: when everything is installed it only checks (dpkg-query) and changes nothing.
# Runs apt-get as root, or through sudo when not root. The CUDA toolkit (/usr/local/cuda) is not a Debian
# package here and is not installed by this script; without it the build is CPU-only.
set -euo pipefail

PACKAGES=(
  cmake make g++ binutils
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libopenblas-dev nlohmann-json3-dev zlib1g-dev
  python3 python3-matplotlib
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "install_deps: not root and no sudo; install these packages: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
