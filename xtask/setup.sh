#!/usr/bin/env bash
# Installs what building and testing Switchyard needs, skipping whatever is already present.
# Idempotent: safe to run on every CI run and before every demo. Needs root for apt-get.
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }
have bpftool  || need_apt+=(bpftool)
have clang    || need_apt+=(clang)
have nft      || need_apt+=(nftables)
have ethtool  || need_apt+=(ethtool)
have ip       || need_apt+=(iproute2)
[ -d /usr/lib/llvm-22/lib ] && [ -e /usr/lib/llvm-22/bin/llvm-config ] || need_apt+=(llvm-22-dev)
if have bpf-linker; then
  # bpf-linker does not need LLVM's dev package once built.
  need_apt=("${need_apt[@]/llvm-22-dev}")
fi
pkgs=()
for p in "${need_apt[@]}"; do [ -n "$p" ] && pkgs+=("$p"); done
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "setup: apt-get install ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "setup: rustup toolchain install nightly"
  rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  echo "setup: rustup component add rust-src --toolchain nightly"
  rustup component add rust-src --toolchain nightly
fi

if ! have bpf-linker; then
  echo "setup: cargo install bpf-linker (takes a few minutes)"
  LLVM_PREFIX=/usr/lib/llvm-22 cargo install --locked bpf-linker --no-default-features --features llvm-22
fi
echo "setup: toolchain ready"
