"""A real Arrow Flight SQL client (the ADBC Flight SQL driver from PyPI) against `ingot serve`.

Usage: flight_client.py URI TOKEN. Prints one JSON object with what it saw; tests/it/flight.rs
checks it. Every step records an error instead of stopping, so the test sees them all.
"""
import json
import sys
import threading

import adbc_driver_flightsql.dbapi as flight_sql
from adbc_driver_flightsql import DatabaseOptions

URI, TOKEN = sys.argv[1], sys.argv[2]


def connect(token=TOKEN):
    kwargs = {}
    if token:
        kwargs[DatabaseOptions.AUTHORIZATION_HEADER.value] = f"Bearer {token}"
    return flight_sql.connect(URI, db_kwargs=kwargs)


out = {}


def step(name, fn):
    try:
        out[name] = fn()
    except Exception as e:  # noqa: BLE001 - the test wants every failure text
        out[name] = {"error": str(e)}


with connect() as conn:
    cur = conn.cursor()

    def query(sql, params=None):
        cur.execute(sql, parameters=params)
        return [list(r) for r in cur.fetchall()]

    step("current", lambda: query("SELECT count(*) AS n FROM bronze.bookings_current"))
    step("runs", lambda: query("SELECT status, count(*) AS n FROM audit.ingestion_run_log GROUP BY 1 ORDER BY 1"))
    step("silver", lambda: query("SELECT rules_version, count(*) FROM silver.bookings GROUP BY 1 ORDER BY 1"))
    step("udf", lambda: query("SELECT natural_key_fingerprint(1, 'AMS01', 'BK1')"))
    step("prepared", lambda: query("SELECT count(*) FROM silver.bookings WHERE rules_version = $1", (2,)))

    def objects():
        tree = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        found = []
        for catalog in tree:
            for schema in catalog["catalog_db_schemas"] or []:
                for table in schema["db_schema_tables"] or []:
                    found.append(f"{catalog['catalog_name']}.{schema['db_schema_name']}.{table['table_name']}")
        return sorted(found)

    step("objects", objects)
    step(
        "table_schema",
        lambda: [f.name for f in conn.adbc_get_table_schema("bookings", catalog_filter="ingot", db_schema_filter="silver")],
    )
    step("ddl", lambda: query("CREATE TABLE t (x INT)"))
    step("insert", lambda: query("INSERT INTO audit.ingestion_run_log SELECT * FROM audit.ingestion_run_log"))


def no_token():
    with connect(token=None) as conn:
        cur = conn.cursor()
        cur.execute("SELECT 1")
        return cur.fetchall()


step("no_token", no_token)

results = [None] * 10


def worker(i):
    try:
        with connect() as conn:
            cur = conn.cursor()
            cur.execute(f"SELECT {i} AS i, count(*) AS n FROM bronze.bookings")
            results[i] = list(cur.fetchone())
    except Exception as e:  # noqa: BLE001
        results[i] = {"error": str(e)}


threads = [threading.Thread(target=worker, args=(i,)) for i in range(10)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=60)
out["concurrent"] = results
print(json.dumps(out, default=str))
