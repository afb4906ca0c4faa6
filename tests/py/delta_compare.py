"""Read an ingot lake's Delta tables with other engines and compare them with ingot's own answer.

Usage: delta_compare.py SPEC.json

SPEC: {"checks": [{"name": ..., "want": "<parquet file ingot wrote with `ingot sql --format
parquet`>", "read": {"table": "<Delta table URL or path>", "version": <int or null>,
"readers": ["duckdb", "deltalake", "deltalake_pyarrow"], "query": "<DuckDB SQL over delta_scan,
with {table:<path>} placeholders>"}, "key": [columns to sort by]}], "storage_options": {...}}

For each check and reader: the table as the reader returns it, every row and every column, is
compared with ingot's rows (both sorted by the key columns, values made comparable: times as UTC
instants, decimals exactly, lists as lists). Prints JSON: {name: {reader: {"rows": n, "ok": bool,
"diff": "<first difference>"}}} and exits 0; the Rust test decides.

The DuckDB Delta extension is the PyPI package duckdb-ext-delta, loaded from site-packages with
LOAD '<path>' (no network).
"""

import datetime
import decimal
import glob
import json
import math
import os
import re
import sys

import duckdb
import deltalake
import pyarrow as pa
import pyarrow.parquet as pq

def extension(name="delta"):
    """The path of a DuckDB extension installed from PyPI (duckdb-ext-<name>)."""
    found = glob.glob(os.path.join(os.path.dirname(duckdb.__file__), "..",
                                   "duckdb_ext", "extensions", "v" + duckdb.__version__, "*",
                                   name + ".duckdb_extension"))
    if not found:
        raise SystemExit(f"the DuckDB extension {name} (PyPI duckdb-ext-{name}) is not installed")
    return os.path.realpath(found[0])


def duck(storage):
    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    con.execute(f"LOAD '{extension()}'")
    if storage:
        con.execute(f"LOAD '{extension('httpfs')}'")
        # an S3-compatible endpoint (moto in tests)
        endpoint = storage["AWS_ENDPOINT_URL"].split("://", 1)

        def q(text):
            return "'" + str(text).replace("'", "''") + "'"
        con.execute(f"""CREATE SECRET s3 (TYPE s3, KEY_ID {q(storage["AWS_ACCESS_KEY_ID"])},
                        SECRET {q(storage["AWS_SECRET_ACCESS_KEY"])}, REGION {q(storage.get("AWS_REGION", "us-east-1"))},
                        ENDPOINT {q(endpoint[1])}, URL_STYLE 'path', USE_SSL {str(endpoint[0] == "https").lower()})""")
    return con


def value(v):
    """A value as compared: exact, whatever engine produced it."""
    if v is None:
        return None
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return repr(v)
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)
        v = v.astimezone(datetime.timezone.utc)
        return v.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [value(x) for x in v]
    if isinstance(v, dict):
        return {k: value(x) for k, x in v.items()}
    return str(v)


def rows_of(table: pa.Table, key):
    rows = [{k: value(v) for k, v in r.items()} for r in table.to_pylist()]
    rows.sort(key=lambda r: json.dumps([r.get(k) for k in key] + [r], sort_keys=True, default=str))
    return rows


def compare(got, want):
    if not want and not got:
        return True, ""
    gk = set(got[0].keys()) if got else None
    wk = set(want[0].keys()) if want else None
    if got and want and gk != wk:
        return False, f"columns differ: only ingot {sorted(wk - gk)}, only reader {sorted(gk - wk)}"
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            cols = [k for k in b if a.get(k) != b.get(k)]
            return False, f"row {i} differs in {cols}: reader {[a.get(k) for k in cols]} ingot {[b.get(k) for k in cols]}"
    if len(got) != len(want):
        return False, f"{len(got)} rows, ingot has {len(want)}"
    return True, ""


def read(reader, spec, storage):
    table, version, query = spec.get("table"), spec.get("version"), spec.get("query")
    if reader == "duckdb":
        con = duck(storage)
        if query:
            sql = re.sub(r"\{table:([^}]*)\}", lambda m: f"delta_scan('{m.group(1)}')", query)
            return con.execute(sql).fetch_arrow_table()
        if version is None:
            return con.execute("SELECT * FROM delta_scan(?)", [table]).fetch_arrow_table()
        con.execute(f"ATTACH '{table}' AS t (TYPE delta)")
        return con.execute(f"SELECT * FROM t AT (VERSION => {int(version)})").fetch_arrow_table()
    dt = deltalake.DeltaTable(table, version=version, storage_options=storage or None)
    if reader == "deltalake":
        # the kernel-based scan: reads deletion vectors
        return pa.RecordBatchReader.from_stream(dt.scan()).read_all()
    if reader == "deltalake_pyarrow":
        # the pyarrow dataset path (Polars and pandas use it): refuses deletion vectors
        return dt.to_pyarrow_table()
    raise SystemExit(f"unknown reader {reader}")


def main():
    spec = json.load(open(sys.argv[1]))
    storage = spec.get("storage_options")
    out = {}
    for check in spec["checks"]:
        want = rows_of(pq.read_table(check["want"]), check["key"])
        res = {}
        for reader in check["read"].get("readers", ["duckdb", "deltalake"]):
            try:
                got = rows_of(read(reader, check["read"], storage), check["key"])
                ok, diff = compare(got, want)
                res[reader] = {"rows": len(got), "want_rows": len(want), "ok": ok, "diff": diff}
            except Exception as e:  # reported to the test, which names it
                res[reader] = {"rows": 0, "want_rows": len(want), "ok": False,
                               "diff": f"{type(e).__name__}: {e}"[:2000]}
        out[check["name"]] = res
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    # the readers' native threads (DuckDB, delta-rs) can abort the interpreter's teardown: the
    # answer is out, leave without it
    os._exit(0)


if __name__ == "__main__":
    main()
