#!/usr/bin/env bash
# make bench: TPC-H lineitem through ingot (release build) and DuckDB in the same run, on the
# same machine, then a check that both computed the same hashes. See bench/ for the pieces.
#
#   SF=1            scale factor of the timed run (default 1: 6,001,215 rows, ~766 MB of CSV)
#   SF10=1          also ingest scale factor 10 into a fresh lake and report its peak memory
#   SILVER=0        skip the silver part (default 1: silver builds of bench/rules/lineitem/v1.yaml
#                   vs the same rules as DuckDB SQL, full and after a 1% re-delivery)
#   SOURCES=0       skip the several-sources benchmark (default 1: bench/sources.sh, a silver table
#                   fed by two sources of ~3M lineitem rows each against a one-source build of the
#                   same rows and DuckDB's same survivorship; writes bench/results-sources.md)
#   CLUSTER=1       also the full silver build on a loopback cluster of ingot processes (one
#                   scheduler, two executors with one task each) against the same build in-process;
#                   builds the release binary with --features cluster (Ballista: a long first build)
#   INGOT_BIN=PATH  use this ingot binary instead of building --release (harness development)
#   BENCH_TARGET_DIR  cargo target dir of the release build ($HOME/.cache/ingot-target-release)
#
# Needs only cargo and python3: the venv .venv-bench gets duckdb and tpchgen-cli from PyPI.
# Every step is idempotent: tools, generated data and the re-delivered file are kept in
# bench/work/ and reused; each run measures into a fresh lake.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
SF=${SF:-1}
VENV=$ROOT/.venv-bench
PY=$VENV/bin/python
CONTRACTS=$ROOT/bench/contracts
DUCKDB_VERSION=2.0.1
TPCHGEN_VERSION=4.0.0
ADBC_VERSION=1.13.0
PYARROW_VERSION=26.0.1
HEADER='l_orderkey,l_partkey,l_suppkey,l_linenumber,l_quantity,l_extendedprice,l_discount,l_tax,l_returnflag,l_linestatus,l_shipdate,l_commitdate,l_receiptdate,l_shipinstruct,l_shipmode,l_comment'

step() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'bench: error: %s\n' "$*" >&2; exit 1; }

case $SF in
  '' | *[!0-9.]* | *.*.* | .* | *.) die "SF must be a number like 1 or 0.01 (got '$SF')" ;;
esac
command -v python3 >/dev/null || die "python3 is needed"

# ---------------------------------------------------------------------------------- 1. venv
step "venv $VENV with duckdb==$DUCKDB_VERSION, tpchgen-cli==$TPCHGEN_VERSION, adbc-driver-flightsql==$ADBC_VERSION"
if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
if ! "$PY" - "$DUCKDB_VERSION" "$TPCHGEN_VERSION" "$ADBC_VERSION" "$PYARROW_VERSION" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    ok = (version("duckdb") == sys.argv[1] and version("tpchgen-cli") == sys.argv[2]
          and version("adbc-driver-flightsql") == sys.argv[3] and version("pyarrow") == sys.argv[4])
except PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
EOF
then
  "$PY" -m pip install --quiet --disable-pip-version-check \
    "duckdb==$DUCKDB_VERSION" "tpchgen-cli==$TPCHGEN_VERSION" \
    "adbc-driver-flightsql==$ADBC_VERSION" "pyarrow==$PYARROW_VERSION" || die "pip install failed"
fi
echo "ok: duckdb $DUCKDB_VERSION, tpchgen-cli $TPCHGEN_VERSION" >&2
# DuckDB's Delta extension is on PyPI for DuckDB 1.4.4 (duckdb-ext-delta): a second venv reads the
# lake's Delta tables with it (delta_scan), offline
VENV_DELTA=$ROOT/.venv-bench-delta
PYD=$VENV_DELTA/bin/python
if ! "$PYD" -c 'import duckdb, glob, os, sys; sys.exit(not glob.glob(os.path.join(os.path.dirname(duckdb.__file__), "..", "duckdb_ext", "extensions", "*", "*", "delta.duckdb_extension")))' 2>/dev/null; then
  python3 -m venv "$VENV_DELTA" || die "python3 -m venv failed"
  "$PYD" -m pip install --quiet --disable-pip-version-check "duckdb==1.4.4" "duckdb-ext-delta==1.4.4.20260205" ||
    die "pip install of duckdb-ext-delta failed"
fi

# ------------------------------------------------------------------------------- 2. ingot
if [ -n "${INGOT_BIN:-}" ]; then
  step "ingot: using INGOT_BIN=$INGOT_BIN (no build)"
  INGOT=$INGOT_BIN
else
  command -v cargo >/dev/null || die "cargo is needed (Rust toolchain)"
  TARGET=${BENCH_TARGET_DIR:-$HOME/.cache/ingot-target-release}
  step "ingot: cargo build --release (target dir $TARGET)"
  # without default features (the interactive shell plays no part), with `flight` for the
  # Flight SQL round trip (its build needs protoc: scripts/protoc, from PyPI's grpcio-tools) and,
  # with CLUSTER=1, `cluster` for the Ballista step
  export PROTOC=${PROTOC:-$ROOT/scripts/protoc}
  FEATURES_BENCH=flight
  if [ "${CLUSTER:-}" = 1 ]; then FEATURES_BENCH="flight cluster"; fi
  CARGO_TARGET_DIR=$TARGET cargo build --release --bin ingot --no-default-features --features "$FEATURES_BENCH"
  INGOT=$TARGET/release/ingot
