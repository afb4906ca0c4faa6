#!/usr/bin/env python3
"""Recompute ingot's canonical text, row_hash and natural_key_fingerprint (docs/formats.md#hashes).

Independent cross-check for the Rust hashing module (stdlib only). Usage:

    python3 tests/py/recompute_hashes.py VECTORS.json

VECTORS.json is written by tests/it/hashing.rs:

    {"vectors": [{"version": 3,
                  "fields": [{"type": "utf8", "value": "a|b"}, {"type": "float64",
                              "bits": "3ff8000000000000"}, ...],
                  "canonical": ["a|b", "1.5", null, ...],   # what Rust wrote (null = null)
                  "row_hash": "<hex>", "fingerprint": "<hex>"}, ...],
     "pulls": [{"records": [3, 17, 3], "rejected": ["{\"id\":1}"], "hash": "<hex>"}, ...]}

A pull names vectors as its typed records (by index, a record may come twice) and gives the
lines of its rejected records; its hash is recomputed from docs/formats.md#file_hash-of-an-api-pull
over the digests recomputed here.

Typed values are given in a lossless raw form (float bit patterns, integers as decimal
strings, decimals as unscaled integer + scale, dates as days, timestamps as epoch value +
unit). Canonical text is derived here with Python's own float repr, decimal module and
datetime, never with the Rust rules. Exit status 0 when everything matches, 1 otherwise
(mismatches are printed), 2 on bad input.
"""

import datetime
import decimal
import hashlib
import json
import math
import struct
import sys

decimal.getcontext().prec = 200

EPOCH = datetime.datetime(1970, 1, 1)
TICKS_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def plain(d: decimal.Decimal) -> str:
    """Positional notation of a finite Decimal, no exponent, no trailing fraction zeros."""
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def float_text(x: float, shortest_repr) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    return plain(decimal.Decimal(shortest_repr(x)))


def shortest_f32(x: float) -> str:
    """Fewest significant digits that read back (as float32) to the same float32."""
    target = struct.pack("<f", x)
    for digits in range(1, 18):
        text = f"{x:.{digits - 1}e}"
        try:
            if struct.pack("<f", float(text)) == target:
                return text
        except OverflowError:  # rounded past float32's largest finite value
            continue
    raise ValueError(f"no round-trip text for float32 {x!r}")


def date_text(days: int) -> str:
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=days)).isoformat()


def timestamp_text(value: int, unit: str) -> str:
    per = TICKS_PER_SECOND[unit]
    seconds, ticks = divmod(value, per)  # floor division: instants before 1970 work
    text = (EPOCH + datetime.timedelta(seconds=seconds)).isoformat()  # zero-padded year
    if ticks:
        width = len(str(per)) - 1
        text += "." + str(ticks).rjust(width, "0").rstrip("0")
    return text + "Z"


def canonical(field: dict):
    """Canonical text of one typed field, or None for null."""
    kind = field["type"]
    if field.get("null"):
        return None
    if kind in ("utf8", "large_utf8", "utf8_view"):
        return field["value"]
    if kind in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        return str(int(field["value"]))
    if kind == "float64":
        (x,) = struct.unpack(">d", bytes.fromhex(field["bits"]))
        return float_text(x, repr)
    if kind == "float32":
        (x,) = struct.unpack(">f", bytes.fromhex(field["bits"]))
        return float_text(x, shortest_f32)
    if kind == "decimal":
        d = decimal.Decimal(int(field["unscaled"])).scaleb(-int(field["scale"]))
        return format(d, "f")
    if kind == "boolean":
        return "true" if field["value"] else "false"
    if kind == "date32":
        return date_text(int(field["days"]))
    if kind == "timestamp":
        return timestamp_text(int(field["value"]), field["unit"])
    raise ValueError(f"unknown field type {kind!r}")


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|")


def row_hash(texts) -> str:
    message = "1" + "".join("|" + ("\\N" if t is None else escape(t)) for t in texts)
    return hashlib.sha256(message.encode("utf-8")).hexdigest()


def fingerprint(version: int, texts) -> str:
    fields = ["" if t is None else t for t in texts]
    return hashlib.sha256(f"{version}|{'|'.join(fields)}".encode("utf-8")).hexdigest()


def pull_hash(typed, rejected) -> str:
    """The file_hash of an API pull: typed = [(fingerprint, row_hash)], rejected = [line bytes]."""
    elements = sorted(f"{fp}|{rh}" for fp, rh in typed)
    elements += sorted("rejected|" + hashlib.sha256(line).hexdigest() for line in rejected)
    message = "ingot-pull 1\n" + "".join(e + "\n" for e in elements)
    return hashlib.sha256(message.encode("ascii")).hexdigest()


def check_pulls(vectors, pulls) -> list:
    mismatches = []
    for i, pull in enumerate(pulls):
        typed = []
        for k in pull["records"]:
            texts = [canonical(f) for f in vectors[k]["fields"]]
            typed.append((fingerprint(vectors[k]["version"], texts), row_hash(texts)))
        rejected = [line.encode("utf-8") for line in pull["rejected"]]
        expected = pull_hash(typed, rejected)
        if expected != pull["hash"]:
            mismatches.append(f"pull {i}: python {expected} != rust {pull['hash']}")
    return mismatches


def check(vectors) -> list:
    mismatches = []
    for i, vector in enumerate(vectors):
        texts = [canonical(f) for f in vector["fields"]]
        for j, (ours, theirs) in enumerate(zip(texts, vector["canonical"])):
            if ours != theirs:
                mismatches.append(
                    f"vector {i} field {j} {vector['fields'][j]}: python {ours!r} != rust {theirs!r}"
                )
        expected = row_hash(texts)
        if expected != vector["row_hash"]:
            mismatches.append(f"vector {i} row_hash: python {expected} != rust {vector['row_hash']}")
        expected = fingerprint(vector["version"], texts)
        if expected != vector["fingerprint"]:
            mismatches.append(
                f"vector {i} fingerprint: python {expected} != rust {vector['fingerprint']}"
            )
    return mismatches


def main(argv) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} VECTORS.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        body = json.load(f)
    vectors, pulls = body["vectors"], body.get("pulls", [])
    if not vectors:
        print("no vectors", file=sys.stderr)
        return 2
    mismatches = check(vectors) + check_pulls(vectors, pulls)
    for line in mismatches[:50]:
        print(line)
    if len(mismatches) > 50:
        print(f"... and {len(mismatches) - 50} more")
    print(f"checked {len(vectors)} vectors and {len(pulls)} pulls, {len(mismatches)} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
