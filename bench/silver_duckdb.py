#!/usr/bin/env python3
"""DuckDB doing ingot's silver build of TPC-H lineitem, and the check of ingot's result (make bench).

    silver_duckdb.py build BRONZE_GLOB OUT_DIR
        The rules of bench/rules/lineitem/v1.yaml as one SQL query over ingot's bronze Parquet
        files: OUT_DIR/silver.parquet (the rows that pass, with anomaly_flags and is_anomaly) and
        OUT_DIR/rejected.parquet (the rows a validation rejected, with the rule, the reason and
        the row as JSON), zstd Parquet. Timed by make bench.

    silver_duckdb.py check LAKE BUILD_ID OUT_DIR BRONZE_GLOB [--lineage]
        Compare ingot's snapshot (the files LAKE/silver/lineitem/build_id=BUILD_ID/manifest.json
        names) with DuckDB's
        OUT_DIR/silver.parquet: the same row count, the same set of natural_key_fingerprint, the
        same anomaly_flags for every fingerprint, the same disc_price, charge and l_shipmode;
        with --lineage also the same row_hash and ingestion_run_id. The build log's counts
        (rows filtered, rejected, flagged) must agree with DuckDB's. Prints the first
        differences and exits 1 on any. Not timed.

BRONZE_GLOB must select exactly the current rows of bronze.lineitem: make bench gives the files
of a lake that has had one ingest only, so every row is current and no `_current`
deduplication is needed (ingot's build does that work; DuckDB is spared it).

The semantics are those of docs/guide.md#rules, written out in SQL:

* steps in order: set disc_price, set charge, map l_shipmode, cast charge to DECIMAL(15,2),
  drop l_comment, filter disc_price >= 1000 (rows for which the filter is not true are removed);
* validations on the rows that remain, the first one whose check is not true (false or NULL)
  rejects the row;
* anomalies over the rows that pass: `when` fires when its expression is true; `spike` fires
  when the row participates (l_partkey, l_shipdate and l_quantity non-null; participation is
  part of the window partition so non-participating rows are never history), has at least
  min_history = 7 earlier rows in its group (row_number() > 7), the sum s of the up to 28 rows
  just before it (ROWS BETWEEN 28 PRECEDING AND 1 PRECEDING, n rows) is > 0 and
  l_quantity * n > 3 * s (value > factor x mean, exact decimal arithmetic, no division); rows
  ordered by l_shipdate, ties by natural_key_fingerprint.
"""
import json
import os
import sys

import duckdb

# Keep in step with bench/rules/lineitem/v1.yaml.
SHIPMODE = {"AIR": "air", "FOB": "fob", "MAIL": "mail", "RAIL": "rail", "REG AIR": "reg_air",
            "SHIP": "ship", "TRUCK": "truck"}
VALIDATIONS = [  # (name, check, reason), in file order
    ("quantity_positive", "l_quantity > 0", "quantity must be positive"),
    ("received_after_shipping", "l_receiptdate >= l_shipdate", "received before it was shipped"),
]
SPIKE = dict(column="l_quantity", by=["l_partkey"], order="l_shipdate", window=28, factor=3, min_history=7)
# Bronze bookkeeping columns silver does not keep (it keeps fingerprint, row_hash, run id).
BOOKKEEPING = ["file_hash", "natural_key_version", "contract_version", "source_row_number", "ingested_at"]
SILVER_TAIL = ["natural_key_fingerprint", "row_hash", "ingestion_run_id"]
# The columns after the steps, in order (bookkeeping and lineage columns left out).
PAYLOAD = ["l_orderkey", "l_partkey", "l_suppkey", "l_linenumber", "l_quantity", "l_extendedprice", "l_discount",
           "l_tax", "l_returnflag", "l_linestatus", "l_shipdate", "l_commitdate", "l_receiptdate",
           "l_shipinstruct", "l_shipmode", "disc_price", "charge"]


def sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def stepped(bronze_glob: str) -> str:
    """The rows after the steps and the validation rule each breaks first (NULL: none)."""
    shipmode = " ".join(f"WHEN {sql_str(k)} THEN {sql_str(v)}" for k, v in SHIPMODE.items())
    rule = " ".join(f"WHEN ({check}) IS NOT TRUE THEN {sql_str(name)}" for name, check, _ in VALIDATIONS)
    return f"""
    b AS (SELECT * FROM read_parquet({sql_str(bronze_glob)}, hive_partitioning = false)),
    s1 AS (SELECT *, l_extendedprice * (1 - l_discount) AS disc_price FROM b),
    s2 AS (SELECT *, disc_price * (1 + l_tax) AS charge FROM s1),
    s3 AS (SELECT * REPLACE (CASE l_shipmode {shipmode} ELSE l_shipmode END AS l_shipmode) FROM s2),
    s4 AS (SELECT * REPLACE (CAST(charge AS DECIMAL(15,2)) AS charge) FROM s3),
    s5 AS (SELECT * EXCLUDE (l_comment) FROM s4),
    s6 AS (SELECT * FROM s5 WHERE disc_price >= 1000),
    v AS (SELECT *, CASE {rule} END AS __rule FROM s6)"""


def silver_query(bronze_glob: str) -> str:
    sp = SPIKE
    part = " AND ".join(f"{c} IS NOT NULL" for c in sp["by"] + [sp["order"], sp["column"]])
    win = (f"PARTITION BY {', '.join(sp['by'])}, ({part}) "
           f"ORDER BY {sp['order']} ASC NULLS FIRST, natural_key_fingerprint ASC NULLS FIRST")
    frame = f"ROWS BETWEEN {sp['window']} PRECEDING AND 1 PRECEDING"
    col = sp["column"]
    empty = "CAST([] AS VARCHAR[])"
    return f"""
    WITH {stepped(bronze_glob)},
    passed AS (SELECT * EXCLUDE (__rule, {', '.join(BOOKKEEPING)}) FROM v WHERE __rule IS NULL),
    w AS (
      SELECT *,
        ({part}) AS __p,
        row_number() OVER (win) AS __rn,
        count({col}) OVER (win {frame}) AS __n,
        sum({col}) OVER (win {frame}) AS __s
      FROM passed
      WINDOW win AS ({win})
    ),
    f AS (
      SELECT * EXCLUDE (__p, __rn, __n, __s),
        coalesce(charge > 100000, false) AS __a0,
        coalesce(__p AND __rn > {sp['min_history']} AND __s > 0 AND {col} * __n > {sp['factor']} * __s, false) AS __a1
      FROM w
    )
    SELECT * EXCLUDE (__a0, __a1, {', '.join(SILVER_TAIL)}),
      CAST(1 AS INTEGER) AS rules_version,
      list_concat(CASE WHEN __a0 THEN ['large_line'] ELSE {empty} END,
                  CASE WHEN __a1 THEN ['quantity_spike'] ELSE {empty} END) AS anomaly_flags,
      __a0 OR __a1 AS is_anomaly,
      {', '.join(SILVER_TAIL)}
    FROM f"""


def rejected_query(bronze_glob: str) -> str:
    reason = " ".join(f"WHEN {sql_str(n)} THEN {sql_str(r)}" for n, _, r in VALIDATIONS)
    # raw_payload: the columns after the steps as JSON (no bronze bookkeeping or lineage).
    payload = ", ".join(f"{sql_str(c)}: {c}" for c in PAYLOAD)
    return f"""
    WITH {stepped(bronze_glob)}
    SELECT natural_key_fingerprint, source_row_number, __rule AS rule, CASE __rule {reason} END AS reason,
      to_json({{{payload}}}) AS raw_payload
    FROM v WHERE __rule IS NOT NULL"""


