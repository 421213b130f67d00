#!/usr/bin/env bash
# Interleaved A/B of `frostdb-bench ingest --pprof` on one fleet: each binary in turn,
# ROUNDS times, printing profiles/s and CPU microseconds a profile per run. On a noisy host
# compare medians of interleaved runs, not single runs.
#   scripts/ingest-ab.sh ROUNDS FLEET_DIR BENCH_BINARY...
# FLEET_DIR: a shared/bench fleet generated with --pprof (e.g. data/small). A BENCH_BINARY
# may carry flags of its own, quoted: "target/release/frostdb-bench --rules 20".
set -euo pipefail
rounds=$1 data=$2
shift 2
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
for _ in $(seq "$rounds"); do
  for bench in "$@"; do
    rm -rf "$store/db"
    read -r bin flags <<<"$bench"
    # Word-split on purpose: the binary's own flags, after the subcommand.
    # shellcheck disable=SC2086
    out=$("$bin" ingest --pprof --data "$data" --store "$store/db" ${flags:-} 2>&1)
    rate=$(grep -oE 'ingest [0-9]+ profiles/s' <<<"$out" | grep -oE '[0-9]+')
    cpu=$(grep -oE '[0-9]+ us a profile' <<<"$out" | grep -oE '^[0-9]+')
    echo "$bench: $rate profiles/s, $cpu us CPU a profile"
  done
done
