#!/usr/bin/env python3
"""make bench-history: what a command costs as a lake's history grows, beside DuckDB.

    history.py --ingot BIN --work DIR --out FILE.md [--duckdb PYTHON] [--runs 100,1000,10000]
               [--sources 50] [--source-runs 1000]

1. One source `t` (one-row CSV files, one run each) is filled to each size in --runs, in batches
   of 100 files per `ingot ingest` process. The cost of a run is its batch's time / 100: the
   batch of runs 101-200 stands for the 100th run, the last batch for the N-th.
2. At each size, the median of 5: a one-row ingest of a new key (its own process, a new file),
   `SELECT count(*) FROM bronze.t_current`, a point query on the current view, `SELECT 1`; and, as
   the peer, DuckDB counting the same source the way a folder of Parquet files is read without a
   catalog (`read_parquet` over every run's file), in the same run.
3. A lake of --sources sources with --source-runs runs each: `SELECT 1` and the point query on
   one source, beside the same query on a lake of that one source alone.

Writes a Markdown report to --out and the raw numbers next to it as JSON.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

CONTRACT = """source: {name}
version: 1
format: csv
fields:
  - name: id
    type: int64
    required: true
  - name: v
    type: string
natural_key:
  fields: [id]
  version: 1
"""

BATCH = 100


def run(cmd, env=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"history: {' '.join(cmd[:6])} ... failed ({p.returncode}):\n{p.stderr.decode()[-2000:]}")
    return dt, p.stdout.decode()


class Lake:
    def __init__(self, ingot, root, sources):
        self.ingot, self.root = ingot, root
        self.contracts = os.path.join(root, "contracts")
        self.files = os.path.join(root, "in")
        self.lake = os.path.join(root, "lake")
        os.makedirs(self.contracts, exist_ok=True)
        os.makedirs(self.files, exist_ok=True)
        for s in sources:
            with open(os.path.join(self.contracts, f"{s}.yaml"), "w") as f:
                f.write(CONTRACT.format(name=s))
        self.count = {s: 0 for s in sources}
        self.fresh = 0
        self.lock = threading.Lock()

    def cmd(self, *args):
        return [self.ingot, "--lake", self.lake, "--contracts", self.contracts, *args]

    def file(self, source, key):
        with self.lock:
            self.fresh += 1
            fresh = self.fresh
        path = os.path.join(self.files, f"{source}-{fresh:08}.csv")
        with open(path, "w") as f:
            f.write(f"id,v\n{key},v{fresh}\n")
        return path

    def fill(self, source, to):
        """Runs up to `to`, in batches; returns [(last run of the batch, seconds per run)]. The
        history is filled without fsync (INGOT_SYNC=0): what is measured is how the cost of a run
        grows, not the disk's flush time; the measured commands below run with it."""
        costs = []
        env = dict(os.environ, INGOT_SYNC="0")
        while self.count[source] < to:
            n = min(BATCH, to - self.count[source])
            files = [self.file(source, self.count[source] + i) for i in range(n)]
            dt, _ = run(self.cmd("ingest", source, *files), env=env)
            for f in files:
                os.remove(f)
            self.count[source] += n
            costs.append((self.count[source], dt / n))
        return costs

    def ingest_one(self, source):
        path = self.file(source, 10_000_000 + self.fresh)
        dt, _ = run(self.cmd("ingest", source, path))
        os.remove(path)
        self.count[source] += 1
        return dt

    def sql(self, query):
        return run(self.cmd("sql", query, "--format", "csv"))[0]


def median_of(n, f):
    return statistics.median(f() for _ in range(n))


