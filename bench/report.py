#!/usr/bin/env python3
"""Print the make bench results table and write it to bench/results-sf<SF>.md.

    report.py --measure DIR --sf SF --rows N --md FILE [--sf10-rows N] [--meta "key: value"]...

DIR holds the measure.py JSON files: ingot_first, ingot_again, ingot_redelivery, duckdb_hash,
duckdb_copy and, when SF10=1 was set, ingot_first_sf10.
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
    ap.add_argument("--meta", action="append", default=[])
    a = ap.parse_args()
    m = {k: load(a.measure, k) for k in
         ("ingot_first", "ingot_again", "ingot_redelivery", "duckdb_hash", "duckdb_copy", "ingot_first_sf10")}
    fa, fb, fc, dh, dc, f10 = (m[k] for k in m)

    def s(x):
        return f"{x['wall_s']:.2f}" if x else ""

    def mb(x):
        return f"{x['peak_rss_mb']:.0f}" if x else ""

    def verdict(ok: bool) -> str:
        return "yes" if ok else "NO"

    head = ["job", "ingot s", "duckdb s", "ratio", "ingot peak MiB", "duckdb peak MiB", "target", "met"]
    rows = []
    ratio_a = fa["wall_s"] / dh["wall_s"]
    rows.append([f"first ingest SF{a.sf} ({a.rows} rows)", s(fa), s(dh), f"{ratio_a:.2f}x",
                 mb(fa), mb(dh), "<=0.5x duckdb", verdict(ratio_a <= 0.5)])
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

    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    print(fmt(head))
    for r in rows:
        print(fmt(r))

    md = [f"# make bench: TPC-H lineitem SF{a.sf}, ingot vs DuckDB", ""]
    md += [f"- {x}" for x in a.meta]
    md += ["", "Wall-clock seconds and peak RSS (MiB) of each job, one process per measurement",
           "(`bench/measure.py`); ratio = ingot / duckdb, or / the first ingest where marked.", ""]
    md.append("| " + " | ".join(head) + " |")
    md.append("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        md.append("| " + " | ".join(str(c) for c in r) + " |")
    md += ["", "CPU time of each job (user + sys seconds):", ""]
    for k, x in m.items():
        if x:
            md.append(f"- {k}: {x['user_s']:.1f} user + {x['sys_s']:.1f} sys, wall {x['wall_s']:.2f}")
    md.append("")
    with open(a.md, "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