fi
[ -x "$INGOT" ] || die "no ingot binary at $INGOT"

# bench/rules holds only the lineitem rules of the silver part, so the repo's rules/ (other
# sources) stay out; the bronze part does not read them.
INGOT_ARGS=(--contracts "$CONTRACTS" --rules "$ROOT/bench/rules")
ingot() { "$INGOT" "${INGOT_ARGS[@]}" "$@"; }
# sql LAKE QUERY: the result rows as CSV, without the header line
sql() { local lake=$1; shift; ingot --lake "$lake" sql "$1" --format csv | tail -n +2; }
step "contract check"
ingot check

# ------------------------------------------------------------------------------- 3. data
# gen SF: bench/work/sf<SF>/lineitem.csv (generated into a scratch folder, renamed when whole)
gen() {
  local sf=$1 dir=$ROOT/bench/work/sf$1
  if [ ! -s "$dir/lineitem.csv" ]; then
    step "generating TPC-H lineitem SF$sf with tpchgen-cli into $dir"
    rm -rf "$dir/.gen"
    mkdir -p "$dir/.gen"
    "$VENV/bin/tpchgen-cli" csv --scale-factor "$sf" --tables lineitem --output-dir "$dir/.gen" --quiet
    mv "$dir/.gen/lineitem.csv" "$dir/lineitem.csv"
    rm -rf "$dir/.gen"
  else
    echo "ok: $dir/lineitem.csv already generated" >&2
  fi
  # The contract declares this dialect: check it is what tpchgen-cli wrote.
  [ "$(head -n 1 "$dir/lineitem.csv")" = "$HEADER" ] ||
    die "$dir/lineitem.csv: unexpected header line; bench/contracts/lineitem.yaml expects: $HEADER"
}

WORK=$ROOT/bench/work/sf$SF
CSV=$WORK/lineitem.csv
REDELIVERED=$WORK/lineitem-redelivery.csv
CHANGES=$WORK/redelivery-changes.json
gen "$SF"
ROWS=$(( $(wc -l < "$CSV") - 1 ))
echo "ok: $CSV: $ROWS rows, $(du -m "$CSV" | cut -f1) MB" >&2

if [ ! -s "$REDELIVERED" ] || [ ! -s "$CHANGES" ] || [ "$CSV" -nt "$REDELIVERED" ]; then
  step "making the re-delivery: a copy with l_comment changed in exactly 3 rows"
  "$PY" bench/redeliver.py "$CSV" "$REDELIVERED" "$CHANGES"
else
  echo "ok: $REDELIVERED already made" >&2
fi
# Cheap sanity check of the re-delivery: the original plus 3 x "corrected " (10 bytes).
[ $(( $(stat -c %s "$REDELIVERED") - $(stat -c %s "$CSV") )) = 30 ] ||
  die "$REDELIVERED is not $CSV plus 3 changed comments: delete it to have it made again"

