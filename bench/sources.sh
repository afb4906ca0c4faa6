#!/usr/bin/env bash
# The several-sources benchmark: a silver table fed by two bronze sources (A and B, ~3M rows each
# at SF1, split from TPC-H lineitem by order key with ~10% of each source's keys also in the
# other; bench/sources/split.py) against a one-source build of the same rows (A's file and B's
# file ingested into one source, B's overlapping records becoming updates), and DuckDB doing the
# same survivorship in SQL over the same bronze Parquet (bench/sources/duckdb_sources.py). Same
# machine, one run: the full builds and DuckDB's job 3 times each, interleaved, medians; then a
# re-delivery of 1,000 changed rows to B and the incremental builds (3 times each, undone between,
# medians) beside DuckDB recomputing the table. ingot's tables are checked against DuckDB's
# (rows, provenance, conflicts, every column). Writes bench/results-sources.md
# (bench/results-sources-sf<SF>.md for another SF).
#
#   INGOT_BIN=PATH bench/sources.sh      (make bench runs it after the silver part; SOURCES=0 there
#                                         leaves it out)
#   SF=1          the scale factor (default 1); bench/work/sf<SF>/lineitem.csv is generated with
#                 the venv's tpchgen-cli when missing, as scripts/bench.sh does
#   ROUNDS=3      how many times each full build, incremental build and DuckDB job runs
#   INGOT_BIN_COMMIT=TEXT  what the binary was built from, for the results (default: the
#                 checkout's commit when the script starts, "+ uncommitted changes in src/" if so)
#
# Needs the venv .venv-bench that scripts/bench.sh makes (duckdb, tpchgen-cli).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
T_START=$(date +%s)
# the checkout the binary presumably came from, read before anything runs (others may commit meanwhile)
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain -- src Cargo.toml 2>/dev/null)" ]; then COMMIT="$COMMIT (+ uncommitted changes in src/)"; fi
COMMIT=${INGOT_BIN_COMMIT:-$COMMIT}
die() { echo "bench/sources.sh: error: $*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*" >&2; }
INGOT=${INGOT_BIN:?set INGOT_BIN to a release build of ingot (scripts/bench.sh passes its own)}
[ -x "$INGOT" ] || die "INGOT_BIN=$INGOT is not an executable"
SF=${SF:-1}
case $SF in
  '' | *[!0-9.]* | *.*.* | .* | *.) die "SF must be a number like 1 or 0.01 (got '$SF')" ;;
esac
ROUNDS=${ROUNDS:-3}
case $ROUNDS in '' | *[!0-9]* | 0) die "ROUNDS must be a positive integer (got '$ROUNDS')" ;; esac
PY=$ROOT/.venv-bench/bin/python
[ -x "$PY" ] && "$PY" -c 'import duckdb' 2>/dev/null && [ -x "$ROOT/.venv-bench/bin/tpchgen-cli" ] ||
  die "no venv .venv-bench with duckdb and tpchgen-cli: run \`make bench\` (scripts/bench.sh makes it) once"
HERE=$ROOT/bench/sources
WORK=$ROOT/bench/work/sf$SF
CSV=$WORK/lineitem.csv
SPLIT=$WORK/sources
RUN=$WORK/sources-run
LAKE=$RUN/lake
MEASURE=$RUN/measure
DDB=$RUN/duckdb
if [ "$SF" = 1 ]; then RESULTS=$ROOT/bench/results-sources.md; else RESULTS=$ROOT/bench/results-sources-sf$SF.md; fi
HEADER='l_orderkey,l_partkey,l_suppkey,l_linenumber,l_quantity,l_extendedprice,l_discount,l_tax,l_returnflag,l_linestatus,l_shipdate,l_commitdate,l_receiptdate,l_shipinstruct,l_shipmode,l_comment'

