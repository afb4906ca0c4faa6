#!/usr/bin/env bash
# The bronze story on the bundled hotel-marketing data, run by run. Called by `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
INGOT="${INGOT:-ingot}"
LAKE="${INGOT_LAKE:-data/lake}"
export INGOT_LAKE="$LAKE"
rm -rf "$LAKE"

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

say "6. Marketing spend (one delivery gzipped) and web sessions (NDJSON with an extra key, ignored)"
run ingest marketing_spend 'data/landing/marketing_spend/*'
run ingest web_sessions 'data/landing/web_sessions/*.ndjson'

say "7. The audit trail: every run, with counts that always reconcile"
run runs

say "8. Analysts query it all with SQL"
run sql "SELECT booking_ref, hotel_code, amount, booking_status, ingestion_run_id FROM bronze.bookings WHERE natural_key_fingerprint IN (SELECT natural_key_fingerprint FROM bronze.bookings GROUP BY 1 HAVING count(*) > 1) ORDER BY booking_ref, ingested_at"
run sql "SELECT source, count(*) AS versions, count(DISTINCT natural_key_fingerprint) AS records FROM (SELECT 'bookings' AS source, natural_key_fingerprint FROM bronze.bookings UNION ALL SELECT 'hotels', natural_key_fingerprint FROM bronze.hotels UNION ALL SELECT 'marketing_spend', natural_key_fingerprint FROM bronze.marketing_spend UNION ALL SELECT 'web_sessions', natural_key_fingerprint FROM bronze.web_sessions) GROUP BY source ORDER BY source"
run sql "SELECT rule, count(*) AS rows FROM audit.row_failure_log GROUP BY rule ORDER BY rows DESC, rule"
run sql "SELECT natural_key_fingerprint(1, normalize_text('  ann.smith@example.com ', 'trim,lower')) AS same_1, natural_key_fingerprint(1, normalize_text('Ann.Smith@Example.COM', 'trim,lower')) AS same_2"

say "Done. The lake is in $LAKE; try: $INGOT sql \"SELECT * FROM bronze.bookings_current LIMIT 5\""
