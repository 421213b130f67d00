#!/usr/bin/env bash
# Runs every check of the project: formatting, lints, all tests (nextest), doc tests.
# Installs what it needs first; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

log "installing what the checks need"
# What the build needs (clang and libbpf-dev for the eBPF sampler).
./scripts/setup.sh
# rustfmt and clippy come with the toolchain; add them where a minimal profile left them out.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi

# Debian packages: Go (go tool pprof to check our pprof against, and the scrape target in
# shared/tools/goapp), gperftools, the JDK, Chromium (the web page's end-to-end test, and Pyroscope's flame graph
# component drawing our render API) and Node.js with npm (Pyroscope's Node client).
missing=()
command -v go >/dev/null 2>&1 || missing+=(golang-go)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# gperftools (a C program's CPU and heap profiles in the legacy formats go tool pprof reads).
[ -e /usr/include/gperftools/profiler.h ] || missing+=(libgoogle-perftools-dev)
# The JDK (a Java program's flight recording, checked against the JDK's own `jfr` reader).
{ command -v javac >/dev/null 2>&1 && command -v jfr >/dev/null 2>&1; } || missing+=(openjdk-17-jdk-headless)
# debuginfod (serving a stripped C program's debug file to the symbolizer), gcc and
# binutils (building and splitting that program).
command -v debuginfod >/dev/null 2>&1 || missing+=(debuginfod)
{ command -v gcc >/dev/null 2>&1 && command -v objcopy >/dev/null 2>&1; } || missing+=(gcc binutils)
# g++ (a C++ program whose names the symbolizer demangles).
command -v g++ >/dev/null 2>&1 || missing+=(g++)
# Prometheus (scraping the recording rules' series from /metrics).
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
  else
    echo "missing ${missing[*]} and this is not root: the tests that need them will skip"
  fi
fi

# moto's S3-compatible server, for the test that persists blocks to S3 for real.
venv=target/test-venv
if [ ! -x "$venv/bin/moto_server" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'moto[server]>=5,<6'
fi
export FROSTDB_MOTO="$PWD/$venv/bin/moto_server"
# The real Pyroscope Python client (1.x pushes with the Connect API) and Playwright (drives
# Debian's Chromium; no browser download).
if ! "$venv/bin/python" -c "import pyroscope, playwright" 2>/dev/null; then
  "$venv/bin/pip" install --quiet 'pyroscope-io>=1.4,<2' 'playwright>=1.40,<2'
fi
export FROSTDB_TEST_VENV="$PWD/$venv"

# npm packages of the field's clients (pinned by their lock files): @pyroscope/flamegraph,
# bundled with esbuild for the page the flame graph test draws, and @pyroscope/nodejs.
e2e=examples/server/tests/e2e
if [ ! -f "$e2e/flamegraph/dist/bundle.js" ] || [ "$e2e/flamegraph/package-lock.json" -nt "$e2e/flamegraph/dist/bundle.js" ] || [ "$e2e/flamegraph/main.jsx" -nt "$e2e/flamegraph/dist/bundle.js" ]; then
  npm ci --prefix "$e2e/flamegraph" --no-audit --no-fund --loglevel=error
  npm run --prefix "$e2e/flamegraph" --silent build
fi
if [ ! -f "$e2e/nodejs/node_modules/@pyroscope/nodejs/package.json" ]; then
  npm ci --prefix "$e2e/nodejs" --no-audit --no-fund --loglevel=error
fi

# shared/bench's tiny fleet, for the query cross-check: its generator runs from a copy (it
# writes compiled protobufs beside itself), its data goes to target/bench-data.
shared="${FROSTDB_SHARED:-$(cd .. && pwd)/shared}"
[ -d "$shared/bench" ] || shared=/work/shared
if [ -f "$shared/bench/gen_fleet.py" ]; then
  if ! "$venv/bin/python" -c "import numpy, pyarrow, grpc_tools, google.protobuf" 2>/dev/null; then
    "$venv/bin/pip" install --quiet -r "$shared/bench/requirements-core.txt"
  fi
  rm -rf target/bench-src && cp -r "$shared/bench" target/bench-src && chmod -R u+w target/bench-src
  if [ ! -f target/bench-data/tiny/pprof/index.tsv ]; then
    "$venv/bin/python" target/bench-src/gen_fleet.py --scale tiny --pprof --data "$PWD/target/bench-data" >/dev/null
  fi
  export FROSTDB_BENCH_DATA="$PWD/target/bench-data/tiny"
  export FROSTDB_SHARED="$shared"
else
  echo "shared/ not found (set FROSTDB_SHARED): tests that need its data will fail in CI"
fi

# A one-shot CI build gains nothing from incremental state (about 1 GB of it), and the
# test binaries that link DataFusion are ~250 MB each unoptimised: say up front how much disk
# the build has, since a linker that runs out of it dies of SIGBUS rather than saying so.
if [ "${CI:-}" = "true" ]; then export CARGO_INCREMENTAL=0; fi
mkdir -p target
avail_kb=$(df -Pk target | awk 'NR == 2 { print $4 }')
echo "disk free for target/: $((avail_kb / 1024 / 1024)) GiB (a clean build and test run needs about 6 GiB)"
if [ "$avail_kb" -lt $((8 * 1024 * 1024)) ]; then
  echo "warning: under 8 GiB free; the link steps may fail with a bus error (lld maps its output)"
fi

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "tests (cargo nextest)"
profile=default
if [ "${CI:-}" = "true" ]; then profile=ci; fi
cargo nextest run --workspace --locked --profile "$profile"

log "doc tests"
cargo test --workspace --doc --locked

# The README's Rust examples, built as an embedder builds them: by a crate outside the
# workspace with the README's [dependencies] (its own Cargo.lock; the workspace-hack crate
# and the shared target directory give it the workspace's build of every dependency).
log "the README's embedding examples, from a crate outside the workspace"
(cd embedding && CARGO_TARGET_DIR="$PWD/../target" cargo test --doc --locked)

echo "target/ holds $(du -sh target 2>/dev/null | cut -f1) after the checks"
log "all checks passed"
