#!/usr/bin/env python3
"""DuckDB doing ingot's bronze job on TPC-H lineitem, for `make bench`.

    duckdb_job.py bronze CSV OUT.parquet  ingot's bronze job: hash the file, then the typed read with
                                          row_hash, natural_key_fingerprint and the run's columns
    duckdb_job.py hash   CSV OUT.parquet  typed read + row_hash + natural_key_fingerprint only (reference)
    duckdb_job.py copy   CSV OUT.parquet  the same typed read straight to zstd Parquet (reference)
    duckdb_job.py current GLOB OUT.parquet  the current versions of the bronze files GLOB (the
                                          latest row per natural_key_fingerprint by ingested_at,
                                          tombstones left out): bronze.<source>_current, exported
    duckdb_job.py delta TABLE OUT.parquet   the Delta table TABLE read whole with delta_scan
                                          (bronze/<source>/_current: the same rows, no ranking;
                                          needs duckdb-ext-delta, the venv .venv-bench-delta)

`bronze` is the job an ingot first ingest does, as a pipeline around DuckDB would do it: the
SHA-256 of the whole file first (hashlib, 1 MiB reads: the `file_hash` that makes a re-sent file
a no-op), then one COPY writing every contract column and the bronze columns ingot writes:
ingestion_run_id (a UUID), file_hash, row_hash, natural_key_fingerprint, natural_key_version and
contract_version (1), ingested_at (the start time, UTC), is_deleted (false) and
previous_natural_key_fingerprint (NULL). One bronze column is left out: source_row_number (the
line's record number). DuckDB's only way to number the records of a parallel CSV read,
`row_number() OVER ()`, made the same job take about twice as long (52 s against 24.5 s at
SF1), which would measure DuckDB's window operator rather than the job.

The hashes are the formulas of docs/formats.md#hashes, written in plain SQL:

* natural_key_fingerprint = sha256('1|' || v1 || '|' || v2), vi = canonical text, NULL -> ''
* row_hash = sha256('1|' || e1 || '|' || ... || e16) over all 16 contract fields in contract
  order, ei = '\\N' for NULL, else the canonical text with '\\' -> '\\\\' then '|' -> '\\|'.

Canonical text in DuckDB: BIGINT/INTEGER::VARCHAR is plain decimal, DECIMAL(15,2)::VARCHAR has
exactly 2 fraction digits, DATE::VARCHAR is YYYY-MM-DD, strings are as read (the contract has no
normalize steps). The escaping is applied to the string fields only: the canonical text of an
integer, decimal or date can contain neither '\\' nor '|', so there it is the identity and
DuckDB is not made to do useless work (about 3 s of its ~15 s at SF1 on 2 cores). Set
BENCH_DUCKDB_ESCAPE_ALL=1 to escape every field literally instead; the hashes are the same.
(DuckDB string literals do not interpret backslashes: '\\' in SQL below is one backslash.)
"""
import glob
import hashlib
import os
import sys
import uuid
from datetime import datetime, timezone

import duckdb

# (name, DuckDB type) in contract order: bench/contracts/lineitem.yaml
FIELDS = [
    ("l_orderkey", "BIGINT"),
    ("l_partkey", "BIGINT"),
    ("l_suppkey", "BIGINT"),
    ("l_linenumber", "INTEGER"),
    ("l_quantity", "DECIMAL(15,2)"),
    ("l_extendedprice", "DECIMAL(15,2)"),
    ("l_discount", "DECIMAL(15,2)"),
    ("l_tax", "DECIMAL(15,2)"),
    ("l_returnflag", "VARCHAR"),
    ("l_linestatus", "VARCHAR"),
    ("l_shipdate", "DATE"),
    ("l_commitdate", "DATE"),
    ("l_receiptdate", "DATE"),
    ("l_shipinstruct", "VARCHAR"),
    ("l_shipmode", "VARCHAR"),
    ("l_comment", "VARCHAR"),
]
NATURAL_KEY = ["l_orderkey", "l_linenumber"]


def sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def typed_read(csv: str) -> str:
    cols = ", ".join(f"{sql_str(n)}: {sql_str(t)}" for n, t in FIELDS)
    # The dialect of `tpchgen-cli csv`, as declared in the contract: header line, ',' delimiter,
    # '"' quote (doubled to escape), empty field = NULL. No sniffing: explicit types.
    return (
        f"read_csv({sql_str(csv)}, header = true, delim = ',', quote = '\"', escape = '\"', "
        f"nullstr = '', auto_detect = false, columns = {{{cols}}})"
    )


def hash_select(csv: str) -> str:
    def elem(name: str, typ: str) -> str:
        text = f"{name}::VARCHAR"
        if typ == "VARCHAR" or os.environ.get("BENCH_DUCKDB_ESCAPE_ALL") == "1":
            text = f"replace(replace({text}, '\\', '\\\\'), '|', '\\|')"
        return f"coalesce({text}, '\\N')"

    row = " || '|' || ".join(elem(n, t) for n, t in FIELDS)
    nk = " || '|' || ".join(f"coalesce({n}::VARCHAR, '')" for n in NATURAL_KEY)
    return (
        f"SELECT *, sha256('1|' || {row}) AS row_hash, "
        f"sha256('1|' || {nk}) AS natural_key_fingerprint FROM {typed_read(csv)}"
    )


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def bronze_select(csv: str) -> str:
    """ingot's bronze columns around hash_select (in ingot's column order)."""
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f+00")
    file_hash = file_sha256(csv)
    fields = ", ".join(n for n, _ in FIELDS)
    return (
        f"SELECT {fields}, {sql_str(str(uuid.uuid4()))} AS ingestion_run_id, "
        f"{sql_str(file_hash)} AS file_hash, row_hash, natural_key_fingerprint, "
        f"1::INTEGER AS natural_key_version, 1::INTEGER AS contract_version, "
        f"TIMESTAMPTZ {sql_str(started)} AS ingested_at, false AS is_deleted, "
        f"NULL::VARCHAR AS previous_natural_key_fingerprint FROM ({hash_select(csv)})"
    )


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in ("bronze", "hash", "copy", "current", "delta"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, csv, out = sys.argv[1:]
    query = {
        "bronze": bronze_select,
        "hash": hash_select,
        "copy": lambda c: f"SELECT * FROM {typed_read(c)}",
        # ingested_at orders a source's versions as their commits do (docs/formats.md)
        "current": lambda g: (
            f"SELECT * FROM read_parquet({sql_str(g)}, hive_partitioning = false) QUALIFY row_number() OVER "
            "(PARTITION BY natural_key_fingerprint ORDER BY ingested_at DESC) = 1 AND NOT is_deleted"
        ),
        "delta": lambda t: f"SELECT * FROM delta_scan({sql_str(t)})",
    }[mode](csv)
    con = duckdb.connect()
    if mode == "delta":
        # the Delta extension from PyPI (duckdb-ext-delta), loaded from the venv: no download
        ext = glob.glob(os.path.join(os.path.dirname(duckdb.__file__), "..", "duckdb_ext", "extensions",
                                     "v" + duckdb.__version__, "*", "delta.duckdb_extension"))
        if not ext:
            print("duckdb_job.py delta: no delta.duckdb_extension in this venv (pip install duckdb-ext-delta)",
                  file=sys.stderr)
            return 2
        con.execute(f"LOAD '{os.path.realpath(ext[0])}'")
    con.execute("SET enable_progress_bar = false")
    n = con.execute(
        f"COPY ({query}) TO {sql_str(out)} (FORMAT parquet, COMPRESSION zstd)"
    ).fetchone()[0]
    print(f"duckdb {mode}: {n} rows -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
