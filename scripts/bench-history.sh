#!/usr/bin/env bash
# make bench-history: what a command costs as a lake's history grows (bench/history.py), beside
# DuckDB reading the same runs as a folder of Parquet files, in the same run.
#
#   RUNS=100,1000,10000   sizes of the one-source history
#   SOURCES=50 SOURCE_RUNS=1000   the wide lake
#   INGOT_BIN=PATH        use this ingot binary instead of building --release
#   BENCH_TARGET_DIR      cargo target dir of the release build ($HOME/.cache/ingot-target-release)
#
# Writes bench/results-history.md (and .json). Needs cargo and python3; the venv .venv-bench
# gets duckdb from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv-bench
DUCKDB_VERSION=2.0.1
die() { printf 'bench-history: error: %s\n' "$*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 is needed"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
if ! "$VENV/bin/python" -c "import duckdb, sys; sys.exit(duckdb.__version__ != '$DUCKDB_VERSION')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "duckdb==$DUCKDB_VERSION" || die "pip install failed"
fi
if [ -n "${INGOT_BIN:-}" ]; then
  BIN=$INGOT_BIN
else
  TARGET=${BENCH_TARGET_DIR:-$HOME/.cache/ingot-target-release}
  command -v cargo >/dev/null || die "cargo is needed (Rust toolchain)"
  export PROTOC=${PROTOC:-$ROOT/scripts/protoc}
  CARGO_TARGET_DIR=$TARGET cargo build --release --bin ingot --no-default-features --features flight
  BIN=$TARGET/release/ingot
fi
exec python3 bench/history.py --ingot "$BIN" --work "$ROOT/bench/work/history" \
  --out "$ROOT/bench/results-history.md" --duckdb "$VENV/bin/python" \
  --runs "${RUNS:-100,1000,10000}" --sources "${SOURCES:-50}" --source-runs "${SOURCE_RUNS:-1000}"