# ------------------------------------------------------------------------ 4. timed jobs
MEASURE=$WORK/measure
LAKE=$WORK/lake
DDB=$WORK/duckdb
rm -rf "$MEASURE" "$LAKE" "$DDB"
mkdir -p "$MEASURE" "$DDB"
# Every timed job starts after `sync` (untimed): the previous job's writeback (a 500 MB bronze
# file, say) must not land in the next job's time, whichever tool runs it.
measure() { local label=$1; shift; sync; "$PY" bench/measure.py --label "$label" --out "$MEASURE/$label.json" --log "$MEASURE/$label.log" -- "$@"; }
# median LABEL N: of the timed jobs LABEL_1 .. LABEL_N, the one with the median wall time is
# reported as LABEL (its measurement and log copied).
median() {
  local label=$1 n=$2 k
  k=$("$PY" -c 'import json, sys
d, label, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
walls = sorted((json.load(open(f"{d}/{label}_{k}.json"))["wall_s"], k) for k in range(1, n + 1))
print(walls[n // 2][1])' "$MEASURE" "$label" "$n")
  cp "$MEASURE/${label}_$k.json" "$MEASURE/$label.json"
  cp "$MEASURE/${label}_$k.log" "$MEASURE/$label.log"
  echo "[median] $label: run $k of $n" >&2
}
run_id() { sed -n 's/.*\[run \([0-9a-f-]*\)\].*/\1/p' "$MEASURE/$1.log" | tail -n 1; }
build_id() { sed -n 's/.*\[build \([0-9a-f-]*\)\].*/\1/p' "$MEASURE/$1.log" | tail -n 1; }
# warm the page cache so every job reads the files from memory alike
cat "$CSV" "$REDELIVERED" > /dev/null

# Other work on the machine skews every number: note the load around the timed jobs.
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
# The first ingest is the closest call and this machine's speed moves from one minute to the
# next: ingot's first ingest and DuckDB's same job run in ROUNDS interleaved rounds (each into a
# fresh lake / file), each round's ratio pairs the two runs made side by side, and the median
# round counts. Round 1's lake goes on to the later steps.
ROUNDS=${ROUNDS:-3}
for k in $(seq 1 "$ROUNDS"); do
  step "(a) round $k/$ROUNDS: ingot's first ingest of SF$SF into a fresh lake"
  rm -rf "$LAKE.$k"
  measure "ingot_first_$k" "$INGOT" "${INGOT_ARGS[@]}" --lake "$LAKE.$k" ingest lineitem "$CSV" ||
    die "ingot's first ingest failed"
  step "(d) round $k/$ROUNDS: DuckDB doing the same job (file hash, typed read, row_hash + fingerprint, the run's columns, zstd Parquet)"
  measure "duckdb_bronze_$k" "$PY" bench/duckdb_job.py bronze "$CSV" "$DDB/lineitem_bronze_$k.parquet" ||
    die "DuckDB's job failed"
  step "(a-off) round $k/$ROUNDS: ingot's first ingest with INGOT_DELTA=off (the cost of publishing the Delta logs)"
  rm -rf "$LAKE.off"
  INGOT_DELTA=off measure "ingot_first_nodelta_$k" "$INGOT" "${INGOT_ARGS[@]}" --lake "$LAKE.off" ingest lineitem "$CSV" ||
    die "ingot's first ingest without Delta failed"
  rm -rf "$LAKE.off"
done
median ingot_first "$ROUNDS"
median duckdb_bronze "$ROUNDS"
median ingot_first_nodelta "$ROUNDS"
mv "$LAKE.1" "$LAKE"
for k in $(seq 2 "$ROUNDS"); do rm -rf "$LAKE.$k" "$DDB/lineitem_bronze_$k.parquet"; done
RUN_A=$(run_id ingot_first_1)
GOT=$(sql "$LAKE" "SELECT status, rows_seen, rows_inserted, rows_updated, rows_unchanged, rows_failed FROM audit.ingestion_run_log WHERE run_id = '$RUN_A'")
[ "$GOT" = "succeeded,$ROWS,$ROWS,0,0,0" ] ||
  die "first ingest: run log says '$GOT', expected succeeded,$ROWS,$ROWS,0,0,0 (status,seen,inserted,updated,unchanged,failed)"

step "(b) ingot: the identical file again (must be skipped)"
measure ingot_again "$INGOT" "${INGOT_ARGS[@]}" --lake "$LAKE" ingest lineitem "$CSV" ||
  die "ingot's second ingest of the same file failed"
RUN_B=$(run_id ingot_again)
GOT=$(sql "$LAKE" "SELECT status, rows_seen FROM audit.ingestion_run_log WHERE run_id = '$RUN_B'")
[ "$GOT" = "skipped_duplicate_file,0" ] || die "same file again: run log says '$GOT', expected skipped_duplicate_file,0"

step "(c) ingot: re-delivery with 3 rows changed"
measure ingot_redelivery "$INGOT" "${INGOT_ARGS[@]}" --lake "$LAKE" ingest lineitem "$REDELIVERED" ||
  die "ingot's ingest of the re-delivery failed"
RUN_C=$(run_id ingot_redelivery)
GOT=$(sql "$LAKE" "SELECT rows_updated, rows_inserted, rows_unchanged, rows_failed FROM audit.ingestion_run_log WHERE run_id = '$RUN_C'")
[ "$GOT" = "3,0,$((ROWS - 3)),0" ] ||
  die "re-delivery: run log says '$GOT', expected 3,0,$((ROWS - 3)),0 (updated,inserted,unchanged,failed)"

step "(a') ingot: the first ingest again into a fresh lake with INGOT_SYNC=0 (the cost of syncing)"
rm -rf "$LAKE.nosync"
INGOT_SYNC=0 measure ingot_first_nosync "$INGOT" "${INGOT_ARGS[@]}" --lake "$LAKE.nosync" ingest lineitem "$CSV" ||
  die "ingot's first ingest without syncing failed"
rm -rf "$LAKE.nosync"

step "(d) DuckDB: the hashes alone, without the file hash and the run's columns (reference)"
measure duckdb_hash "$PY" bench/duckdb_job.py hash "$CSV" "$DDB/lineitem_hashed.parquet" ||
  die "DuckDB's hash job failed"
step "(d) DuckDB: plain typed CSV -> zstd Parquet copy (reference)"
measure duckdb_copy "$PY" bench/duckdb_job.py copy "$CSV" "$DDB/lineitem_plain.parquet" ||
  die "DuckDB's plain copy failed"

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------- 5. same hashes?
step "(e) checking that ingot and DuckDB computed the same hashes"
"$PY" bench/verify.py "$LAKE" "$RUN_A" "$RUN_C" "$DDB/lineitem_bronze_1.parquet" "$REDELIVERED" "$CHANGES" "$ROWS" |
  tee "$MEASURE/verify.log" || die "ingot's and DuckDB's hashes differ (see above)"

# ------------------------------------------------------------------------------ 5b. silver
# silver.lineitem with bench/rules/lineitem/v1.yaml (6 steps, 2 validations, a `when` and a
# `spike` anomaly) against DuckDB running the same rules as SQL (bench/silver_duckdb.py) over the
# same bronze Parquet files, in a fresh lake whose bronze holds one ingest of the CSV (so every
# bronze row is current and DuckDB reads the files as they are). Then a re-delivery with 1% of
# the rows changed and an incremental build.
SILVER_ARGS=()
SILVER_META=()
if [ "${SILVER:-1}" = 1 ]; then
  SLAKE=$WORK/lake-silver
  SDDB=$WORK/duckdb-silver
  ONEPCT=$WORK/lineitem-1pct.csv
  EVERY=100
  NCHANGED=$(( ROWS / EVERY ))
  if [ ! -s "$ONEPCT" ] || [ "$CSV" -nt "$ONEPCT" ]; then
    step "silver: making the 1% re-delivery: a copy with l_comment changed in every ${EVERY}th row"
    "$PY" bench/redeliver_every.py "$CSV" "$ONEPCT" "$EVERY"
  else
    echo "ok: $ONEPCT already made" >&2
  fi
  [ $(( $(stat -c %s "$ONEPCT") - $(stat -c %s "$CSV") )) = $(( NCHANGED * 10 )) ] ||
    die "$ONEPCT is not $CSV plus $NCHANGED changed comments: delete it to have it made again"
  rm -rf "$SLAKE" "$SDDB"
  mkdir -p "$SDDB"
  cat "$CSV" "$ONEPCT" > /dev/null

  step "silver: bronze for the silver jobs: first ingest of SF$SF into a fresh lake"
  measure silver_bronze_first "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" ingest lineitem "$CSV" ||
    die "ingot's first ingest (silver lake) failed"
  RUN_S=$(run_id silver_bronze_first)
  GOT=$(sql "$SLAKE" "SELECT status, rows_inserted FROM audit.ingestion_run_log WHERE run_id = '$RUN_S'")
  [ "$GOT" = "succeeded,$ROWS" ] || die "silver lake ingest: run log says '$GOT', expected succeeded,$ROWS"
  BRONZE_FIRST="$SLAKE/bronze/lineitem/run_id=$RUN_S/*.parquet"

  SLOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
  # The silver jobs are short enough for one disturbance to move a ratio: each runs 3 times and
  # its median counts (the same for ingot and DuckDB).
  step "(f) ingot: full silver build of lineitem, 3 times, each after the same build with INGOT_DELTA=off (the cost of publishing Delta; the last one is published; the medians count)"
  # on and off alternate, so a machine that slows down or warms up during the steps weighs on
  # both alike
  for k in 1 2 3; do
    INGOT_DELTA=off measure "silver_ingot_full_nodelta_$k" "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" build lineitem --full ||
      die "ingot's full silver build without Delta failed"
    measure "silver_ingot_full_$k" "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" build lineitem --full ||
      die "ingot's full silver build failed"
  done
  median silver_ingot_full 3
  median silver_ingot_full_nodelta 3
  BUILD_F=$(build_id silver_ingot_full_3)
  GOT=$(sql "$SLAKE" "SELECT status, mode, rows_read FROM audit.silver_build_log WHERE build_id = '$BUILD_F'")
  [ "$GOT" = "succeeded,full,$ROWS" ] || die "full build: build log says '$GOT', expected succeeded,full,$ROWS"

  step "(g) DuckDB: the same rules as SQL over the same bronze Parquet (zstd Parquet out; 3 times, the median counts)"
  for k in 1 2 3; do
    measure "silver_duckdb_$k" "$PY" bench/silver_duckdb.py build "$SLAKE/bronze/lineitem/**/*.parquet" "$SDDB" ||
      die "DuckDB's silver job failed"
  done
  median silver_duckdb 3

  if [ "${CLUSTER:-}" = 1 ]; then
    # The same full build on a one-scheduler, two-executor loopback cluster (bronze still has one
    # run, so every plan of the build runs there; the client writes the snapshot and commits).
    step "(g2) ingot: full silver build of lineitem on a loopback cluster (1 scheduler, 2 executors)"
    CLUSTER_PIDS=()
    stop_cluster() { for p in "${CLUSTER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
    trap stop_cluster EXIT
    CPORT=${BENCH_CLUSTER_PORT:-50150}
    "$INGOT" --lake "$SLAKE" cluster scheduler --bind "127.0.0.1:$CPORT" > "$MEASURE/cluster_scheduler.log" 2>&1 &
    CLUSTER_PIDS+=($!)
    for i in 1 2; do
      "$INGOT" --lake "$SLAKE" cluster executor --scheduler "127.0.0.1:$CPORT" \
        --bind "127.0.0.1:$((CPORT + 2 * i - 1))" --grpc-bind "127.0.0.1:$((CPORT + 2 * i))" \
        --concurrent-tasks 1 --work-dir "$WORK/cluster-executor-$i" > "$MEASURE/cluster_executor_$i.log" 2>&1 &
      CLUSTER_PIDS+=($!)
    done
    sleep 3
    measure silver_cluster_full "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" --cluster "df://127.0.0.1:$CPORT" \
      build lineitem --full || die "ingot's full silver build on the cluster failed"
    stop_cluster
    BUILD_C=$(build_id silver_cluster_full)
    "$PY" bench/silver_duckdb.py check "$SLAKE" "$BUILD_C" "$SDDB" "$BRONZE_FIRST" --lineage |
      tee "$MEASURE/silver_cluster_verify.log" || die "ingot's cluster build and DuckDB's differ (see above)"
    CLUSTER_S=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["wall_s"])' "$MEASURE/silver_cluster_full.json")
    LOCAL_S=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["wall_s"])' "$MEASURE/silver_ingot_full.json")
    RATIO=$("$PY" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "$CLUSTER_S" "$LOCAL_S")
    SILVER_META+=(--meta "cluster: full silver build on a loopback cluster of ingot processes (1 scheduler, 2 executors x 1 task, same machine): $CLUSTER_S s vs $LOCAL_S s in-process = ${RATIO}x (target <= 2x); its rows agree with DuckDB's ($(grep -c '^silver check: ok' "$MEASURE/silver_cluster_verify.log") checks ok)")
  fi

  step "(h) ingot: ingest of the re-delivery with 1% of the rows changed ($NCHANGED)"
  measure silver_ingest_1pct "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" ingest lineitem "$ONEPCT" ||
    die "ingot's ingest of the 1% re-delivery failed"
  RUN_P=$(run_id silver_ingest_1pct)
  GOT=$(sql "$SLAKE" "SELECT rows_updated, rows_inserted, rows_unchanged, rows_failed FROM audit.ingestion_run_log WHERE run_id = '$RUN_P'")
  [ "$GOT" = "$NCHANGED,0,$((ROWS - NCHANGED)),0" ] ||
    die "1% re-delivery: run log says '$GOT', expected $NCHANGED,0,$((ROWS - NCHANGED)),0 (updated,inserted,unchanged,failed)"

  step "(i) ingot: incremental silver build after the 1% re-delivery, 3 times, each followed by the same build with INGOT_DELTA=off (the cost of publishing Delta; every build undone after it, the medians count)"
  INC=silver_ingot_incremental
  if measure "${INC}_1" "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" build lineitem; then
    # on and off alternate, so a machine that slows down or warms up during the steps weighs on
    # both alike
    for k in 1 2 3; do
      if [ "$k" -gt 1 ]; then
        measure "${INC}_$k" "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" build lineitem ||
          die "ingot's incremental silver build failed on run $k"
      fi
      "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" undo "$(build_id "${INC}_$k")" > "$MEASURE/${INC}_undo_$k.log" ||
        die "undo of the incremental build failed (see $MEASURE/${INC}_undo_$k.log)"
      INGOT_DELTA=off measure "${INC}_nodelta_$k" "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" build lineitem ||
        die "ingot's incremental build without Delta failed"
      "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" undo "$(build_id "${INC}_nodelta_$k")" > /dev/null ||
        die "undo of the incremental build failed"
    done
    median "$INC" 3
    median "${INC}_nodelta" 3
  else
    # A failed build publishes nothing: it is reported as failed, and measured again with more
    # memory so that the table still has its time (reported separately, never as met).
    RETRY_LIMIT=${SILVER_RETRY_MEMORY_LIMIT:-4G}
    step "(i) the incremental build failed with the default --memory-limit: again with --memory-limit $RETRY_LIMIT"
    INC=silver_ingot_incremental_retry
    measure "$INC" "$INGOT" "${INGOT_ARGS[@]}" --memory-limit "$RETRY_LIMIT" --lake "$SLAKE" build lineitem ||
      die "ingot's incremental silver build failed, also with --memory-limit $RETRY_LIMIT"
    SILVER_ARGS+=(--silver-retry-limit "$RETRY_LIMIT")
  fi
  if [ "$INC" = silver_ingot_incremental ]; then
    # then with copy-on-write instead of deletion vectors (once: the Delta table is made again in
    # that mode, so every file the 1% touched is copied), then once more as it was, to leave the
    # table so
    step "(i-cow) ingot: the incremental build publishing copy-on-write (the silver Delta table made again in that mode)"
    rm -rf "$SLAKE/silver/lineitem/_delta_log" "$SLAKE/_cache/delta/silver/lineitem.json"
    INGOT_DELTA=copy-on-write measure "${INC}_cow" "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" build lineitem ||
      die "ingot's copy-on-write incremental build failed"
    "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" undo "$(build_id "${INC}_cow")" > /dev/null || die "undo failed"
    rm -rf "$SLAKE/silver/lineitem/_delta_log" "$SLAKE/_cache/delta/silver/lineitem.json"
    "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" build lineitem > "$MEASURE/$INC.kept.log" 2>&1 ||
      die "the last incremental build failed"
  fi
  if [ -s "$MEASURE/$INC.kept.log" ]; then BUILD_I=$(build_id "$INC.kept"); else BUILD_I=$(build_id "$INC"); fi
  GOT=$(sql "$SLAKE" "SELECT status, mode, rows_read FROM audit.silver_build_log WHERE build_id = '$BUILD_I'")
  [ "$GOT" = "succeeded,incremental,$NCHANGED" ] ||
    die "incremental build: build log says '$GOT', expected succeeded,incremental,$NCHANGED"
  SLOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

  step "(j) checking that ingot's silver.lineitem and DuckDB's agree (rows, flags, values)"
  echo "full build $BUILD_F:" > "$MEASURE/silver_verify.log"
  "$PY" bench/silver_duckdb.py check "$SLAKE" "$BUILD_F" "$SDDB" "$BRONZE_FIRST" --lineage |
    tee -a "$MEASURE/silver_verify.log" || die "ingot's full silver build and DuckDB's differ (see above)"
  # The 1% changed only l_comment, which silver drops: the same rows, values and flags.
  echo "incremental build $BUILD_I:" >> "$MEASURE/silver_verify.log"
  "$PY" bench/silver_duckdb.py check "$SLAKE" "$BUILD_I" "$SDDB" "$BRONZE_FIRST" |
    tee -a "$MEASURE/silver_verify.log" || die "ingot's incremental silver build and DuckDB's differ (see above)"
  FLAGGED=$(sql "$SLAKE" "SELECT rows_written, rows_filtered, rows_rejected, rows_flagged FROM audit.silver_build_log WHERE build_id = '$BUILD_F'")
  SILVER_ARGS+=(--silver-changed "$NCHANGED")
  SILVER_META+=(
    --meta "silver: bench/rules/lineitem/v1.yaml (6 steps, 2 validations, anomalies when + spike) vs the same rules as DuckDB SQL (bench/silver_duckdb.py) over the bronze Parquet of one ingest (DuckDB writes the silver rows and the rejections; it needs no _current deduplication and writes no build state); full build: written,filtered,rejected,flagged = $FLAGGED"
    --meta "silver check: $(grep -c '^silver check: ok' "$MEASURE/silver_verify.log") checks ok; both builds agree with DuckDB on rows, fingerprints, anomaly_flags, disc_price, charge, l_shipmode (full build also row_hash, ingestion_run_id)"
    --meta "silver re-delivery: l_comment changed in every ${EVERY}th row ($NCHANGED rows); load average around the silver jobs: $SLOAD_BEFORE; after: $SLOAD_AFTER"
    --meta "silver timing: the full build, DuckDB's silver job and the incremental build each ran 3 times; the table shows each one's median run (all runs: measure/silver_*_[123].json)"
  )
fi

# ----------------------------------------------------------------- 5b'. bronze.<source>_current
# The current versions exported whole, beside the same export of every version and DuckDB
# ranking the same bronze files (default --memory-limit): on the silver lake, after its 1%
# re-delivery (6M records, 60k of them with two versions). Then the three sorted keys of the view.
CURRENT_META=()
if [ "${SILVER:-1}" = 1 ]; then
  step "(j) bronze.lineitem_current exported to Parquet, beside bronze.lineitem (every version) and DuckDB's ranking of the same files"
  measure current_export "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" sql "SELECT * FROM bronze.lineitem_current" \
    --format parquet --output "$WORK/current.parquet" || die "ingot's export of bronze.lineitem_current failed"
  measure bronze_export "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" sql "SELECT * FROM bronze.lineitem" \
    --format parquet --output "$WORK/bronze.parquet" || die "ingot's export of bronze.lineitem failed"
  measure current_duckdb "$PY" bench/duckdb_job.py current "$SLAKE/bronze/lineitem/run_id=*/*.parquet" "$WORK/current.duckdb.parquet" ||
    die "DuckDB's ranking of the bronze files failed"
  # the Delta table ingot keeps of the same rows (deletion vectors): DuckDB reads it as a scan
  measure current_delta "$PYD" bench/duckdb_job.py delta "$SLAKE/bronze/lineitem/_current" "$WORK/current.delta.parquet" ||
    die "DuckDB's read of bronze/lineitem/_current failed"
  measure current_top3 "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" sql \
    "SELECT l_orderkey, l_linenumber, l_comment FROM bronze.lineitem_current ORDER BY l_orderkey, l_linenumber LIMIT 3" \
    --format csv || die "ingot's ORDER BY ... LIMIT 3 over bronze.lineitem_current failed"
  NCUR=$("$PY" -c 'import duckdb, sys; print(duckdb.sql(f"SELECT count(*) FROM read_parquet({sys.argv[1]!r})").fetchall()[0][0])' "$WORK/current.parquet")
  [ "$NCUR" = "$ROWS" ] || die "bronze.lineitem_current exported $NCUR rows, expected $ROWS"
  # every column but the run's: ingot's rows and DuckDB's are the same multiset
  SAME=$("$PY" -c 'import duckdb, sys
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
q = "SELECT * EXCLUDE (ingestion_run_id, ingested_at) FROM read_parquet({!r})"
a, b = q.format(sys.argv[1]), q.format(sys.argv[2])
print(con.sql(f"SELECT count(*) FROM (({a} EXCEPT ALL {b}) UNION ALL ({b} EXCEPT ALL {a}))").fetchall()[0][0])' "$WORK/current.parquet" "$WORK/current.duckdb.parquet")
  [ "$SAME" = 0 ] || die "bronze.lineitem_current and DuckDB's ranking differ in $SAME rows"
  # every column: the Delta table's rows are exactly the view's
  SAME=$("$PY" -c 'import duckdb, sys
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
a, b = (f"SELECT * FROM read_parquet({p!r})" for p in sys.argv[1:3])
print(con.sql(f"SELECT count(*) FROM (({a} EXCEPT ALL {b}) UNION ALL ({b} EXCEPT ALL {a}))").fetchall()[0][0])' "$WORK/current.parquet" "$WORK/current.delta.parquet")
  [ "$SAME" = 0 ] || die "bronze.lineitem_current and DuckDB's read of bronze/lineitem/_current differ in $SAME rows"
  rm -f "$WORK/current.parquet" "$WORK/bronze.parquet" "$WORK/current.duckdb.parquet" "$WORK/current.delta.parquet"
  line() { "$PY" -c 'import json, sys
m = {k: json.load(open(f"{sys.argv[1]}/{k}.json")) for k in ("current_export", "bronze_export", "current_duckdb", "current_top3", "current_delta")}
(cw, cp), (bw, bp), (dw, dp), (tw, _), (xw, xp) = ((m[k]["wall_s"], m[k]["peak_rss_mb"]) for k in m)
print(f"bronze.lineitem_current exported to Parquet ({sys.argv[2]} rows, after the 1% re-delivery): {cw:.2f} s, peak {cp:.0f} MB; "
      f"bronze.lineitem (every version) {bw:.2f} s, peak {bp:.0f} MB: {cw / bw:.2f}x (target <= 1.2x, peak <= 1024 MB); "
      f"DuckDB ranking the same files {dw:.2f} s, peak {dp:.0f} MB (same rows); "
      f"DuckDB 1.4.4 reading the Delta table bronze/lineitem/_current (deletion vectors, no ranking) {xw:.2f} s, peak {xp:.0f} MB (same rows, every column); "
      f"ORDER BY l_orderkey, l_linenumber LIMIT 3 over the view {tw:.2f} s (target < 10 s)")' "$MEASURE" "$ROWS"; }
  CURRENT_META+=(--meta "$(line)")
fi

# ---------------------------------------------------------------------- 5c. analysts' SQL
# TPC-H Q1 and Q6 (bench/queries) over silver.lineitem as the incremental build left it: ingot's
# shell and DuckDB over the same snapshot files, each query run 3 times in one session, the
# fastest run reported (timed inside each process: execute and fetch every row). Then the Flight
# SQL round trip: a real ADBC client fetching a 1,000,000-row result from `ingot serve`, against
# the same query run in-process by `ingot sql --format arrow` (whole process, best of 3).
QUERY_ARGS=()
if [ "${SILVER:-1}" = 1 ]; then
  QDIR=$MEASURE/queries
  mkdir -p "$QDIR"
  for q in q1 q6; do
    step "($q) TPC-H ${q^^} over silver.lineitem: ingot sql and DuckDB, best of 3"
    QSQL=$(grep -v '^--' "bench/queries/$q.sql" | sed 's/\blineitem\b/silver.lineitem/')
    printf '\\timing on\n\\format csv\n%s;\n%s;\n%s;\n' "$QSQL" "$QSQL" "$QSQL" |
      ingot --lake "$SLAKE" sql > "$QDIR/$q.ingot.out" 2> "$QDIR/$q.ingot.err" ||
      die "ingot sql $q failed: $(cat "$QDIR/$q.ingot.err")"
    BEST_I=$(sed -n 's/.* rows\{0,1\} in \([0-9.]*\)s$/\1/p' "$QDIR/$q.ingot.err" | sort -g | head -n 1)
    [ -n "$BEST_I" ] || die "no timing from ingot sql $q: $(cat "$QDIR/$q.ingot.err")"
    # the first result of the three (header + rows up to the next header)
    awk 'NR == 1 { h = $0 } NR > 1 && $0 == h { exit } { print }' "$QDIR/$q.ingot.out" > "$QDIR/$q.ingot.csv"
    BEST_D=$("$PY" bench/tpch_queries.py duckdb "$SLAKE" "$BUILD_I" "bench/queries/$q.sql" "$QDIR/$q.duckdb.csv" 3 |
      sed -n 's/^best //p') || die "DuckDB $q failed"
    "$PY" bench/tpch_queries.py same "$QDIR/$q.ingot.csv" "$QDIR/$q.duckdb.csv" >&2 ||
      die "ingot and DuckDB give different $q results ($QDIR/$q.*.csv)"
    QUERY_ARGS+=(--query "$q,$BEST_I,$BEST_D")
    # the same through the lake's Delta table: DuckDB 1.4.4's delta_scan of silver/lineitem
    BEST_X=$("$PYD" bench/tpch_queries.py delta "$SLAKE/silver/lineitem" "bench/queries/$q.sql" "$QDIR/$q.delta.csv" 3 |
      sed -n 's/^best //p') || die "DuckDB delta_scan $q failed"
    "$PY" bench/tpch_queries.py same "$QDIR/$q.ingot.csv" "$QDIR/$q.delta.csv" >&2 ||
      die "ingot and DuckDB's delta_scan give different $q results ($QDIR/$q.*.csv)"
    QUERY_ARGS+=(--query-delta "$q,$BEST_I,$BEST_X")
  done

  step "(flight) Flight SQL round trip of a 1,000,000-row result vs the same query in-process"
  FQ="SELECT l_orderkey, l_partkey, l_suppkey, l_linenumber, l_quantity, l_extendedprice, l_discount, l_tax, l_shipdate, l_shipmode FROM silver.lineitem LIMIT 1000000"
  BEST_P=
  for _ in 1 2 3; do
    T0=$(date +%s.%N)
    ingot --lake "$SLAKE" sql "$FQ" --format arrow --output /dev/null || die "ingot sql --format arrow failed"
    T=$(echo "$(date +%s.%N) - $T0" | bc)
    if [ -z "$BEST_P" ] || [ "$(echo "$T < $BEST_P" | bc)" = 1 ]; then BEST_P=$T; fi
  done
  coproc SERVE { exec "$INGOT" "${INGOT_ARGS[@]}" --lake "$SLAKE" serve --addr 127.0.0.1:0; }
  SERVE_PID=$SERVE_PID
  trap 'kill $SERVE_PID 2>/dev/null || true' EXIT
  read -r -t 60 FIRST <&"${SERVE[0]}" || die "ingot serve did not start"
  ADDR=$(echo "$FIRST" | sed -n 's/^listening on \([^ ]*\).*/\1/p')
  [ -n "$ADDR" ] || die "ingot serve said: $FIRST"
  FLIGHT=$("$PY" bench/flight_fetch.py "grpc://$ADDR" "$FQ" 3) || die "the Flight SQL client failed"
  kill "$SERVE_PID" 2>/dev/null || true
  wait "$SERVE_PID" 2>/dev/null || true
  trap - EXIT
  FROWS=$(echo "$FLIGHT" | sed -n 's/^rows \([0-9]*\) .*/\1/p')
  WANT=$(sql "$SLAKE" "SELECT least(count(*), 1000000) FROM silver.lineitem")
  [ "$FROWS" = "$WANT" ] || die "the Flight SQL client got $FROWS rows, expected $WANT"
  QUERY_ARGS+=(--flight "$(echo "$FLIGHT" | sed -n 's/.* best //p'),$(printf '%.4f' "$BEST_P"),$FROWS")
fi

# ------------------------------------------------------------------------ 5d. API pull
# ingot pull of 1,000,000 records in 1,000 pages beside dlt's rest_api source, same server and
# machine (bench/pull.sh writes bench/results-pull.md); PULL=0 leaves it out.
if [ "${PULL:-1}" = 1 ]; then
  step "(pull) the API pull beside dlt (bench/pull.sh)"
  INGOT_BIN="$INGOT" bench/pull.sh || die "the API pull benchmark failed"
fi

# --------------------------------------------------------------------- 5e. several sources
# A silver table fed by two bronze sources (SF lineitem split by key, 10% overlap) against a
# one-source build of the same rows and DuckDB doing the same survivorship (bench/sources.sh
# writes bench/results-sources.md); SOURCES=0 leaves it out.
if [ "${SOURCES:-1}" = 1 ]; then
  step "(sources) a silver table fed by two sources beside a one-source build and DuckDB (bench/sources.sh)"
  INGOT_BIN="$INGOT" SF="$SF" bench/sources.sh || die "the several-sources benchmark failed"
fi

# ------------------------------------------------------------------------ 6. SF10 (opt.)
SF10_ARGS=()
if [ "${SF10:-}" = 1 ]; then
  gen 10
  CSV10=$ROOT/bench/work/sf10/lineitem.csv
  ROWS10=$(( $(wc -l < "$CSV10") - 1 ))
  step "SF10: ingot first ingest of $ROWS10 rows into a fresh lake (peak memory)"
  rm -rf "$ROOT/bench/work/sf10/lake"
  measure ingot_first_sf10 "$INGOT" "${INGOT_ARGS[@]}" --lake "$ROOT/bench/work/sf10/lake" \
    ingest lineitem "$CSV10" || die "ingot's SF10 ingest failed"
  SF10_ARGS=(--sf10-rows "$ROWS10")
  step "SF10: bronze.lineitem_current exported to Parquet (default --memory-limit, peak memory)"
  measure current_export_sf10 "$INGOT" "${INGOT_ARGS[@]}" --lake "$ROOT/bench/work/sf10/lake" \
    sql "SELECT * FROM bronze.lineitem_current" --format parquet --output "$ROOT/bench/work/sf10/current.parquet" ||
    die "ingot's SF10 export of bronze.lineitem_current failed"
  N10=$("$PY" -c 'import duckdb, sys; print(duckdb.sql(f"SELECT count(*) FROM read_parquet({sys.argv[1]!r})").fetchall()[0][0])' "$ROOT/bench/work/sf10/current.parquet")
  [ "$N10" = "$ROWS10" ] || die "the SF10 bronze.lineitem_current exported $N10 rows, expected $ROWS10"
  rm -f "$ROOT/bench/work/sf10/current.parquet"
  if [ "${SILVER:-1}" = 1 ]; then
    step "SF10: ingot full silver build and DuckDB's same rules over the same bronze (peak memory)"
    measure ingot_silver_sf10 "$INGOT" "${INGOT_ARGS[@]}" --lake "$ROOT/bench/work/sf10/lake" build lineitem --full ||
      die "ingot's SF10 silver build failed"
    rm -rf "$ROOT/bench/work/sf10/duckdb-silver"
    mkdir -p "$ROOT/bench/work/sf10/duckdb-silver"
    measure duckdb_silver_sf10 "$PY" bench/silver_duckdb.py build "$ROOT/bench/work/sf10/lake/bronze/lineitem/**/*.parquet" \
      "$ROOT/bench/work/sf10/duckdb-silver" || die "DuckDB's SF10 silver job failed"
  fi
fi

# ----------------------------------------------------------------------------- 7. table
step "results"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain -- src Cargo.toml 2>/dev/null)" ]; then COMMIT="$COMMIT (+ uncommitted changes in src/)"; fi
MEM_GIB=$(awk '/^MemTotal:/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo)
CPU=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
BIN_DATE=$(date -u -r "$INGOT" +%Y-%m-%dT%H:%MZ)
"$PY" bench/report.py --measure "$MEASURE" --sf "$SF" --rows "$ROWS" --md "$ROOT/bench/results-sf$SF.md" \
  "${SF10_ARGS[@]}" "${SILVER_ARGS[@]}" "${QUERY_ARGS[@]}" \
  --meta "measured: $(date -u +%Y-%m-%dT%H:%MZ)" \
  --meta "machine: nproc $(nproc), memory $MEM_GIB GiB, ${CPU:-unknown CPU}, $(uname -sr)" \
  --meta "ingot: commit $COMMIT, release binary built $BIN_DATE, default --memory-limit" \
  --meta "load average (1, 5, 15 min) before the timed jobs: $LOAD_BEFORE; after: $LOAD_AFTER" \
  --meta "duckdb $DUCKDB_VERSION (Python, default settings; escaping $( [ "${BENCH_DUCKDB_ESCAPE_ALL:-}" = 1 ] && echo 'every field' || echo 'string fields only')), tpchgen-cli $TPCHGEN_VERSION" \
  --meta "input: $(du -m "$CSV" | cut -f1) MB CSV; re-delivery = same file with l_comment changed in 3 rows" \
  --meta "hash check: $(tail -n 1 "$MEASURE/verify.log" | sed 's/^verify: //'), $ROWS rows joined on (l_orderkey, l_linenumber)" \
  "${SILVER_META[@]}" "${CURRENT_META[@]}"
echo >&2
echo "written: bench/results-sf$SF.md" >&2
