#!/usr/bin/env bash
# The whole story on the bundled hotel-marketing data, run by run: bronze, silver, and an
# incident (undo, replay, doctor, gc), a vendor API pulled from a local server, and two booking
# sources in one table with a conflict decided. Called by `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
INGOT="${INGOT:-ingot}"
LAKE="${INGOT_LAKE:-data/lake}"
export INGOT_LAKE="$LAKE"
rm -rf "$LAKE"

# scratch folders and the demo's vendor API server go when the demo ends, however it ends
SCRATCH=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$SCRATCH" "${FIXED:-}"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ ingot %s\n' "$*"; "$INGOT" "$@"; }

say "0. Contracts first: every source has contracts/<source>.yaml; check them all at once"
run check

say "1. Day one: the hotel master data and the first bookings export"
run ingest hotels data/landing/hotels/2026-11-01_hotels.csv
run ingest bookings data/landing/bookings/2026-11-01_bookings.csv
echo "   -> 8 rows were rejected (bad types, a missing booking_ref, a negative amount, a bad"
echo "      currency, an unknown status, and two records that share one natural key with"
echo "      different contents). The other rows loaded; nothing was silently dropped:"
run failures --source bookings

say "2. The PMS re-sends yesterday's file byte for byte: skipped by file_hash, nothing read twice"
run ingest bookings data/landing/bookings/2026-11-02_bookings_resend.csv

say "3. A new export with a UTF-8 BOM, CRLF line ends and a note with a line break in it"
run ingest bookings data/landing/bookings/2026-11-03_bookings.csv

say "4. The vendor re-delivers day one with 3 corrections (and a new exported_at on every row,"
say "   and e-mails re-typed in other case): only the corrected and fixed rows are written"
run ingest bookings data/landing/bookings/2026-11-04_bookings_corrected.csv

say "5. Hotels again: one hotel got a new surrogate id, one was renamed, one is new"
run ingest hotels data/landing/hotels/2026-11-03_hotels.csv

say "6. Marketing spend (one file gzipped), web sessions (NDJSON; an extra key is ignored), site traffic"
echo "   (site_traffic is the analytics tool's daily count per hotel: four weeks of history, then weekly)"
run ingest marketing_spend 'data/landing/marketing_spend/*'
run ingest web_sessions 'data/landing/web_sessions/*.ndjson'
run ingest site_traffic 'data/landing/site_traffic/*'

say "7. The audit trail: every run, with counts that always reconcile"
run runs

say "8. Analysts query it all with SQL"
run sql "SELECT booking_ref, hotel_code, amount, booking_status, ingestion_run_id FROM bronze.bookings WHERE natural_key_fingerprint IN (SELECT natural_key_fingerprint FROM bronze.bookings GROUP BY 1 HAVING count(*) > 1) ORDER BY booking_ref, ingested_at"
run sql "SELECT source, count(*) AS versions, count(DISTINCT natural_key_fingerprint) AS records FROM (SELECT 'bookings' AS source, natural_key_fingerprint FROM bronze.bookings UNION ALL SELECT 'hotels', natural_key_fingerprint FROM bronze.hotels UNION ALL SELECT 'marketing_spend', natural_key_fingerprint FROM bronze.marketing_spend UNION ALL SELECT 'web_sessions', natural_key_fingerprint FROM bronze.web_sessions UNION ALL SELECT 'site_traffic', natural_key_fingerprint FROM bronze.site_traffic) GROUP BY source ORDER BY source"
run sql "SELECT rule, count(*) AS rows FROM audit.row_failure_log GROUP BY rule ORDER BY rows DESC, rule"
run sql "SELECT natural_key_fingerprint(1, normalize_text('  ann.smith@example.com ', 'trim,lower')) AS same_1, natural_key_fingerprint(1, normalize_text('Ann.Smith@Example.COM', 'trim,lower')) AS same_2"

say "9. Silver: bookings and marketing spend cleaned by versioned rules (rules/<table>/v<N>.yaml)"
echo "   Each build publishes one complete snapshot atomically and records itself in"
echo "   audit.silver_build_log; rows that fail a validation go to audit.row_failure_log (layer silver)."
run build bookings --rules-version 1
run build marketing_spend
run sql "SELECT channel, rules_version, count(*) AS bookings FROM silver.bookings GROUP BY 1, 2 ORDER BY 1"
echo "   -> v1 left the desk's \"bcom\" spelling alone. rules/bookings/v2.yaml maps it too; a rules"
echo "      version is immutable once used, so the fix is a new file. Rebuild only the v1 rows:"
run build bookings --rebuild-where "rules_version < 2"
run sql "SELECT channel, rules_version, count(*) AS bookings FROM silver.bookings GROUP BY 1, 2 ORDER BY 1"
echo "   -> A build with nothing new reads nothing and keeps every row (incremental):"
run build bookings
run sql "SELECT \"table\", rules_version, mode, status, rows_read, rows_written, rows_filtered, rows_rejected, rows_flagged FROM audit.silver_build_log ORDER BY started_at"
run sql "SELECT rule, reason, rules_version, raw_payload FROM audit.row_failure_log WHERE layer = 'silver' ORDER BY rule"

