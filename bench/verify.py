#!/usr/bin/env python3
"""Check that ingot and DuckDB produced the same hashes (make bench, step e). Not timed.

    verify.py LAKE RUN_FIRST RUN_REDELIVERY DUCKDB_OUT.parquet REDELIVERED.csv CHANGES.json ROWS

1. ingot's bronze files of the first run (LAKE/bronze/lineitem/run_id=RUN_FIRST/*.parquet) and
   DuckDB's output joined on (l_orderkey, l_linenumber): both have ROWS rows, every key once,
   and 0 differences of row_hash and natural_key_fingerprint (full outer join: a key missing on
   one side counts as a difference); the file_hash ingot stamped on every row is the SHA-256
   DuckDB's job computed of the same file (DUCKDB_OUT.parquet is the output of
   `duckdb_job.py bronze`).
2. The re-delivery run wrote exactly the 3 changed keys, with the row_hash DuckDB computes from
   the re-delivered CSV (and different from the first version's), the same fingerprint.
Exits 1 on any difference.
"""
import json
import os
import sys

import duckdb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from duckdb_job import hash_select, sql_str  # noqa: E402


def main() -> int:
    if len(sys.argv) != 8:
        print(__doc__, file=sys.stderr)
        return 2
    lake, run_a, run_c, ddb_out, redelivered, changes_path, rows = sys.argv[1:]
    rows = int(rows)
    changes = json.load(open(changes_path))["changed"]
    con = duckdb.connect()
    ok = True

    def check(what: str, got, want) -> None:
        nonlocal ok
        good = got == want
        ok &= good
        print(f"verify: {'ok  ' if good else 'FAIL'} {what}: {got}" + ("" if good else f" (expected {want})"))

    def files(run: str) -> str:
        return f"read_parquet({sql_str(f'{lake}/bronze/lineitem/run_id={run}/*.parquet')}, hive_partitioning = false)"

    con.execute(f"CREATE VIEW ingot AS SELECT * FROM {files(run_a)}")
    con.execute(f"CREATE VIEW ddb AS SELECT * FROM read_parquet({sql_str(ddb_out)})")
    q = lambda sql: con.execute(sql).fetchone()  # noqa: E731

    check("ingot first-run rows", q("SELECT count(*) FROM ingot")[0], rows)
    check("duckdb rows", q("SELECT count(*) FROM ddb")[0], rows)
    check("ingot distinct keys", q("SELECT count(DISTINCT (l_orderkey, l_linenumber)) FROM ingot")[0], rows)
    missing_ingot, missing_ddb, bad_row, bad_fp, both = q(
        """
        SELECT count(*) FILTER (WHERE i.l_orderkey IS NULL),
               count(*) FILTER (WHERE d.l_orderkey IS NULL),
               count(*) FILTER (WHERE i.row_hash IS DISTINCT FROM d.row_hash),
               count(*) FILTER (WHERE i.natural_key_fingerprint IS DISTINCT FROM d.natural_key_fingerprint),
               count(*) FILTER (WHERE i.row_hash = d.row_hash
                                  AND i.natural_key_fingerprint = d.natural_key_fingerprint)
        FROM (SELECT l_orderkey, l_linenumber, row_hash, natural_key_fingerprint FROM ingot) i
        FULL OUTER JOIN (SELECT l_orderkey, l_linenumber, row_hash, natural_key_fingerprint FROM ddb) d
          USING (l_orderkey, l_linenumber)
        """
    )
    check("keys only in duckdb's output", missing_ingot, 0)
    check("keys only in ingot's bronze", missing_ddb, 0)
    check("row_hash mismatches", bad_row, 0)
    check("natural_key_fingerprint mismatches", bad_fp, 0)
    check("rows with both hashes equal", both, rows)
    check(
        "distinct file_hash values (ingot, duckdb) and whether they are equal",
        q("""SELECT (SELECT count(DISTINCT file_hash) FROM ingot), (SELECT count(DISTINCT file_hash) FROM ddb),
                    (SELECT min(file_hash) FROM ingot) = (SELECT min(file_hash) FROM ddb)"""),
        (1, 1, True),
    )

    # The re-delivery: exactly the changed keys, with the hash of the new text.
    keys = ", ".join(f"({c['l_orderkey']}, {c['l_linenumber']})" for c in changes)
    con.execute(f"CREATE VIEW ingot_c AS SELECT * FROM {files(run_c)}")
    con.execute(
        f"CREATE TABLE ddb_c AS SELECT l_orderkey, l_linenumber, row_hash, natural_key_fingerprint "
        f"FROM ({hash_select(redelivered)}) WHERE (l_orderkey, l_linenumber) IN ({keys})"
    )
    check("re-delivery run rows", q("SELECT count(*) FROM ingot_c")[0], 3)
    check(
        "re-delivery rows that are the changed keys with duckdb's hashes of the new text",
        q("""SELECT count(*) FROM ingot_c c JOIN ddb_c d USING (l_orderkey, l_linenumber)
             WHERE c.row_hash = d.row_hash AND c.natural_key_fingerprint = d.natural_key_fingerprint""")[0],
        3,
    )
    check(
        "re-delivery rows whose row_hash differs from the first version's",
        q("""SELECT count(*) FROM ingot_c c JOIN ingot a USING (l_orderkey, l_linenumber)
             WHERE c.row_hash <> a.row_hash AND c.natural_key_fingerprint = a.natural_key_fingerprint""")[0],
        3,
    )
    print("verify: " + ("hashes agree" if ok else "MISMATCH: ingot and DuckDB disagree"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
