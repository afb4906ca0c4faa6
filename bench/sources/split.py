#!/usr/bin/env python3
"""Split a TPC-H lineitem CSV into two overlapping sources for the several-sources benchmark.

    split.py LINEITEM.csv OUT_DIR

Streams LINEITEM.csv (tpchgen-cli's: a header, 16 columns, only l_comment quoted) once and
writes, into OUT_DIR (each under a temporary name, renamed when whole):

  a.csv             source lineitem_a
  b.csv             source lineitem_b
  b-redelivery.csv  a later delivery of lineitem_b: 1,000 of its rows changed
  split.json        the counts the benchmark checks ingot's and DuckDB's results against

Every output row is the lineitem row plus a 17th column `l_updated` (a date: when the source
last changed the record; survivorship's order column), which is the row's l_receiptdate unless
said otherwise below.

The split is by l_orderkey (so every line of an order goes the same way), into 20 buckets by a
fixed integer hash (`bucket()`): buckets 0-8 go to A only, 9 to both A and B, 10-18 to B only,
19 to neither. So A and B each hold ~50% of the rows (~3.0M at SF1), ~10% of each source's keys
are also in the other (bucket 9, ~300k rows at SF1), A + B ~ the 6M rows of SF1, and the distinct
keys are ~95% of them (~5.7M).

In the overlap the sources differ, by a second hash of (l_orderkey, l_linenumber) (`vary()`):

* l_updated in B: the receipt date + 7 days when v % 4 in (0, 1) (B is newer), - 7 days when
  v % 4 == 2 (A is newer), the same when v % 4 == 3 (equal: the rank decides);
* l_shipinstruct in B: the next of the four TPC-H values (survivorship: most_recent by
  l_updated, so the silver value says which source won);
* l_comment in B: "b: " + A's comment when (v >> 8) % 3 == 0 (a listed conflict: flagged);
* l_extendedprice in B: A's + 1.00 when (v >> 16) % 2 == 0 (precedence: A's must survive);
* l_shipmode in A: empty, i.e. null, when (v >> 20) % 10 == 0 (precedence: B's fills the gap).

The re-delivery: 500 rows of B's overlap and 500 of B's own rows, spread evenly over b.csv,
each with l_comment "corrected " + its comment and l_updated + 30 days (newer than A's in
every case); the other rows of B are not in the file (lineitem_b is an incremental delivery).
"""
import datetime
import json
import os
import sys

SHIPINSTRUCT = [b"COLLECT COD", b"DELIVER IN PERSON", b"NONE", b"TAKE BACK RETURN"]
NEXT_INSTRUCT = {v: SHIPINSTRUCT[(i + 1) % 4] for i, v in enumerate(SHIPINSTRUCT)}
M32 = 0xFFFFFFFF
HEADER = (b"l_orderkey,l_partkey,l_suppkey,l_linenumber,l_quantity,l_extendedprice,l_discount,l_tax,"
          b"l_returnflag,l_linestatus,l_shipdate,l_commitdate,l_receiptdate,l_shipinstruct,l_shipmode,l_comment")
A_ONLY, BOTH, B_ONLY = range(0, 9), 9, range(10, 19)
REDELIVER_EACH = 500