say "10. Flagged, not dropped: a refund (negative spend) and hotels reporting for the first time in a year"
run sql "SELECT hotel_code, day, channel, campaign, spend_eur, anomaly_flags FROM silver.marketing_spend WHERE is_anomaly ORDER BY hotel_code, day"

say "11. A day with ten times the usual sessions: AMS01's website on 2026-10-30"
echo "   Rules clean one row at a time, so a day's session count is flagged where it is a column:"
echo "   silver.site_traffic (sessions_spike: more than 10x the hotel's mean over its previous 28"
echo "   days). The sessions themselves are in silver.web_sessions, one row each."
run build site_traffic
run build web_sessions
run sql "SELECT hotel_code, day, sessions, pageviews, round(pages_per_session, 1) AS pages_per_session, anomaly_flags FROM silver.site_traffic WHERE hotel_code = 'AMS01' AND day BETWEEN DATE '2026-10-27' AND DATE '2026-11-01' ORDER BY day"
echo "   -> the build flagged 1 row of 210: that day. What made it, session by session:"
run sql "SELECT anomaly_flags, count(*) AS sessions, sum(pageviews) AS pageviews, round(avg(duration_s), 2) AS avg_duration_s FROM silver.web_sessions WHERE hotel_code = 'AMS01' AND day = DATE '2026-10-30' GROUP BY 1 ORDER BY 2 DESC"
echo "   -> 37 one-page visits of under a second on top of the usual 3: bot traffic."

say "12. What the rules compile to: ingot explain prints the steps and the DataFusion plan"
printf '$ ingot explain bookings | head -30\n'
"$INGOT" explain bookings | head -30 || true

say "13. An incident: the corrected re-delivery (step 4) turns out to be wrong. Undo that run"
CORRECTED=$("$INGOT" sql "SELECT run_id FROM audit.ingestion_run_log WHERE file_path LIKE '%corrected%'" --format csv | tail -n 1)
run undo "$CORRECTED"
echo "   -> its 4 new records are gone and its 3 corrections are back to day one's version; the"
echo "      next build follows (silver still has them until then, which doctor points out):"
run doctor || true
run build bookings
run doctor
run sql "SELECT status, count(*) AS runs FROM audit.ingestion_run_log GROUP BY 1 ORDER BY 1"

say "14. Rows rejected by a too-strict contract: allow booking_status 'tentative', replay day one"
FIXED=$(mktemp -d)
cp contracts/*.yaml "$FIXED/"
sed -i 's/allowed: \[confirmed, cancelled, no_show\]/allowed: [confirmed, cancelled, no_show, tentative]/' "$FIXED/bookings.yaml"
DAY_ONE=$("$INGOT" sql "SELECT run_id FROM audit.ingestion_run_log WHERE file_path LIKE '%11-01_bookings.csv' AND replay_of IS NULL" --format csv | tail -n 1)
printf '$ ingot --contracts <contracts with tentative allowed> replay %s\n' "$DAY_ONE"
"$INGOT" --contracts "$FIXED" replay "$DAY_ONE"
echo "   -> only the one tentative booking loaded (keeping its record number 151); the other 7 still"
echo "      fail, and a second replay with the same contract adds nothing:"
"$INGOT" --contracts "$FIXED" replay "$DAY_ONE"
run failures --run "$DAY_ONE" --format csv

say "15. Housekeeping: files no committed run reads any more (the undone run's), what gc would remove"
run gc --dry-run --grace 0s

say "16. Other engines: every layer is a Delta Lake table beside the files (docs/delta.md)"
run delta status
printf '$ ls %s/silver/bookings/_delta_log\n' "$LAKE"
ls "$LAKE/silver/bookings/_delta_log"
echo "   -> one Delta commit per build (and undo); DuckDB reads the same rows with"
echo "      SELECT * FROM delta_scan('$LAKE/silver/bookings'), Spark with"
echo "      spark.read.format(\"delta\").load(...), Python with deltalake.DeltaTable(...).scan()"

say "17. A vendor API: the booking engine's orders, pulled page by page (one pull = one run)"
echo "   scripts/api_server.py serves 2,000 orders in pages of 500 on loopback, behind a bearer"
echo "   token; examples/api/orders.yaml is the contract (format: api), its base_url pointed at the"
echo "   server's port (below, one folder holds it and contracts/). The token is read from"
echo "   DEMO_VENDOR_TOKEN and never printed or stored."
python3 scripts/api_server.py --port 0 --port-file "$SCRATCH/port" --records 2000 --page-size 500 \
  --token demo-token >/dev/null &
SERVER_PID=$!
for _ in $(seq 100); do [ -s "$SCRATCH/port" ] && break; sleep 0.1; done
[ -s "$SCRATCH/port" ] || { echo "the demo's API server did not start (scripts/api_server.py)" >&2; exit 1; }
PORT=$(cat "$SCRATCH/port")
mkdir -p "$SCRATCH/contracts"
cp contracts/*.yaml "$SCRATCH/contracts/"
sed "s#http://127.0.0.1:8765/v2#http://127.0.0.1:$PORT/v2#" examples/api/orders.yaml >"$SCRATCH/contracts/orders.yaml"
export DEMO_VENDOR_TOKEN=demo-token
api() { printf '$ ingot --contracts <contracts/ + examples/api> %s\n' "$*"; "$INGOT" --contracts "$SCRATCH/contracts" "$@"; }
vendor_revision() {
  python3 -c 'import sys, urllib.request as u; u.urlopen(u.Request(sys.argv[1], data=sys.argv[2].encode(), method="POST"))' \
    "http://127.0.0.1:$PORT/_control/revision" "{\"revision\": $1}"
}
api check
api pull orders
echo "   -> every page fetched, the records kept as one gzip NDJSON file beside the run's bronze file,"
echo "      then loaded as an NDJSON file would be. Pulled again, nothing changed (only fetched_at,"
echo "      which the contract marks volatile): a skipped run, no Parquet written"
api pull orders
echo "   -> the vendor corrects 3 orders; the next pull sends updated_since (the cursor the last"
echo "      loaded pull committed, minus the 1h lookback) and writes only the 3 updates"
vendor_revision 1
api pull orders
echo "   -> 2 new orders: the cursor moved to the corrected orders' updated_at, so this pull asks"
echo "      only for the last hour's changes; the overlap loads as unchanged"
vendor_revision 2
api pull orders
api sql "SELECT status, rows_seen, rows_inserted, rows_updated, rows_unchanged, pull_pages, pull_requests, pull_cursor FROM audit.ingestion_run_log WHERE source = 'orders' ORDER BY started_at"
api sql "SELECT order_id, order_status, amount, updated_at FROM bronze.orders WHERE natural_key_fingerprint IN (SELECT natural_key_fingerprint FROM bronze.orders GROUP BY 1 HAVING count(*) > 1) ORDER BY order_id, updated_at"
printf '$ ls %s/bronze/orders/run_id=*/\n' "$LAKE"
ls "$LAKE"/bronze/orders/run_id=*/
kill "$SERVER_PID" 2>/dev/null || true
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=

