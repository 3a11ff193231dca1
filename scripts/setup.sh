#!/bin/bash
# One command from a fresh clone to a built tree: installs the Debian packages the build needs,
# then configures and builds into build/ (all programs land in build/bin/).
#   bash scripts/setup.sh                     # CUDA archs 80;86;89;90 when nvcc is present
#   KUIPER_CUDA_ARCHS=90 bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config libgoogle-glog-dev libgflags-dev libgtest-dev
          nlohmann-json3-dev libpcre2-dev libutf8proc-dev libstb-dev libjpeg62-turbo-dev
          libedit-dev python3-numpy
          libcpp-httplib-dev)  # kuiper-server's HTTP
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKUIPER_CUDA_ARCHS="${KUIPER_CUDA_ARCHS:-80;86;89;90}"
ninja -C build