def mix(x: int) -> int:
    """A 32-bit integer hash (murmur3's finaliser)."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & M32
    x ^= x >> 16
    return x


def bucket(orderkey: int) -> int:
    return mix(orderkey) % 20


def vary(orderkey: int, linenumber: int) -> int:
    return mix(orderkey * 8 + linenumber + 0x5BD1E995)


def shift(date: bytes, days: int) -> bytes:
    d = datetime.date.fromisoformat(date.decode()) + datetime.timedelta(days=days)
    return d.isoformat().encode()


def cents_plus_one(price: bytes) -> bytes:
    whole, frac = price.split(b".")
    c = int(whole) * 100 + int(frac) + 100
    return f"{c // 100}.{c % 100:02d}".encode()


def join(f: list) -> bytes:
    return b",".join(f) + b"\n"


def split(src: str, out: str) -> dict:
    n = dict(rows_in=0, rows_a=0, rows_b=0, overlap=0, dropped=0, b_newer=0, a_newer=0, same_updated=0,
             comment_differs=0, price_differs=0, a_shipmode_null=0)
    paths = {k: os.path.join(out, f"{k}.csv") for k in ("a", "b")}
    with open(src, "rb") as fin, \
            open(paths["a"] + ".tmp", "wb", buffering=1 << 22) as fa, \
            open(paths["b"] + ".tmp", "wb", buffering=1 << 22) as fb:
        head = fin.readline().rstrip(b"\r\n")
        if head != HEADER:
            raise SystemExit(f"split.py: {src}: unexpected header {head!r}")
        fa.write(head + b",l_updated\n")
        fb.write(head + b",l_updated\n")
        for line in fin:
            n["rows_in"] += 1
            f = line.rstrip(b"\n").split(b",", 15)  # l_comment (quoted, may hold commas) is the rest
            k = int(f[0])
            bk = bucket(k)
            if bk == 19:
                n["dropped"] += 1
                continue
            f.append(f[12])  # l_updated = l_receiptdate
            if bk != BOTH:
                (fa if bk in A_ONLY else fb).write(join(f))
                n["rows_a" if bk in A_ONLY else "rows_b"] += 1
                continue
            n["overlap"] += 1
            n["rows_a"] += 1
            n["rows_b"] += 1
            v = vary(k, int(f[3]))
            a, b = list(f), list(f)
            u = v % 4
            if u in (0, 1):
                b[16] = shift(f[12], 7)
                n["b_newer"] += 1
            elif u == 2:
                b[16] = shift(f[12], -7)
                n["a_newer"] += 1
            else:
                n["same_updated"] += 1
            b[13] = NEXT_INSTRUCT[f[13]]
            if (v >> 8) % 3 == 0:
                b[15] = b'"b: ' + f[15][1:]
                n["comment_differs"] += 1
            if (v >> 16) % 2 == 0:
                b[5] = cents_plus_one(f[5])
                n["price_differs"] += 1
            if (v >> 20) % 10 == 0:
                a[14] = b""
                n["a_shipmode_null"] += 1
            fa.write(join(a))
            fb.write(join(b))
    for p in paths.values():
        os.replace(p + ".tmp", p)
    return n


def redeliver(out: str, n: dict) -> None:
    """b-redelivery.csv from b.csv; adds the expected conflicts after it to `n`."""
    every = {True: max(1, n["overlap"] // REDELIVER_EACH), False: max(1, (n["rows_b"] - n["overlap"]) // REDELIVER_EACH)}
    seen = {True: 0, False: 0}
    taken = {True: 0, False: 0}
    new_conflicts = 0
    path = os.path.join(out, "b-redelivery.csv")
    with open(os.path.join(out, "b.csv"), "rb") as fin, open(path + ".tmp", "wb") as fout:
        fout.write(fin.readline())
        for line in fin:
            f = line.rstrip(b"\n").split(b",", 15)
            k = int(f[0])
            both = bucket(k) == BOTH
            seen[both] += 1
            if seen[both] % every[both] or taken[both] >= REDELIVER_EACH:
                continue
            taken[both] += 1
            comment, updated = f[15].rsplit(b",", 1)
            f[15] = b'"corrected ' + comment[1:] + b"," + shift(updated, 30)
            fout.write(join(f))
            if both and (vary(k, int(f[3])) >> 8) % 3 != 0:
                new_conflicts += 1  # its comment equalled A's before
    os.replace(path + ".tmp", path)
    n["redelivered_overlap"] = taken[True]
    n["redelivered_b_only"] = taken[False]
    n["redelivered"] = taken[True] + taken[False]
    n["conflicts_after_redelivery"] = n["comment_differs"] + new_conflicts


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    n = split(src, out)
    redeliver(out, n)
    n["distinct_keys"] = n["rows_a"] + n["rows_b"] - n["overlap"]
    tmp = os.path.join(out, "split.json.tmp")
    with open(tmp, "w") as f:
        json.dump(n, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "split.json"))
    print(f"split.py: {json.dumps(n)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
