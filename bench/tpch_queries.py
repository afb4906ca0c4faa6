#!/usr/bin/env python3
"""TPC-H Q1 and Q6 over silver.lineitem for `make bench`: DuckDB's side, and the comparison.

    tpch_queries.py duckdb LAKE BUILD_ID QUERY.sql OUT.csv RUNS
        DuckDB runs the query RUNS times over the build's snapshot files (the Parquet files
        silver.lineitem reads, without the rows later delta layers deleted), writes the result as CSV and prints "best SECONDS" (the fastest
        run: execute and fetch every row, timed inside the process, like `ingot sql`'s \\timing).
    tpch_queries.py delta TABLE QUERY.sql OUT.csv RUNS
        The same through DuckDB's delta_scan over the Delta table TABLE (silver/lineitem of the
        lake), with DuckDB 1.4.4 and the duckdb-ext-delta package (run by the venv that has them).
    tpch_queries.py same A.csv B.csv
        Exit 0 when both CSV results have the same rows: text equal, numbers equal up to the
        precision of the less precise one (DuckDB's avg() is a double, DataFusion's a
        decimal(19,6), cut to 6 fraction digits).
"""
import csv
import math
import sys
import time

from silver_duckdb import snapshot_relation


def timed(con, query_file: str, out_csv: str, runs: int) -> int:
    """Run the query of `query_file` on `con` `runs` times; print the best time, write the rows."""
    query = open(query_file).read()
    best, rows, names = math.inf, None, None
    for _ in range(runs):
        t0 = time.perf_counter()
        cur = con.execute(query)
        rows = cur.fetchall()
        best = min(best, time.perf_counter() - t0)
        names = [d[0] for d in cur.description]
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        w.writerows(rows)
    print(f"best {best:.4f}")
    return 0


def duckdb_run(lake: str, build_id: str, query_file: str, out_csv: str, runs: int) -> int:
    import duckdb

    con = duckdb.connect()
    con.execute(f"CREATE VIEW lineitem AS {snapshot_relation(lake, build_id)}")
    return timed(con, query_file, out_csv, runs)


def delta_run(table: str, query_file: str, out_csv: str, runs: int) -> int:
    """The query over the Delta table `table` (silver/lineitem) through DuckDB's delta_scan (the
    PyPI package duckdb-ext-delta, loaded offline)."""
    import glob
    import os

    import duckdb

    ext = glob.glob(os.path.join(os.path.dirname(duckdb.__file__), "..", "duckdb_ext", "extensions",
                                 "v" + duckdb.__version__, "*", "delta.duckdb_extension"))
    if not ext:
        print("duckdb-ext-delta is not installed", file=sys.stderr)
        return 2
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.execute(f"LOAD '{os.path.realpath(ext[0])}'")
    con.execute(f"CREATE VIEW lineitem AS SELECT * FROM delta_scan('{table}')")
    return timed(con, query_file, out_csv, runs)


def same(a: str, b: str) -> int:
    ra, rb = list(csv.reader(open(a))), list(csv.reader(open(b)))
    if len(ra) != len(rb) or len(ra) < 2:
        print(f"different row counts: {len(ra) - 1} vs {len(rb) - 1}", file=sys.stderr)
        return 1
    for i, (x, y) in enumerate(zip(ra[1:], rb[1:]), start=1):
        for j, (u, v) in enumerate(zip(x, y)):
            if u == v:
                continue
            try:
                fu, fv = float(u), float(v)
            except ValueError:
                print(f"row {i} column {ra[0][j]}: {u!r} vs {v!r}", file=sys.stderr)
                return 1
            digits = min(len(t.partition(".")[2]) if "." in t and "e" not in t.lower() else 15 for t in (u, v))
            if not math.isclose(fu, fv, rel_tol=1e-12, abs_tol=10.0 ** -digits + 1e-12):
                print(f"row {i} column {ra[0][j]}: {u} vs {v}", file=sys.stderr)
                return 1
    print(f"same: {len(ra) - 1} rows")
    return 0


def main() -> int:
    a = sys.argv[1:]
    if a[:1] == ["duckdb"] and len(a) == 6:
        return duckdb_run(a[1], a[2], a[3], a[4], int(a[5]))
    if a[:1] == ["delta"] and len(a) == 5:
        return delta_run(a[1], a[2], a[3], int(a[4]))
    if a[:1] == ["same"] and len(a) == 3:
        return same(a[1], a[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
