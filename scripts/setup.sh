#!/usr/bin/env bash
# Installs the Debian packages building frostdb-rs needs beyond the Rust toolchain: clang and
# libbpf-dev (the eBPF sampler's C half is compiled at build time; linux-libc-dev has the
# uapi headers), and for the tests binutils (readelf) and gdb (the unwinder's tests read a
# stopped process's registers with it). Safe to run again: installs only what is missing.
set -euo pipefail

missing=()
command -v clang >/dev/null 2>&1 || missing+=(clang)
[ -f /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
[ -f /usr/include/linux/bpf.h ] || missing+=(linux-libc-dev)
command -v readelf >/dev/null 2>&1 || missing+=(binutils)
command -v gdb >/dev/null 2>&1 || missing+=(gdb)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "frostdb-rs needs ${missing[*]} to build; run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]}"
DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
