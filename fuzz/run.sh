#!/usr/bin/env bash
# AFL++ (cargo-afl, stable toolchain) on every fuzz target.
#   ./run.sh [seconds per target] [targets...]     default: 60 s each, every target
# Seeds come from shared/testdata (and what earlier runs kept in corpus/<target>); findings
# land in out/<target>/default/{crashes,hangs}, which every `cargo nextest run` replays
# (frostdb-core and frostdb-pprof's fuzz_corpus tests). Prints executions per target.
# Each target runs within a memory limit (afl-fuzz -m, MiB of address space; FUZZ_MEMORY_MB,
# default 2048): an input that makes a parser allocate past it is a crash AFL++ keeps.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode normalize folded trie speedscope jfr parca otlp push selector wal manifest push_bounds otlp_bounds querier)
memory=${FUZZ_MEMORY_MB:-2048}
shared="${FROSTDB_SHARED:-$(cd ../.. && pwd)/shared}"
[ -d "$shared/testdata" ] || shared=/work/shared

command -v cargo-afl >/dev/null 2>&1 || cargo install cargo-afl --locked
cargo afl config --build >/dev/null 2>&1 || true   # AFL++ for this rustc (once)
cargo afl build --release $(printf -- '--bin %s ' "${targets[@]}")

seed() {
  local target=$1 dir=corpus/$1
  mkdir -p "$dir"
  [ -n "$(ls -A "$dir")" ] && return
  case $target in
    decode|normalize|push) cp "$shared"/testdata/pprof/*.pb* "$dir"/ ;;
    folded) cp "$shared"/testdata/folded/*.txt "$dir"/ ;;
    speedscope) cp ../testdata/speedscope/*.json "$dir"/ ;;
    jfr) for f in ../testdata/jfr/*.jfr.gz; do gunzip -c "$f" > "$dir/$(basename "$f" .gz)"; done ;;
    otlp|otlp_bounds) cp "$shared"/testdata/otlp/*.pb "$dir"/ ;;
    selector) printf '%s' 'process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="api",pod=~"api-.*"}' > "$dir"/1
              printf '%s' '{namespace!="kube-system",env!~"dev|test"}' > "$dir"/2 ;;
    wal) printf '\x00\x01\x00\x07\x00samples' > "$dir"/1 ;;
    manifest) printf '%s' '{"format":2,"tables":{}}' > "$dir"/1 ;;
  esac
  # Real requests (push, OTLP, Grafana's queries), written by frostdb-pprof's fuzz_corpus
  # test (FROSTDB_FUZZ_SEEDS=fuzz/seeds).
  [ -d seeds/"$target" ] && cp seeds/"$target"/* "$dir"/
  [ -d regressions/"$target" ] && cp regressions/"$target"/* "$dir"/
  # AFL++ wants small seeds (executions per second fall with their size): keep those under
  # 16 KiB, or the smallest when none is.
  local smallest
  smallest=$(ls -S "$dir" | tail -1)
  find "$dir" -size +16k ! -name "$smallest" -delete
}

export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
mkdir -p out
printf '%-10s %14s %10s %8s %6s\n' target executions execs/s crashes hangs
for t in "${targets[@]}"; do
  seed "$t"
  cargo afl fuzz -V "$seconds" -m "$memory" -i corpus/"$t" -o out/"$t" target/release/"$t" >out-"$t".log 2>&1 || {
    echo "$t: afl-fuzz failed, see fuzz/out-$t.log"; tail -5 out-"$t".log; exit 1; }
  stats=out/$t/default/fuzzer_stats
  get() { awk -F': *' -v k="$1" '$1 ~ "^"k" *$" {print $2}' "$stats"; }
  printf '%-10s %14s %10s %8s %6s\n' "$t" "$(get execs_done)" "$(get execs_per_sec)" "$(get saved_crashes)" "$(get saved_hangs)"
  if [ "$(get saved_crashes)" != 0 ] || [ "$(get saved_hangs)" != 0 ]; then
    echo "$t found inputs: fuzz/out/$t/default/{crashes,hangs}"; found=1
  fi
done
[ -z "${found:-}" ]
