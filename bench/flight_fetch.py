#!/usr/bin/env python3
"""The Flight SQL round trip of `make bench`: a real client (ADBC's Flight SQL driver) runs a
query against `ingot serve` RUNS times and fetches every row as an Arrow table.

    flight_fetch.py URI QUERY RUNS

Prints "rows N best SECONDS" (the fastest execute + fetch, timed in the client).
"""
import math
import sys
import time
import warnings

import adbc_driver_flightsql.dbapi as flight_sql


def main() -> int:
    warnings.filterwarnings("ignore", message="Cannot disable autocommit")
    uri, query, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    best, n = math.inf, 0
    with flight_sql.connect(uri) as conn:
        cur = conn.cursor()
        for _ in range(runs):
            t0 = time.perf_counter()
            cur.execute(query)
            n = cur.fetch_arrow_table().num_rows
            best = min(best, time.perf_counter() - t0)
    print(f"rows {n} best {best:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
