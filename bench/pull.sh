#!/usr/bin/env bash
# The API pull benchmark: scripts/api_server.py serves RECORDS records (default 1,000,000) in
# pages of 1,000 on loopback; ingot pulls and loads them into a fresh lake, pulls again (the
# records unchanged: a skipped run, no Parquet written), then dlt's rest_api source loads the
# same pages to Parquet (bench/requirements-dlt.txt, venv .venv-bench-dlt). Same server, same
# machine, one run. Writes bench/results-pull.md.
#
#   INGOT_BIN=target/release/ingot bench/pull.sh      (make bench runs it; RECORDS=N to change)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
die() { echo "bench/pull.sh: $*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*" >&2; }
INGOT=${INGOT_BIN:?set INGOT_BIN to a release build of ingot}
RECORDS=${RECORDS:-1000000}
PAGE=1000
WORK=$ROOT/bench/work/pull
VENV=$ROOT/.venv-bench-dlt
PYB=$ROOT/.venv-bench/bin/python
[ -x "$PYB" ] || PYB=python3

step "venv $VENV with $(tr '\n' ' ' < bench/requirements-dlt.txt)"
if [ ! -x "$VENV/bin/python" ] || ! cmp -s bench/requirements-dlt.txt "$VENV/requirements.txt"; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r bench/requirements-dlt.txt || die "pip install failed"
  cp bench/requirements-dlt.txt "$VENV/requirements.txt"
fi

rm -rf "$WORK"
mkdir -p "$WORK/contracts" "$WORK/measure"
step "the vendor API: $RECORDS records in pages of $PAGE (rendered before it listens)"
python3 scripts/api_server.py --port 0 --records "$RECORDS" --page-size "$PAGE" --token bench-token \
  --port-file "$WORK/port" --warm > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do [ -s "$WORK/port" ] && break; sleep 0.1; done
[ -s "$WORK/port" ] || die "the API server did not start: $(cat "$WORK/server.log")"
PORT=$(cat "$WORK/port")

cat > "$WORK/contracts/orders.yaml" <<EOF
source: orders
version: 1
format: api
api:
  base_url: http://127.0.0.1:$PORT/v2
  path: /orders
  params: {limit: $PAGE}
  auth: {type: bearer, token_env: VENDOR_TOKEN}
  records: "\$.data[*]"
  pagination: {type: cursor, cursor_path: "\$.meta.next", param: cursor}
  max_pages: 100000
fields:
  - {name: order_id, type: int64, required: true}
  - {name: customer, type: string}
  - {name: order_status, type: string}
  - {name: amount, type: "decimal(12,2)"}
  - {name: currency, type: string}
  - {name: updated_at, type: timestamp}
  - {name: fetched_at, type: timestamp, volatile: true}
natural_key:
  version: 1
  fields: [order_id]
EOF
export VENDOR_TOKEN=bench-token
measure() { local label=$1; shift; sync; "$PYB" bench/measure.py --label "$label" --out "$WORK/measure/$label.json" --log "$WORK/measure/$label.log" -- "$@"; }
sql() { "$INGOT" --lake "$1" --contracts "$WORK/contracts" sql "$2" --format csv | tail -n +2; }

step "ingot pull: every page, then the load, into a fresh lake"
measure ingot_pull "$INGOT" --lake "$WORK/lake" --contracts "$WORK/contracts" pull orders || die "ingot pull failed"
GOT=$(sql "$WORK/lake" "SELECT status, rows_inserted, pull_pages FROM audit.ingestion_run_log")
PAGES=$(( (RECORDS + PAGE - 1) / PAGE ))
[ "$GOT" = "succeeded,$RECORDS,$PAGES" ] || die "ingot pull: run log says '$GOT', expected succeeded,$RECORDS,$PAGES"

step "ingot pull again, the records unchanged (a skipped run: the fetch and the hash alone)"
measure ingot_repull "$INGOT" --lake "$WORK/lake" --contracts "$WORK/contracts" pull orders || die "ingot's re-pull failed"
GOT=$(sql "$WORK/lake" "SELECT status FROM audit.ingestion_run_log ORDER BY started_at DESC LIMIT 1")
[ "$GOT" = "skipped_duplicate_file" ] || die "the re-pull is '$GOT', expected skipped_duplicate_file"
PARQUET=$(find "$WORK/lake/bronze/orders" -name '*.parquet' | wc -l)
[ "$PARQUET" = 1 ] || die "the re-pull wrote Parquet: $PARQUET bronze files"

step "dlt rest_api: the same pages to Parquet (filesystem destination, append)"
measure dlt_pull "$VENV/bin/python" bench/dlt_pull.py --base-url "http://127.0.0.1:$PORT/v2" --out "$WORK/dlt" \
  --token bench-token --page-size "$PAGE" || die "dlt failed"
DLT_ROWS=$(sed -n 's/.*"rows_in_files": \([0-9]*\).*/\1/p' "$WORK/measure/dlt_pull.log" | tail -n 1)
[ "$DLT_ROWS" = "$RECORDS" ] || die "dlt loaded $DLT_ROWS rows, expected $RECORDS"

kill $SERVER 2>/dev/null || true
wait $SERVER 2>/dev/null || true
trap - EXIT
DLT_VERSION=$("$VENV/bin/python" -c 'import dlt; print(dlt.__version__)')
"$PYB" - "$WORK/measure" "$RECORDS" "$DLT_VERSION" "$(git rev-parse --short HEAD)" "$ROOT/bench/results-pull.md" <<'PY'
import json, sys, datetime, os
d, n, dv, commit, out = sys.argv[1:6]
m = {k: json.load(open(f"{d}/{k}.json")) for k in ("ingot_pull", "ingot_repull", "dlt_pull")}
w = {k: v["wall_s"] for k, v in m.items()}
p = {k: v.get("peak_rss_mb", 0) for k, v in m.items()}
load = open("/proc/loadavg").read().split()[:3]
text = f"""# API pull: ingot beside dlt (one run)

{int(n):,} records in {int(n) // 1000:,} pages of 1,000 from scripts/api_server.py on loopback (cursor
pagination, bearer token), measured {datetime.datetime.utcnow():%Y-%m-%dT%H:%MZ} at commit {commit}
on {os.cpu_count()} cores (load average {' '.join(load)} after).

| job | wall s | peak MB |
|---|---:|---:|
| ingot pull into a fresh lake (fetch, keep the raw records, hash, load to bronze Parquet) | {w['ingot_pull']:.2f} | {p['ingot_pull']:.0f} |
| ingot pull again, records unchanged (skipped: no Parquet written) | {w['ingot_repull']:.2f} | {p['ingot_repull']:.0f} |
| dlt {dv} rest_api to Parquet (filesystem destination, append) | {w['dlt_pull']:.2f} | {p['dlt_pull']:.0f} |

ingot / dlt: **{w['ingot_pull'] / w['dlt_pull']:.2f}x** (target <= 0.5x); the unchanged re-pull is
{w['ingot_repull'] / w['ingot_pull']:.2f}x of the first pull.
"""
open(out, "w").write(text)
print(text)
PY