INGOT_ARGS=(--contracts "$HERE/contracts" --rules "$HERE/rules" --lake "$LAKE")
ingot() { "$INGOT" "${INGOT_ARGS[@]}" "$@"; }
# sql QUERY: the result rows as CSV, without the header line
sql() { ingot sql "$1" --format csv | tail -n +2; }
# Every timed job starts after `sync` (untimed), so one job's writeback does not land in the next.
measure() { local label=$1; shift; sync; "$PY" bench/measure.py --label "$label" --out "$MEASURE/$label.json" --log "$MEASURE/$label.log" -- "$@"; }
run_id() { sed -n 's/.*\[run \([0-9a-f-]*\)\].*/\1/p' "$MEASURE/$1.log" | tail -n 1; }
build_id() { sed -n 's/.*\[build \([0-9a-f-]*\)\].*/\1/p' "$MEASURE/$1.log" | tail -n 1; }
# median LABEL: of the timed jobs LABEL_1 .. LABEL_ROUNDS, the one with the median wall time is
# reported as LABEL (its measurement and log copied)
median() {
  local label=$1 k
  k=$("$PY" -c 'import json, sys
d, label, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
walls = sorted((json.load(open(f"{d}/{label}_{k}.json"))["wall_s"], k) for k in range(1, n + 1))
print(walls[n // 2][1])' "$MEASURE" "$label" "$ROUNDS")
  cp "$MEASURE/${label}_$k.json" "$MEASURE/$label.json"
  cp "$MEASURE/${label}_$k.log" "$MEASURE/$label.log"
  echo "[median] $label: run $k of $ROUNDS" >&2
}
# expect WHAT GOT WANT
expect() { [ "$2" = "$3" ] || die "$1: got '$2', expected '$3'"; }
undo() { ingot undo "$1" > "$MEASURE/undo-$1.log" 2>&1 || die "undo of $1 failed: $(cat "$MEASURE/undo-$1.log")"; }

step "contract check (bench/sources/contracts, bench/sources/rules)"
"$INGOT" --contracts "$HERE/contracts" --rules "$HERE/rules" check || die "ingot check refused bench/sources"

# ------------------------------------------------------------------------------- data
if [ ! -s "$CSV" ]; then
  step "generating TPC-H lineitem SF$SF with tpchgen-cli into $WORK"
  rm -rf "$WORK/.gen"
  mkdir -p "$WORK/.gen"
  "$ROOT/.venv-bench/bin/tpchgen-cli" csv --scale-factor "$SF" --tables lineitem --output-dir "$WORK/.gen" --quiet
  mv "$WORK/.gen/lineitem.csv" "$CSV"
  rm -rf "$WORK/.gen"
fi
[ "$(head -n 1 "$CSV")" = "$HEADER" ] || die "$CSV: unexpected header line; bench/sources/split.py expects: $HEADER"
if [ ! -s "$SPLIT/split.json" ] || [ "$CSV" -nt "$SPLIT/split.json" ] || [ "$HERE/split.py" -nt "$SPLIT/split.json" ]; then
  step "splitting $CSV into sources A and B and B's re-delivery (bench/sources/split.py, streamed)"
  rm -rf "$SPLIT"
  "$PY" "$HERE/split.py" "$CSV" "$SPLIT" || die "bench/sources/split.py failed"
else
  echo "ok: $SPLIT already split" >&2
fi
n() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$SPLIT/split.json" "$1"; }
ROWS_A=$(n rows_a) ROWS_B=$(n rows_b) OVERLAP=$(n overlap) KEYS=$(n distinct_keys) REDELIVERED=$(n redelivered)
expect "data rows of $SPLIT/a.csv" "$(( $(wc -l < "$SPLIT/a.csv") - 1 ))" "$ROWS_A"
expect "data rows of $SPLIT/b.csv" "$(( $(wc -l < "$SPLIT/b.csv") - 1 ))" "$ROWS_B"
expect "data rows of $SPLIT/b-redelivery.csv" "$(( $(wc -l < "$SPLIT/b-redelivery.csv") - 1 ))" "$REDELIVERED"
echo "ok: A $ROWS_A rows, B $ROWS_B rows, $OVERLAP keys in both, $KEYS distinct keys; re-delivery $REDELIVERED rows" >&2

rm -rf "$RUN"
mkdir -p "$MEASURE" "$DDB"
cat "$SPLIT/a.csv" "$SPLIT/b.csv" "$SPLIT/b-redelivery.csv" > /dev/null # the page cache, alike for every job

# ----------------------------------------------------------------------------- bronze
step "bronze: A and B into their sources, then both files into the one-source baseline lineitem_ab"
measure ingest_a "$INGOT" "${INGOT_ARGS[@]}" ingest lineitem_a "$SPLIT/a.csv" || die "ingest of A failed"
measure ingest_b "$INGOT" "${INGOT_ARGS[@]}" ingest lineitem_b "$SPLIT/b.csv" || die "ingest of B failed"
measure ingest_ab_a "$INGOT" "${INGOT_ARGS[@]}" ingest lineitem_ab "$SPLIT/a.csv" || die "ingest of A into lineitem_ab failed"
measure ingest_ab_b "$INGOT" "${INGOT_ARGS[@]}" ingest lineitem_ab "$SPLIT/b.csv" || die "ingest of B into lineitem_ab failed"
Q="SELECT status, rows_inserted, rows_updated, rows_unchanged, rows_failed FROM audit.ingestion_run_log WHERE run_id ="
expect "run log of A" "$(sql "$Q '$(run_id ingest_a)'")" "succeeded,$ROWS_A,0,0,0"
expect "run log of B" "$(sql "$Q '$(run_id ingest_b)'")" "succeeded,$ROWS_B,0,0,0"
expect "run log of A into lineitem_ab" "$(sql "$Q '$(run_id ingest_ab_a)'")" "succeeded,$ROWS_A,0,0,0"
expect "run log of B into lineitem_ab (its overlap: updates)" "$(sql "$Q '$(run_id ingest_ab_b)'")" \
  "succeeded,$((ROWS_B - OVERLAP)),$OVERLAP,0,0"
GLOB_A="$LAKE/bronze/lineitem_a/run_id=*/*.parquet"
GLOB_B="$LAKE/bronze/lineitem_b/run_id=*/*.parquet"

# ------------------------------------------------------------------------ full builds
# Each round: the one-source build, the two-source build (each the table's first build; undone
# afterwards but in the last round, so the next round's is a first build again) and DuckDB's
# job; the order of the two ingot builds alternates between rounds.
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for k in $(seq 1 "$ROUNDS"); do
  if [ $((k % 2)) = 1 ]; then ORDER="one two"; else ORDER="two one"; fi
  for t in $ORDER; do
    step "round $k/$ROUNDS: ingot's first full build of the $t-source table lineitem_$t"
    measure "full_${t}_$k" "$INGOT" "${INGOT_ARGS[@]}" build "lineitem_$t" || die "the build of lineitem_$t failed"
    expect "build log of lineitem_$t" \
      "$(sql "SELECT status, mode, rows_read, rows_written FROM audit.silver_build_log WHERE build_id = '$(build_id "full_${t}_$k")'")" \
      "succeeded,full,$KEYS,$KEYS"
    if [ "$k" != "$ROUNDS" ]; then undo "$(build_id "full_${t}_$k")"; fi
  done
  step "round $k/$ROUNDS: DuckDB doing the same survivorship over the same bronze Parquet"
  measure "duckdb_full_$k" "$PY" "$HERE/duckdb_sources.py" build "$DDB/full" "$GLOB_A" "$GLOB_B" ||
    die "DuckDB's job failed"
done
median full_one
median full_two
median duckdb_full
BUILD_TWO=$(build_id "full_two_$ROUNDS")

step "checking ingot's lineitem_two (full build) against DuckDB's"
ingot sql "SELECT * FROM silver.lineitem_two" --format parquet --output "$RUN/ingot-full.parquet" ||
  die "export of silver.lineitem_two failed"
ingot sql "SELECT * FROM audit.source_conflict_log WHERE build_id = '$BUILD_TWO'" --format parquet \
  --output "$RUN/ingot-full-conflicts.parquet" || die "export of the conflicts failed"
"$PY" "$HERE/duckdb_sources.py" check "$RUN/ingot-full.parquet" "$RUN/ingot-full-conflicts.parquet" "$DDB/full" \
  "$SPLIT/split.json" | tee "$MEASURE/check_full.log" || die "ingot's full build and DuckDB's differ (see above)"
CONFLICTS_LOG=$(sql "SELECT rows_flagged, conflicts_open FROM audit.silver_build_log WHERE build_id = '$BUILD_TWO'")
expect "build log of lineitem_two: rows_flagged, conflicts_open" "$CONFLICTS_LOG" "$(n comment_differs),$(n comment_differs)"

# -------------------------------------------------------------------- the re-delivery
step "re-delivery of $REDELIVERED changed rows of B, into lineitem_b and into lineitem_ab"
measure ingest_b_redelivery "$INGOT" "${INGOT_ARGS[@]}" ingest lineitem_b "$SPLIT/b-redelivery.csv" ||
  die "ingest of B's re-delivery failed"
measure ingest_ab_redelivery "$INGOT" "${INGOT_ARGS[@]}" ingest lineitem_ab "$SPLIT/b-redelivery.csv" ||
  die "ingest of B's re-delivery into lineitem_ab failed"
expect "run log of B's re-delivery" "$(sql "$Q '$(run_id ingest_b_redelivery)'")" "succeeded,0,$REDELIVERED,0,0"
expect "run log of B's re-delivery into lineitem_ab" "$(sql "$Q '$(run_id ingest_ab_redelivery)'")" "succeeded,0,$REDELIVERED,0,0"

for k in $(seq 1 "$ROUNDS"); do
  if [ $((k % 2)) = 1 ]; then ORDER="two one"; else ORDER="one two"; fi
  for t in $ORDER; do
    step "round $k/$ROUNDS: ingot's incremental build of lineitem_$t after the re-delivery"
    measure "inc_${t}_$k" "$INGOT" "${INGOT_ARGS[@]}" build "lineitem_$t" || die "the incremental build of lineitem_$t failed"
    expect "build log of the incremental lineitem_$t" \
      "$(sql "SELECT status, mode, rows_read, rows_written FROM audit.silver_build_log WHERE build_id = '$(build_id "inc_${t}_$k")'")" \
      "succeeded,incremental,$REDELIVERED,$REDELIVERED"
    if [ "$k" != "$ROUNDS" ]; then undo "$(build_id "inc_${t}_$k")"; fi
  done
  step "round $k/$ROUNDS: DuckDB recomputing the table after the re-delivery (each source deduplicated to its current rows)"
  measure "duckdb_current_$k" "$PY" "$HERE/duckdb_sources.py" build "$DDB/current" "$GLOB_A" "$GLOB_B" --current ||
    die "DuckDB's job after the re-delivery failed"
done
median inc_one
median inc_two
median duckdb_current
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
BUILD_INC=$(build_id "inc_two_$ROUNDS")

step "checking ingot's lineitem_two (incremental build) against DuckDB's recomputation"
ingot sql "SELECT * FROM silver.lineitem_two" --format parquet --output "$RUN/ingot-inc.parquet" ||
  die "export of silver.lineitem_two failed"
ingot sql "SELECT * FROM audit.source_conflict_log WHERE build_id = '$BUILD_INC'" --format parquet \
  --output "$RUN/ingot-inc-conflicts.parquet" || die "export of the conflicts failed"
"$PY" "$HERE/duckdb_sources.py" check "$RUN/ingot-inc.parquet" "$RUN/ingot-inc-conflicts.parquet" "$DDB/current" \
  "$SPLIT/split.json" --after-redelivery | tee "$MEASURE/check_inc.log" ||
  die "ingot's incremental build and DuckDB's differ (see above)"

# ----------------------------------------------------------------------------- results
step "results"
"$PY" "$HERE/report.py" --measure "$MEASURE" --split "$SPLIT/split.json" --rounds "$ROUNDS" --sf "$SF" --md "$RESULTS" \
  --meta "measured $(date -u +%Y-%m-%dT%H:%MZ), the whole script took $(( $(date +%s) - T_START )) s" \
  --meta "machine: nproc $(nproc), memory $(awk '/^MemTotal:/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo) GiB, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(uname -sr)" \
  --meta "load average (1, 5, 15 min) before the timed builds: $LOAD_BEFORE; after: $LOAD_AFTER" \
  --meta "ingot: commit $COMMIT, release binary $INGOT built $(date -u -r "$INGOT" +%Y-%m-%dT%H:%MZ), default --memory-limit; duckdb $("$PY" -c 'import duckdb; print(duckdb.__version__)') (Python, default settings)" \
  --meta "command: \`INGOT_BIN=$INGOT SF=$SF ROUNDS=$ROUNDS${INGOT_BIN_COMMIT:+ INGOT_BIN_COMMIT='$INGOT_BIN_COMMIT'} bash bench/sources.sh\` (make bench runs it; SOURCES=0 leaves it out)"
echo "written: $RESULTS" >&2