def duckdb_count(python, lake, source):
    if not python:
        return None
    script = (
        "import duckdb,sys,time; t=time.perf_counter(); "
        f"duckdb.sql(\"SELECT count(*) FROM read_parquet('{lake}/bronze/{source}/*/*.parquet')\").fetchall(); "
        "print(time.perf_counter()-t)"
    )
    # the query's own time, without starting Python and importing duckdb
    return float(run([python, "-c", script])[1].strip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--duckdb", help="a Python with duckdb installed (the peer)")
    ap.add_argument("--runs", default="100,1000,10000")
    ap.add_argument("--sources", type=int, default=50)
    ap.add_argument("--source-runs", type=int, default=1000)
    a = ap.parse_args()
    sizes = [int(x) for x in a.runs.split(",")]
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    point = "SELECT * FROM bronze.{s}_current WHERE id = 7"

    # 1-2. one source, growing
    one = Lake(a.ingot, os.path.join(a.work, "one"), ["t"])
    fill_costs, at = [], {}
    for n in sizes:
        fill_costs += one.fill("t", n)
        at[n] = {
            "ingest": median_of(5, lambda: one.ingest_one("t")),
            "count": median_of(5, lambda: one.sql("SELECT count(*) FROM bronze.t_current")),
            "point": median_of(5, lambda: one.sql(point.format(s="t"))),
            "select1": median_of(5, lambda: one.sql("SELECT 1")),
            "duckdb_count": median_of(3, lambda: duckdb_count(a.duckdb, one.lake, "t")) if a.duckdb else None,
        }
        print(f"history: {n} runs: {at[n]}", file=sys.stderr)
    cost_100 = next(c for last, c in fill_costs if last >= 200)
    cost_n = fill_costs[-1][1]

    # 3. many sources
    names = [f"s{i:02}" for i in range(a.sources)]
    many = Lake(a.ingot, os.path.join(a.work, "many"), names)
    t0 = time.perf_counter()
    # one source per CPU at a time (each source has its own lock)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda s: many.fill(s, a.source_runs), names))
    fill_many = time.perf_counter() - t0
    alone = Lake(a.ingot, os.path.join(a.work, "alone"), ["s00"])
    alone.fill("s00", a.source_runs)
    wide = {
        "select1": median_of(5, lambda: many.sql("SELECT 1")),
        "point": median_of(5, lambda: many.sql(point.format(s="s00"))),
        "point_alone": median_of(5, lambda: alone.sql(point.format(s="s00"))),
    }
    print(f"history: {a.sources} sources x {a.source_runs} runs: {wide}", file=sys.stderr)

    raw = {"sizes": at, "fill": fill_costs, "wide": wide, "fill_many_s": fill_many}
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump(raw, f, indent=1)
    base = at[sizes[0]]
    lines = [
        "# History benchmark (`make bench-history`)",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; release build; "
        "one-row CSV files, one run each; histories filled with INGOT_SYNC=0, measured commands synced; "
        "medians of 5 (DuckDB: of 3).",
        "",
        f"| committed runs | one-row ingest | count(*) of _current | point query | SELECT 1 | DuckDB read_parquet count |",
        "|---|---|---|---|---|---|",
    ]
    for n in sizes:
        m = at[n]
        rel = lambda k: f" ({m[k] / base[k]:.2f}x)" if n != sizes[0] else ""
        duck = f"{m['duckdb_count']:.3f} s" if m["duckdb_count"] is not None else "n/a"
        lines.append(
            f"| {n:,} | {m['ingest']:.3f} s{rel('ingest')} | {m['count']:.3f} s{rel('count')} | "
            f"{m['point']:.3f} s{rel('point')} | {m['select1']:.3f} s{rel('select1')} | {duck} |"
        )
    lines += [
        "",
        f"Filling: the 100th run cost {cost_100 * 1000:.1f} ms, the {fill_costs[-1][0]:,}th {cost_n * 1000:.1f} ms "
        f"({cost_n / cost_100:.2f}x; target at most 1.5x).",
        "",
        f"{a.sources} sources x {a.source_runs:,} runs (filled in {fill_many:.0f} s): `SELECT 1` {wide['select1']:.3f} s "
        f"(target under 0.2 s); the point query on one source {wide['point']:.3f} s, "
        f"{wide['point'] / wide['point_alone']:.2f}x the same query in a lake of that source alone "
        f"({wide['point_alone']:.3f} s; target at most 1.5x).",
        "",
    ]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
