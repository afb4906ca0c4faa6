"""The ADBC Flight SQL driver against a hardened `ingot serve`, for tests/it/flight_security.rs.

    flight_secure.py tls URI TOKEN CA.pem   queries over TLS: with the token, a wrong one, none,
                                            and without trusting the certificate
    flight_secure.py count URI TOKEN        the bookings count, as {"count": rows}
    flight_secure.py limits URI             a query that never ends (its first batch read, then
                                            left unread) beside a short one, on a server with
                                            --max-queries 1 and a short --query-timeout

Prints one JSON object; every step records its error text instead of stopping.
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flight_sql
from adbc_driver_flightsql import DatabaseOptions

out = {}


def step(name, fn):
    try:
        out[name] = fn()
    except Exception as e:  # noqa: BLE001 - the test wants every failure text
        out[name] = {"error": str(e)}


def connect(uri, token=None, ca=None, **extra):
    kwargs = dict(extra)
    if token is not None:
        kwargs[DatabaseOptions.AUTHORIZATION_HEADER.value] = f"Bearer {token}"
    if ca is not None:
        kwargs[DatabaseOptions.TLS_ROOT_CERTS.value] = ca
    return flight_sql.connect(uri, db_kwargs=kwargs)


def query(uri, sql, **kw):
    with connect(uri, **kw) as conn:
        cur = conn.cursor()
        cur.execute(sql)
        return [list(r) for r in cur.fetchall()]


COUNT = "SELECT count(*) AS n FROM bronze.bookings"

if sys.argv[1] == "tls":
    uri, token, ca_path = sys.argv[2:5]
    ca = open(ca_path).read()
    step("with_token", lambda: query(uri, COUNT, token=token, ca=ca))
    step("wrong_token", lambda: query(uri, COUNT, token=token + "x", ca=ca))
    step("prefix_of_token", lambda: query(uri, COUNT, token=token[:-1], ca=ca))
    step("no_token", lambda: query(uri, COUNT, ca=ca))
    step("untrusted_certificate", lambda: query(uri, COUNT, token=token))
    step("plain_text", lambda: query(uri.replace("grpc+tls://", "grpc://"), COUNT, token=token))
elif sys.argv[1] == "count":
    uri, token = sys.argv[2:4]
    step("count", lambda: query(uri, COUNT, token=token))
elif sys.argv[1] == "limits":
    uri = sys.argv[2]
    endless = connect(uri)
    cur = endless.cursor()

    held = {}

    def first_batch():
        cur.execute("SELECT value FROM generate_series(1, 1000000000000000) AS t(value)")
        held["reader"] = cur.fetch_record_batch()
        return held["reader"].read_next_batch().num_rows > 0

    step("endless_first_batch", first_batch)
    # the one slot is taken: this waits until the endless query is cancelled
    step("short", lambda: query(uri, COUNT))

    def rest():
        while True:
            held["reader"].read_next_batch()

    step("endless_rest", rest)
    try:
        endless.close()
    except Exception:  # noqa: BLE001 - the stream ended in an error already
        pass
print(json.dumps(out))
