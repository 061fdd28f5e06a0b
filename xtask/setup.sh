#!/usr/bin/env bash
# Installs what building and testing Switchyard needs, skipping whatever is already present.
# Idempotent: safe to run on every CI run and before every demo. Needs root for apt-get.
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }
# `grep >/dev/null`, not `grep -q`: an early exit could kill the writer with SIGPIPE, and
# pipefail would then read "not installed".
have bpftool  || need_apt+=(bpftool)
have clang    || need_apt+=(clang)
have nft      || need_apt+=(nftables)
have ethtool  || need_apt+=(ethtool)
have ip       || need_apt+=(iproute2)
have nsenter  || need_apt+=(util-linux)
# BIRD 2 (bird, birdc): the BGP daemon of the announcement tests; the tests start their own.
have bird     || need_apt+=(bird2)
# etcd for the fleet tests (each test starts its own members); protoc for etcd-client's build.
have etcd     || need_apt+=(etcd-server)
have etcdctl  || need_apt+=(etcd-client)
have openssl  || need_apt+=(openssl)
# dnsmasq (the binary only, no system service): the DNS server the DNS probe tests start.
have dnsmasq  || need_apt+=(dnsmasq-base)
have protoc   || need_apt+=(protobuf-compiler)
# systemd-analyze verifies the package's unit (`cargo xtask package --check`); dpkg installs it.
have systemd-analyze || need_apt+=(systemd)
have dpkg     || need_apt+=(dpkg)
# tmux: the terminal `switchyard top` runs under in its namespace test.
have tmux     || need_apt+=(tmux)
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
  # The tests start their own etcd members; the package's service is not wanted.
  systemctl disable --now etcd 2>/dev/null || true
fi
# The package starts a system BIRD; the tests run their own in namespaces, and a balancer's
# operator starts it with the configuration the README gives.
if have bird; then
  systemctl disable --now bird 2>/dev/null || true
fi

if ! rustup toolchain list | grep '^nightly' >/dev/null; then
  echo "setup: rustup toolchain install nightly"
  rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep '^rust-src' >/dev/null; then
  echo "setup: rustup component add rust-src --toolchain nightly"
  rustup component add rust-src --toolchain nightly
fi

# rustfmt and clippy for `.ci/run` (minimal rustup profiles leave them out); clippy on nightly
# too, for the eBPF crate's pass (it builds core for the BPF target, which needs nightly).
for comp in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep "^$comp" >/dev/null; then
    echo "setup: rustup component add $comp"
    rustup component add "$comp"
  fi
done
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep '^clippy' >/dev/null; then
  echo "setup: rustup component add clippy --toolchain nightly"
  rustup component add clippy --toolchain nightly
fi

if ! have bpf-linker; then
  echo "setup: cargo install bpf-linker (takes a few minutes)"
  LLVM_PREFIX=/usr/lib/llvm-22 cargo install --locked bpf-linker --no-default-features --features llvm-22
fi
# cargo-deb builds the Debian package (`cargo xtask package`).
if ! have cargo-deb; then
  echo "setup: cargo install cargo-deb (takes a few minutes)"
  cargo install --locked cargo-deb --version 3.8.0
fi
# Pins (maps, links) live on a BPF filesystem; most distributions mount one, containers often not.
if ! mountpoint -q /sys/fs/bpf; then
  echo "setup: mount -t bpf bpf /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf
fi
echo "setup: toolchain ready"