def build(bronze_glob: str, out_dir: str) -> int:
    os.makedirs(out_dir, exist_ok=True)
    con = duckdb.connect()
    silver = os.path.join(out_dir, "silver.parquet")
    rejected = os.path.join(out_dir, "rejected.parquet")
    n = con.execute(f"COPY ({silver_query(bronze_glob)}) TO {sql_str(silver)} (FORMAT parquet, COMPRESSION zstd)").fetchone()[0]
    r = con.execute(f"COPY ({rejected_query(bronze_glob)}) TO {sql_str(rejected)} (FORMAT parquet, COMPRESSION zstd)").fetchone()[0]
    print(f"duckdb silver: {n} rows -> {silver}; {r} rejected -> {rejected}")
    return 0


def snapshot_relation(lake: str, build_id: str) -> str:
    """The build's snapshot as a DuckDB query: the files its manifest.json names (a bare name is
    in the build's folder, a path is relative to the lake), else its part files. After delta
    builds the manifest has layers: each layer's rows without the keys (16-byte prefixes of
    natural_key_fingerprint) that a later layer's deletion file names."""
    folder = f"{lake}/silver/lineitem/build_id={build_id}"
    try:
        with open(os.path.join(folder, "manifest.json")) as f:
            m = json.load(f)
    except FileNotFoundError:
        return f"SELECT * FROM read_parquet({sql_str(folder + '/part-*.parquet')}, hive_partitioning = false)"

    def path(n: str) -> str:
        return os.path.join(lake, n) if "/" in n else os.path.join(folder, n)

    def files(names) -> str:
        return "[" + ", ".join(sql_str(path(n)) for n in names) + "]"

    layers = [m["data"]] + [d["data"] for d in m.get("deltas", [])]
    # a layer that deleted no keys has no deletion file
    deleted = [path(d["deleted"]) if d.get("deleted_keys", 1) else None for d in m.get("deltas", [])]
    parts = []
    for i, names in enumerate(layers):
        if not names:
            continue
        q = f"SELECT * FROM read_parquet({files(names)}, hive_partitioning = false)"
        later = [p for p in deleted[i:] if p]
        if later:
            keys = "[" + ", ".join(sql_str(p) for p in later) + "]"
            q += (f" WHERE substr(natural_key_fingerprint, 1, 32) NOT IN "
                  f"(SELECT lower(hex(natural_key_fingerprint)) FROM read_parquet({keys}))")
        parts.append(q)
    return " UNION ALL ".join(parts)