say "18. Two booking sources, one table: the partner channel manager reports the same bookings"
echo "   examples/partner/partner_bookings.yaml is the partner's contract (its own column names, the"
echo "   same natural key: hotel and booking_ref, so one booking has one fingerprint whichever source"
echo "   delivered it); examples/partner/rules/all_bookings/v1.yaml feeds silver.all_bookings from"
echo "   both: the booking engine first, the partner filling in; differing amounts, statuses or"
echo "   check-in dates are conflicts, logged and flagged, never silently overwritten."
cp examples/partner/partner_bookings.yaml "$SCRATCH/contracts/"
mkdir -p "$SCRATCH/rules"
cp -r rules/* examples/partner/rules/* "$SCRATCH/rules/"
two() { printf '$ ingot --contracts <contracts/ + examples> --rules <rules/ + examples/partner/rules> %s\n' "$*"; "$INGOT" --contracts "$SCRATCH/contracts" --rules "$SCRATCH/rules" "$@"; }
two check
two ingest partner_bookings data/partner/partner_bookings/2026-11-02_partner_bookings.csv
two build all_bookings
two sql "SELECT contributing_sources, count(*) AS bookings FROM silver.all_bookings GROUP BY 1 ORDER BY 1"
echo "   -> 21 bookings both sources have are one row each; one of them has two amounts:"
two sql "SELECT b.booking_ref, c.field, c.status, c.taken_source, c.candidates[1]['value'] AS engine, c.candidates[2]['value'] AS partner FROM audit.source_conflict_log c JOIN silver.all_bookings b USING (natural_key_fingerprint) WHERE c.status = 'open'"
FP=$("$INGOT" --contracts "$SCRATCH/contracts" --rules "$SCRATCH/rules" sql --format csv \
  "SELECT natural_key_fingerprint FROM audit.source_conflict_log WHERE status = 'open' AND field = 'amount'" | tail -n 1)
echo "   -> a person decides: the partner's amount (it includes the city tax)"
two resolve all_bookings "$FP" --field amount --take partner_bookings --reason "the partner's invoice includes the city tax" --by demo
two build all_bookings
two sql "SELECT booking_ref, amount, field_sources, conflict_fields, anomaly_flags FROM silver.all_bookings WHERE natural_key_fingerprint = '$FP'"
two sql "SELECT rules_version, mode, rows_read, conflicts_open, conflicts_decided, decisions_stale FROM audit.silver_build_log WHERE \"table\" = 'all_bookings' ORDER BY commit_seq"
echo "   -> the second build processed only that booking; the decision holds while both amounts"
echo "      stay as they are, and goes stale (the conflict opens again) when either changes"

say "Done. The lake is in $LAKE; try: $INGOT sql \"SELECT * FROM bronze.bookings_current LIMIT 5\""
