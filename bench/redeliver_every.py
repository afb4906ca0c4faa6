#!/usr/bin/env python3
"""Make a re-delivery of a lineitem CSV with 1 row in EVERY changed (the silver benchmark).

    redeliver_every.py SRC.csv DST.csv EVERY

Copies SRC to DST byte for byte except the l_comment of data rows EVERY, 2 x EVERY, ...
(1-based), which gets the prefix "corrected " (l_comment is hashed, so each such row is a new
version of its record; it is not a column silver keeps). Prints the number of changed rows. DST
is written under a temporary name and renamed at the end.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redeliver import change  # noqa: E402


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
    changed = 0
    tmp = dst + ".tmp"
    with open(src, "rb") as fin, open(tmp, "wb", buffering=1 << 22) as fout:
        fout.write(fin.readline())  # header
        for i, line in enumerate(fin, start=1):
            if i % every == 0:
                line, _ = change(line)
                changed += 1
            fout.write(line)
    os.replace(tmp, dst)
    print(f"redeliver_every: {dst}: l_comment changed in {changed} rows (every {every}th)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