def check(lake: str, build_id: str, out_dir: str, bronze_glob: str, lineage: bool) -> int:
    con = duckdb.connect()
    ok = True

    def verdict(what: str, got, want) -> None:
        nonlocal ok
        good = got == want
        ok &= good
        print(f"silver check: {'ok  ' if good else 'FAIL'} {what}: {got}" + ("" if good else f" (expected {want})"))

    con.execute(f"CREATE VIEW ingot AS {snapshot_relation(lake, build_id)}")
    con.execute(f"CREATE VIEW ddb AS SELECT * FROM read_parquet({sql_str(os.path.join(out_dir, 'silver.parquet'))})")
    con.execute(f"CREATE VIEW ddb_rej AS SELECT * FROM read_parquet({sql_str(os.path.join(out_dir, 'rejected.parquet'))})")
    q = lambda sql: con.execute(sql).fetchone()  # noqa: E731

    n_ingot, n_ddb = q("SELECT count(*) FROM ingot")[0], q("SELECT count(*) FROM ddb")[0]
    verdict("rows: ingot silver.lineitem vs duckdb", n_ingot, n_ddb)
    verdict("distinct fingerprints in ingot's silver", q("SELECT count(DISTINCT natural_key_fingerprint) FROM ingot")[0], n_ingot)

    # The build log of that build against DuckDB's counts.
    log = con.execute(
        f"SELECT rows_read, rows_written, rows_filtered, rows_rejected, rows_flagged, mode "
        f"FROM read_parquet({sql_str(lake + '/audit/silver_build_log/lineitem/*.parquet')}) "
        f"WHERE build_id = {sql_str(build_id)}"
    ).fetchall()
    if len(log) != 1:
        verdict("build log records of the build", len(log), 1)
    else:
        read, written, filtered, rejected, flagged, mode = log[0]
        total = q(f"SELECT count(*) FROM read_parquet({sql_str(bronze_glob)}, hive_partitioning = false)")[0]
        ddb_rej = q("SELECT count(*) FROM ddb_rej")[0]
        ddb_filtered = total - n_ddb - ddb_rej
        verdict("build log rows_flagged vs duckdb's flagged rows", flagged, q("SELECT count(*) FROM ddb WHERE is_anomaly")[0])
        if mode == "full":
            verdict("build log rows_written (full build)", written, n_ddb)
            verdict("build log rows_filtered (full build)", filtered, ddb_filtered)
            verdict("build log rows_rejected (full build)", rejected, ddb_rej)
        else:
            print(f"silver check: info {mode} build processed {read} records: {written} written, "
                  f"{filtered} filtered, {rejected} rejected (duckdb, full: {ddb_filtered} filtered, {ddb_rej} rejected)")

    cols = ["anomaly_flags", "disc_price", "charge", "l_shipmode"] + (["row_hash", "ingestion_run_id"] if lineage else [])
    diff = " OR ".join(f"i.{c} IS DISTINCT FROM d.{c}" for c in cols)
    counts = q(f"""
        SELECT count(*) FILTER (WHERE i.natural_key_fingerprint IS NULL),
               count(*) FILTER (WHERE d.natural_key_fingerprint IS NULL),
               {', '.join(f"count(*) FILTER (WHERE i.natural_key_fingerprint IS NOT NULL AND d.natural_key_fingerprint IS NOT NULL AND i.{c} IS DISTINCT FROM d.{c})" for c in cols)}
        FROM ingot i FULL OUTER JOIN ddb d USING (natural_key_fingerprint)""")
    verdict("fingerprints only in duckdb's silver", counts[0], 0)
    verdict("fingerprints only in ingot's silver", counts[1], 0)
    for c, n in zip(cols, counts[2:]):
        verdict(f"{c} differences", n, 0)
    for name in ("large_line", "quantity_spike"):
        a = q(f"SELECT count(*) FROM ingot WHERE list_contains(anomaly_flags, '{name}')")[0]
        b = q(f"SELECT count(*) FROM ddb WHERE list_contains(anomaly_flags, '{name}')")[0]
        verdict(f"rows flagged {name} (ingot; duckdb {b})", a, b)
    if not ok:
        rows = con.execute(f"""
            SELECT natural_key_fingerprint, i.l_orderkey, i.l_linenumber, d.l_orderkey, d.l_linenumber,
                   {', '.join(f'i.{c}, d.{c}' for c in cols)}
            FROM ingot i FULL OUTER JOIN ddb d USING (natural_key_fingerprint)
            WHERE i.natural_key_fingerprint IS NULL OR d.natural_key_fingerprint IS NULL OR {diff}
            ORDER BY natural_key_fingerprint LIMIT 10""").fetchall()
        head = ["fingerprint", "ingot key", "", "duckdb key", ""] + [f"{s} {c}" for c in cols for s in ("ingot", "duckdb")]
        print("silver check: first differences (" + ", ".join(head) + "):")
        for r in rows:
            print("  " + " | ".join(str(x) for x in r))
    print("silver check: " + ("ingot and duckdb agree" if ok else "MISMATCH: ingot and DuckDB disagree"))
    return 0 if ok else 1


def main() -> int:
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "build":
        return build(args[1], args[2])
    if len(args) in (5, 6) and args[0] == "check" and (len(args) == 5 or args[5] == "--lineage"):
        return check(args[1], args[2], args[3], args[4], len(args) == 6)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
