#!/usr/bin/env python3
"""Make a vendor's corrected re-delivery of a lineitem CSV: exactly 3 rows changed.

    redeliver.py SRC.csv DST.csv CHANGES.json

Copies SRC to DST byte for byte except the l_comment of three data rows (the first, the middle
and the last), which gets the prefix "corrected ". Writes the natural keys of the changed rows to
CHANGES.json. DST and CHANGES.json are written under temporary names and renamed at the end, so
an interrupted run leaves nothing that looks finished.
"""
import json
import os
import sys

PREFIX = b"corrected "
NFIELDS = 16


def count_lines(path: str) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += chunk.count(b"\n")
    return n


def change(line: bytes) -> tuple[bytes, dict]:
    fields = line.rstrip(b"\n").split(b",", NFIELDS - 1)
    if len(fields) != NFIELDS:
        raise SystemExit(f"redeliver: unexpected line (not {NFIELDS} fields): {line!r}")
    comment = fields[-1]
    if comment.startswith(b'"'):
        fields[-1] = b'"' + PREFIX + comment[1:]
    else:
        fields[-1] = PREFIX + comment
    key = {"l_orderkey": int(fields[0]), "l_linenumber": int(fields[3])}
    return b",".join(fields) + b"\n", key


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, changes_path = sys.argv[1:]
    rows = count_lines(src) - 1  # minus the header line
    if rows < 3:
        raise SystemExit(f"redeliver: {src} has only {rows} data rows")
    targets = {1, (rows + 1) // 2, rows}  # 1-based data row numbers
    changed = []
    tmp = dst + ".tmp"
    with open(src, "rb") as fin, open(tmp, "wb", buffering=1 << 22) as fout:
        fout.write(fin.readline())  # header
        for i, line in enumerate(fin, start=1):
            if i in targets:
                line, key = change(line)
                key["data_row"] = i
                changed.append(key)
            fout.write(line)
    if len(changed) != 3:
        raise SystemExit(f"redeliver: changed {len(changed)} rows, expected 3")
    with open(changes_path + ".tmp", "w") as f:
        json.dump({"rows": rows, "changed": changed}, f, indent=1)
    os.replace(tmp, dst)
    os.replace(changes_path + ".tmp", changes_path)
    print(f"redeliver: {dst}: {rows} rows, l_comment changed in data rows "
          + ", ".join(str(c["data_row"]) for c in changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
