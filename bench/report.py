#!/usr/bin/env python3
"""Print the make bench results table and write it to bench/results-sf<SF>.md.

    report.py --measure DIR --sf SF --rows N --md FILE [--sf10-rows N] [--silver-changed N]
              [--silver-retry-limit LIMIT] [--meta "key: value"]...

DIR holds the measure.py JSON files: ingot_first_K and duckdb_bronze_K for the interleaved
rounds K = 1.. of the first ingest (ingot_first and duckdb_bronze: the median run of each),
ingot_again, ingot_redelivery, duckdb_hash, duckdb_copy, when SF10=1 was set ingot_first_sf10, and with --silver-changed the silver part's
silver_bronze_first, silver_ingot_full, silver_duckdb, silver_ingest_1pct,
silver_ingot_incremental and, when that failed and was run again with --memory-limit
LIMIT (--silver-retry-limit), silver_ingot_incremental_retry.
"""
import argparse
import json
import os

GIB_MB = 1024.0  # peak RSS is reported in MiB


def load(d: str, name: str):
    p = os.path.join(d, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--measure", required=True)
    ap.add_argument("--sf", required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--sf10-rows", type=int)
    ap.add_argument("--silver-changed", type=int, help="rows changed by the silver part's re-delivery")
    ap.add_argument("--silver-retry-limit", help="--memory-limit of the incremental build's second attempt")
    ap.add_argument("--query", action="append", default=[],
                    help="NAME,INGOT_S,DUCKDB_S: best-of-3 times of a TPC-H query over silver.lineitem")
    ap.add_argument("--query-delta", action="append", default=[],
                    help="NAME,INGOT_S,DELTA_S: the same query through DuckDB's delta_scan of silver/lineitem")
    ap.add_argument("--flight", help="FLIGHT_S,IN_PROCESS_S,ROWS: the 1M-row Flight SQL round trip and the same query in-process")
    ap.add_argument("--meta", action="append", default=[])
    a = ap.parse_args()
    m = {k: load(a.measure, k) for k in
         ("ingot_first", "ingot_again", "ingot_redelivery", "duckdb_bronze", "duckdb_hash", "duckdb_copy",
          "ingot_first_sf10", "ingot_first_nosync", "ingot_silver_sf10", "duckdb_silver_sf10",
          "current_export_sf10")}
    fa, fb, fc, db, dh, dc, f10, fn, s10, d10, c10 = (m[k] for k in m)
    # The interleaved rounds of the first ingest: each round's ratio pairs two runs made side by
    # side; the median of those ratios is the one that counts.
    rounds = []
    while (i := load(a.measure, f"ingot_first_{len(rounds) + 1}")) and (
            d := load(a.measure, f"duckdb_bronze_{len(rounds) + 1}")):
        rounds.append((i, d))
    for k, (i, d) in enumerate(rounds, 1):
        m[f"ingot_first_{k}"], m[f"duckdb_bronze_{k}"] = i, d
    silver_keys = ("silver_bronze_first", "silver_ingot_full", "silver_duckdb", "silver_ingest_1pct",
                   "silver_ingot_incremental", "silver_ingot_incremental_retry")
    m["ingot_first_nodelta"] = load(a.measure, "ingot_first_nodelta")
    for k in ("silver_ingot_full_nodelta", "silver_ingot_incremental_nodelta", "silver_ingot_incremental_cow"):
        m[k] = load(a.measure, k)
    if a.silver_changed is not None:
        m.update({k: load(a.measure, k) for k in silver_keys})

    def s(x):
        return f"{x['wall_s']:.2f}" if x else ""

    def mb(x):
        return f"{x['peak_rss_mb']:.0f}" if x else ""

    def verdict(ok: bool) -> str:
        return "yes" if ok else "NO"

    head = ["job", "ingot s", "duckdb s", "ratio", "ingot peak MiB", "duckdb peak MiB", "target", "met"]
    rows = []
    paired = sorted(i["wall_s"] / d["wall_s"] for i, d in rounds)
    ratio_a = paired[len(paired) // 2]
    rows.append([f"first ingest SF{a.sf} ({a.rows} rows), median of {len(rounds)} interleaved rounds", s(fa), s(db),
                 f"{ratio_a:.2f}x", mb(fa), mb(db), "<=0.5x duckdb (same job)", verdict(ratio_a <= 0.5)])
    for k, (i, d) in enumerate(rounds, 1):
        st = [x.get("steal_s") or 0.0 for x in (i, d)]
        steal = f" (stolen: {st[0]:.1f} s, {st[1]:.1f} s)" if max(st) >= 0.05 else ""
        rows.append([f"  round {k}{steal}", s(i), s(d), f"{i['wall_s'] / d['wall_s']:.2f}x", mb(i), mb(d), "", ""])
    if dh:
        rows.append(["  duckdb: the hashes alone (no file hash, no run columns)", "", s(dh),
                     f"{fa['wall_s'] / dh['wall_s']:.2f}x", "", mb(dh), "(reference)", ""])
    if fn:
        rows.append(["  ingot with INGOT_SYNC=0 (no fsync: the cost of syncing)", s(fn), "",
                     f"{fn['wall_s'] / db['wall_s']:.2f}x", mb(fn), "", "(reference)", ""])
    rows.append(["same file again (skip)", s(fb), "", "", mb(fb), "", "<2 s", verdict(fb["wall_s"] < 2.0)])
    ratio_c = fc["wall_s"] / fa["wall_s"]
    rows.append(["re-delivery, 3 rows changed", s(fc), "", f"{ratio_c:.2f}x first", mb(fc), "",
                 "<=1.5x first", verdict(ratio_c <= 1.5)])
    rows.append(["duckdb plain CSV->Parquet copy", "", s(dc), f"{fa['wall_s'] / dc['wall_s']:.2f}x", "",
                 mb(dc), "(reference)", ""])
    peak = max(x["peak_rss_mb"] for x in (fa, fb, fc))
    rows.append([f"ingot peak memory, SF{a.sf} jobs", "", "", "", f"{peak:.0f}", "", "<=1024 MiB",
                 verdict(peak <= GIB_MB)])
    if f10:
        rows.append([f"first ingest SF10 ({a.sf10_rows} rows)", s(f10), "", "", mb(f10), "",
                     "<=1024 MiB", verdict(f10["peak_rss_mb"] <= GIB_MB)])
    if c10:
        rows.append(["bronze.lineitem_current exported to Parquet, SF10", s(c10), "", "", mb(c10), "",
                     "<=1024 MiB", verdict(c10["peak_rss_mb"] <= GIB_MB)])
    if s10:
        ratio = f"{s10['wall_s'] / d10['wall_s']:.2f}x" if d10 else ""
        rows.append(["silver full build SF10", s(s10), s(d10), ratio, mb(s10), mb(d10),
                     "<=1024 MiB", verdict(s10["peak_rss_mb"] <= GIB_MB)])

    if a.silver_changed is not None:
        sb, sf, sd, sp, si, sr = (m[k] for k in silver_keys)
        r = sf["wall_s"] / sd["wall_s"]
        rows.append([f"silver full build SF{a.sf} (rules: 6 steps, 2 checks, when + spike)", s(sf), s(sd),
                     f"{r:.2f}x", mb(sf), mb(sd), "<=1.0x duckdb", verdict(r <= 1.0)])
        rows.append([f"ingest of a re-delivery, 1% changed ({a.silver_changed} rows)", s(sp), "",
                     f"{sp['wall_s'] / sb['wall_s']:.2f}x first", mb(sp), "", "(reference)", ""])
        if si["exit"] == 0:
            r = si["wall_s"] / sf["wall_s"]
            rows.append(["silver incremental build after it", s(si), "", f"{r:.2f}x full", mb(si), "",
                         "<=0.2x full", verdict(r <= 0.2)])
        else:
            rows.append(["silver incremental build after it", f"failed ({si['wall_s']:.2f})", "", "",
                         mb(si), "", "<=0.2x full", "NO"])
        if sr:
            r = sr["wall_s"] / sf["wall_s"]
            rows.append([f"  the same again, --memory-limit {a.silver_retry_limit}", s(sr), "", f"{r:.2f}x full",
                         mb(sr), "", "(not the target)", ""])
        peak = max(x["peak_rss_mb"] for x in (sf, si))  # default --memory-limit only
        rows.append(["ingot peak memory, silver builds", "", "", "", f"{peak:.0f}", "", "<=1024 MiB",
                     verdict(peak <= GIB_MB)])

    # the cost of publishing the Delta logs: the same job with INGOT_DELTA=off
    for label, on, off in (("first ingest", "ingot_first", "ingot_first_nodelta"),
                           ("silver full build", "silver_ingot_full", "silver_ingot_full_nodelta"),
                           ("silver incremental build (deletion vectors)", "silver_ingot_incremental",
                            "silver_ingot_incremental_nodelta")):
        x, y = m.get(on), m.get(off)
        if x and y:
            r = x["wall_s"] / y["wall_s"]
            rows.append([f"Delta publishing: {label}, on vs INGOT_DELTA=off", s(x), s(y), f"{r:.2f}x off",
                         mb(x), mb(y), "<=1.10x off", verdict(r <= 1.10)])
    cow, off = m.get("silver_ingot_incremental_cow"), m.get("silver_ingot_incremental_nodelta")
    if cow and off:
        rows.append(["  the incremental build publishing copy-on-write instead", s(cow), s(off),
                     f"{cow['wall_s'] / off['wall_s']:.2f}x off", mb(cow), mb(off), "(reference)", ""])
    for q in a.query:
        name, ti, td = q.split(",")
        r = float(ti) / float(td)
        rows.append([f"TPC-H {name.upper()} over silver.lineitem (best of 3)", f"{float(ti):.3f}", f"{float(td):.3f}",
                     f"{r:.2f}x", "", "", "<=1.0x duckdb", verdict(r <= 1.0)])
    for q in a.query_delta:
        name, ti, tx = q.split(",")
        rows.append([f"TPC-H {name.upper()}: ingot sql vs DuckDB delta_scan of silver/lineitem", f"{float(ti):.3f}",
                     f"{float(tx):.3f}", f"{float(ti) / float(tx):.2f}x", "", "", "(reference)", ""])
    if a.flight:
        tf, tp, n = (float(x) for x in a.flight.split(","))
        rows.append([f"{n:,.0f}-row result over Flight SQL (ADBC client, best of 3)", f"{tf:.3f}", "",
                     f"{tf / tp:.2f}x in-process", "", "", "(reference)", ""])
        rows.append(["  the same query in-process (ingot sql --format arrow)", f"{tp:.3f}", "", "", "", "",
                     "(reference)", ""])

    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    print(fmt(head))
    for r in rows:
        print(fmt(r))

    md = [f"# make bench: TPC-H lineitem SF{a.sf}, ingot vs DuckDB", ""]
    md += [f"- {x}" for x in a.meta]
    md += ["", "Wall-clock seconds and peak RSS (MiB) of each job, one process per measurement",
           "(`bench/measure.py`); ratio = ingot / duckdb, or / the first ingest where marked. The first",
           "ingest and DuckDB's same job (`bench/duckdb_job.py bronze`) run in interleaved rounds: their",
           "ratio is the median of the rounds' ratios, each pairing two runs made side by side; \"stolen\"",
           "is the machine's steal time (CPU the hypervisor gave elsewhere) during a run.", ""]
    md.append("| " + " | ".join(head) + " |")
    md.append("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        md.append("| " + " | ".join(str(c) for c in r) + " |")
    md += ["", "CPU time of each job (user + sys seconds):", ""]
    for k, x in m.items():
        if x:
            stolen = f", {x['steal_s']:.1f} s stolen" if x.get("steal_s") is not None else ""
            md.append(f"- {k}: {x['user_s']:.1f} user + {x['sys_s']:.1f} sys, wall {x['wall_s']:.2f}{stolen}"
                      + (f" (failed, exit {x['exit']})" if x["exit"] else ""))
    md.append("")
    with open(a.md, "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
