#!/usr/bin/env python3
"""bench/results-sources.md from the measurements of bench/sources.sh.

    report.py --measure DIR --split split.json --rounds N --sf SF --md OUT.md [--meta TEXT]...

DIR holds measure.py's JSON per job (LABEL.json is the median run of LABEL_1 .. LABEL_N) and the
check logs check_full.log and check_inc.log of bench/sources/duckdb_sources.py.
"""
import argparse
import json
import os


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--measure", required=True)
    ap.add_argument("--split", required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--sf", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--meta", action="append", default=[])
    a = ap.parse_args()
    d = a.measure
    s = json.load(open(a.split))
    m = lambda label: json.load(open(os.path.join(d, f"{label}.json")))  # noqa: E731
    wall = lambda label: m(label)["wall_s"]  # noqa: E731
    runs = lambda label: ", ".join(f"{wall(f'{label}_{k}'):.2f}" for k in range(1, a.rounds + 1))  # noqa: E731

    def checks(name: str):
        lines = open(os.path.join(d, name)).read().splitlines()
        ok = sum(1 for x in lines if x.startswith("sources check: ok"))
        summary = next(json.loads(x.split(": ", 1)[1]) for x in lines if x.startswith("sources summary: "))
        return ok, summary

    ok_full, sum_full = checks("check_full.log")
    ok_inc, sum_inc = checks("check_inc.log")
    f = lambda x: f"{x:,}"  # noqa: E731

    rows = [
        ("ingest_a", f"ingest of A ({f(s['rows_a'])} rows) into lineitem_a", None),
        ("ingest_b", f"ingest of B ({f(s['rows_b'])} rows) into lineitem_b", None),
        ("ingest_ab_a", "ingest of A's file into the baseline source lineitem_ab", None),
        ("ingest_ab_b", f"ingest of B's file into lineitem_ab ({f(s['overlap'])} of its rows are updates)", None),
        ("full_one", f"**ingot: one-source full build** (lineitem_ab, 2 runs, {f(s['distinct_keys'])} current records)", "full_one"),
        ("full_two", f"**ingot: two-source full build** (lineitem_a + lineitem_b, {f(s['overlap'])} records in both)", "full_two"),
        ("duckdb_full", "DuckDB: the same survivorship in SQL over the same bronze Parquet", "duckdb_full"),
        ("ingest_b_redelivery", f"ingest of B's re-delivery ({f(s['redelivered'])} changed rows) into lineitem_b", None),
        ("ingest_ab_redelivery", "the same file into lineitem_ab", None),
        ("inc_one", f"ingot: one-source incremental build ({f(s['redelivered'])} records)", "inc_one"),
        ("inc_two", f"**ingot: two-source incremental build** ({f(s['redelivered'])} records, "
                    f"{f(s['redelivered_overlap'])} of them in both sources)", "inc_two"),
        ("duckdb_current", "DuckDB: the table recomputed after the re-delivery (each source deduplicated to its current rows first)", "duckdb_current"),
    ]
    table = ["| job | wall s | peak RSS MB | CPU s (user + sys) | runs (wall s) |", "|---|---:|---:|---:|---|"]
    for label, what, rep in rows:
        r = m(label)
        table.append(f"| {what} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['user_s'] + r['sys_s']:.1f} | "
                     f"{runs(rep) if rep else 'once'} |")
    ratio = wall("full_two") / wall("full_one")
    # CPU time (user + sys) of the same median runs: less moved by other work on the machine
    cpu = lambda label: m(label)["user_s"] + m(label)["sys_s"]  # noqa: E731
    walls = lambda label: [wall(f"{label}_{k}") for k in range(1, a.rounds + 1)]  # noqa: E731
    per_round = sorted(t / o for t, o in zip(walls("full_two"), walls("full_one")))
    text = f"""# A silver table fed by two sources: ingot beside a one-source build and DuckDB (SF{a.sf})

`bench/sources.sh` (run by `make bench`; `SOURCES=0` leaves it out). TPC-H lineitem SF{a.sf}
({f(s['rows_in'])} rows, tpchgen-cli) split by `bench/sources/split.py` by l_orderkey into 20 hash
buckets: A gets buckets 0-9 ({f(s['rows_a'])} rows), B buckets 9-18 ({f(s['rows_b'])} rows), bucket 9
is in both ({f(s['overlap'])} keys, {100 * s['overlap'] / s['rows_a']:.1f}% of A's and
{100 * s['overlap'] / s['rows_b']:.1f}% of B's), bucket 19 ({f(s['dropped'])} rows) is left out so that
A + B = {f(s['rows_a'] + s['rows_b'])} rows in, {f(s['distinct_keys'])} distinct keys. Every row gets a 17th
column l_updated (its receipt date). In the overlap B's l_updated is 7 days later
({f(s['b_newer'])}), earlier ({f(s['a_newer'])}) or equal ({f(s['same_updated'])}), its l_shipinstruct
always differs, its l_comment differs in {f(s['comment_differs'])} and its l_extendedprice in
{f(s['price_differs'])}; A's l_shipmode is null in {f(s['a_shipmode_null'])}.

* **two-source table** `lineitem_two` (bench/sources/rules/lineitem_two/v1.yaml): `sources:
  [lineitem_a, lineitem_b]`, `survivorship: {{default: precedence, order_by: l_updated, fields:
  {{l_shipinstruct: most_recent}}}}`, `conflicts: {{fields: [l_comment], on_conflict: flag}}`.
* **one-source baseline** `lineitem_one`: the same columns from one source, `lineitem_ab`, into
  which A's file and then B's file were ingested (two runs; B's {f(s['overlap'])} overlapping rows
  are updates). Same bytes in, same {f(s['distinct_keys'])} output rows, no survivorship.
* **DuckDB** (bench/sources/duckdb_sources.py) reads the same bronze Parquet files ingot's
  sources hold (bronze/lineitem_[ab]/run_id=*/*.parquet), full outer joins them on
  natural_key_fingerprint and computes every field's winner (COALESCE by rank for precedence, the
  later l_updated then rank for most_recent), the provenance columns (contributing_sources,
  field_sources, conflict_fields), anomaly_flags and the lineage of the first contributing
  source, and the conflict log (every candidate, candidate_set_hash with sha256(), the source
  taken); it writes silver.parquet and conflicts.parquet (zstd). For the full build every bronze
  row is current (one run per source), so DuckDB is spared the deduplication to current rows
  (as in bench/silver_duckdb.py); after the re-delivery it does deduplicate (a window over each
  source). It writes no build state, no Delta log and no build record.
* **re-delivery**: {f(s['redelivered'])} rows of B ({f(s['redelivered_overlap'])} in the overlap,
  {f(s['redelivered_b_only'])} B's own) with l_comment "corrected ..." and l_updated + 30 days;
  ingested into lineitem_b (and into lineitem_ab for the baseline), then incremental builds.

Each full build is the table's first build (the earlier rounds' builds are undone, untimed); each
incremental build follows the same full build and re-delivery (undone between rounds). Each job
ran {a.rounds} times, interleaved (one-source, two-source, DuckDB, the ingot builds' order
alternating); the table shows the median run, wall time and peak RSS of the process
(bench/measure.py, after `sync`).

{chr(10).join(table)}

**two-source / one-source full build: {ratio:.2f}x** (target <= 1.3x{', met' if ratio <= 1.3 else ', NOT met'}; medians
of wall time; per round {', '.join(f'{r:.2f}x' for r in per_round)}; CPU time, user + sys, of the median runs
{cpu('full_two'):.1f} s / {cpu('full_one'):.1f} s = {cpu('full_two') / cpu('full_one'):.2f}x).
ingot two-source full build / DuckDB: {wall('full_two') / wall('duckdb_full'):.2f}x;
two-source incremental build / DuckDB's recomputation: {wall('inc_two') / wall('duckdb_current'):.2f}x;
two-source / one-source incremental build: {wall('inc_two') / wall('inc_one'):.2f}x;
two-source incremental / two-source full build: {wall('inc_two') / wall('full_two'):.2f}x.

**Same result.** ingot's table after the full build and after the incremental build agree with
DuckDB's ({ok_full} and {ok_inc} checks ok, bench/sources/duckdb_sources.py `check`): the same
{f(sum_full['rows'])} rows and keys, {f(sum_full['two_sources'])} records with two contributing sources,
{f(sum_full['conflicts'])} conflicts in audit.source_conflict_log ({f(sum_inc['conflicts'])} after the
re-delivery; both as the split predicts), sum(l_extendedprice) {sum_full['sum_extendedprice']},
field_sources winners {', '.join(sum_full['winners'])} (after the re-delivery
{', '.join(sum_inc['winners'])}), and every column of every row and every conflict (candidates,
candidate_set_hash, taken source) equal.

""" + "\n".join(f"* {x}" for x in a.meta) + "\n"
    open(a.md, "w").write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
