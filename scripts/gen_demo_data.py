#!/usr/bin/env python3
"""Deterministic demo data for ingot (hotel-marketing story).

Usage:  python3 scripts/gen_demo_data.py [--check]

Writes (after deleting them):
  data/landing/<source>/...   the files `ingot run` ingests, in sorted file-name order
  data/bad/...                run-level edge cases for the bookings contract (tests)
  data/partner/...            the partner channel manager's bookings (examples/partner, demo step 18)
  data/EXPECTED.md            per-file expected run outcome (docs/guide.md#ingest)
  data/expected.json          the same, machine-readable, row by row (below)

Nothing else is touched.  Python 3 standard library only.  Every random choice
comes from one `random.Random(SEED)`; no clock is read; running the script twice
gives byte-identical files.

The expectations are not hand-written: after writing the files the script reads
them back from disk, parses them against contracts/<source>.yaml with the rules
of docs/guide.md#contracts, docs/guide.md#ingest and docs/formats.md#hashes
(types, required, min/max/allowed/pattern on the normalized value,
natural_key_fingerprint, row_hash, in-file duplicates and natural-key conflicts,
comparison with the current version), and writes what an ingot run must report.  `--check` regenerates into a temporary directory and
fails if anything differs from what is on disk.

data/expected.json (json.dumps(sort_keys=True, indent=1), UTF-8) is the oracle the Rust
integration tests compare whole tables against:
  "landing": one object per landing file; sources sorted by name, files in sorted order, each
      source starting from an empty lake.  Keys: source, file (<source>/<name>), file_hash,
      file_bytes, status, rows_seen/inserted/updated/unchanged/failed,
      failures: audit.row_failure_log rows sorted by (source_row_number, rule), each
          {source_row_number, rule, natural_key_fingerprint, raw_payload}.  The fingerprint is
          null when it cannot be computed (a key field failed `type:` or `required:`, or the
          record is `malformed_record`).  raw_payload is the record exactly as in the file
          without its line terminator (CSV: a quoted line break stays inside; NDJSON: the line;
          invalid UTF-8 bytes as U+FFFD), except null for `natural_key_conflict` rows (ingot
          logs JSON of the typed row there, a format this oracle does not pin down).
      written: the rows the run appends to bronze.<source> (inserted + updated), sorted by
          source_row_number, each {source_row_number, natural_key_fingerprint, row_hash}.
  "current": {source: bronze.<source>_current after all its files, sorted by fingerprint, each
      {natural_key_fingerprint, row_hash, file, source_row_number}} (file/row of the version
      that is current: an unchanged re-delivery does not move it).
  "bad": one object per data/bad/*.csv ingested alone as `bookings` into an empty lake, same
      keys as a landing object (file is bad/<name>) plus outcome (= status).  Failed runs have
      all counts 0 and empty failures/written.
"""

import csv
import gzip
import hashlib
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation, getcontext

getcontext().prec = 100   # decimal(p,s) arithmetic is exact for any p <= 38

SEED = 20261101
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Column names reserved by ingot (docs/formats.md#tables; a contract may not use them).
RESERVED = {
    "ingestion_run_id", "file_hash", "row_hash", "natural_key_fingerprint",
    "natural_key_version", "contract_version", "source_row_number", "ingested_at",
    "rules_version", "anomaly_flags", "is_anomaly", "silver_build_id",
    "run_id", "source", "file_path", "file_bytes", "started_at", "finished_at",
    "status", "rows_seen", "rows_inserted", "rows_updated", "rows_unchanged",
    "rows_failed", "replay_of", "error", "ingot_version", "layer", "table",
    "raw_payload", "rule", "reason", "failed_at", "build_id", "rules_sha256",
    "mode", "rebuild_filter", "rows_read", "rows_written", "rows_filtered",
    "rows_rejected", "rows_flagged",
}


# ---------------------------------------------------------------------------
# A reader for the YAML subset the contracts in contracts/ use (block mappings,
# block sequences of mappings, flow lists of scalars, quoted/plain scalars).
# It refuses anything else, so the contracts stay the single source of truth.
# ---------------------------------------------------------------------------

def _strip_comment(line):
    out, q = [], None
    for ch in line:
        if q:
            if ch == q:
                q = None
        elif ch in "\"'":
            q = ch
        elif ch == "#" and (not out or out[-1] in " \t"):
            break
        out.append(ch)
    return "".join(out).rstrip()


def _scalar(text):
    t = text.strip()
    if t.startswith('"'):
        return json.loads(t)
    if t.startswith("'"):
        assert t.endswith("'"), t
        return t[1:-1].replace("''", "'")
    if t.startswith("["):
        assert t.endswith("]"), t
        inner = t[1:-1].strip()
        if not inner:
            return []
        items, cur, q = [], [], None
        for ch in inner:
            if q:
                cur.append(ch)
                if ch == q:
                    q = None
            elif ch in "\"'":
                q = ch
                cur.append(ch)
            elif ch == ",":
                items.append(_scalar("".join(cur)))
                cur = []
            else:
                cur.append(ch)
        items.append(_scalar("".join(cur)))
        return items
    if t in ("true", "false"):
        return t == "true"
    if t in ("null", "~"):
        return None
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    if re.fullmatch(r"-?\d+\.\d+", t):
        return Decimal(t)
    return t


def load_yaml_subset(path):
    lines = []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            s = _strip_comment(raw.rstrip("\n"))
            if s.strip():
                lines.append((len(s) - len(s.lstrip(" ")), s.strip()))
    pos = 0

    def block(indent):
        nonlocal pos
        if lines[pos][1].startswith("- "):
            seq = []
            while pos < len(lines) and lines[pos][0] == indent and lines[pos][1].startswith("- "):
                ind, text = lines[pos]
                lines[pos] = (ind + 2, text[2:])
                seq.append(block(ind + 2))
            return seq
        m = {}
        while pos < len(lines) and lines[pos][0] == indent and not lines[pos][1].startswith("- "):
            text = lines[pos][1]
            key, sep, rest = text.partition(":")
            assert sep, f"{path}: cannot read line {text!r}"
            key = key.strip()
            assert key not in m, f"{path}: duplicate key {key}"
            pos += 1
            if rest.strip():
                m[key] = _scalar(rest)
            else:
                assert pos < len(lines) and lines[pos][0] >= indent, f"{path}: empty {key}"
                m[key] = block(lines[pos][0])
        return m

    doc = block(0)
    assert pos == len(lines), f"{path}: unread line {lines[pos]}"
    return doc


def load_contract(source):
    c = load_yaml_subset(os.path.join(ROOT, "contracts", source + ".yaml"))
    assert c["source"] == source
    allowed_top = {"source", "version", "description", "format", "csv", "unknown_fields",
                   "fields", "natural_key", "resolve"}
    assert set(c) <= allowed_top, set(c) - allowed_top
    names = [f["name"] for f in c["fields"]]
    assert len(names) == len(set(names)), names
    for f in c["fields"]:
        assert set(f) <= {"name", "type", "required", "normalize", "format", "min", "max",
                          "allowed", "pattern", "volatile", "description"}, f
        assert f["name"] not in RESERVED, f["name"]
        assert re.fullmatch(r"string|int32|int64|float64|boolean|date|timestamp|decimal\(\d+,\d+\)",
                            f["type"]), f["type"]
    for k in c["natural_key"]["fields"]:
        assert k in names, k
    return c


# ---------------------------------------------------------------------------
# Typing, normalizing, canonical text and hashes (docs/guide.md#contracts, docs/formats.md#hashes)
# ---------------------------------------------------------------------------

class Bad(Exception):
    pass


TS_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2})"
                   r"(?::([0-9]{2})(?:\.([0-9]{1,9}))?)?(Z|z|[+-][0-9]{2}:[0-9]{2})?")
INT_RE = re.compile(r"[+-]?[0-9]+")
FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?i:inf|infinity|nan)")
DEC_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)")
BOOL_TEXT = {"true": True, "t": True, "yes": True, "y": True, "1": True,
             "false": False, "f": False, "no": False, "n": False, "0": False}


def parse_value(ftype, fmt, v):
    """v: the text of one field (a CSV field, or a JSON scalar as text, see json_text).
    Returns a typed value; raises Bad.

    Strings are kept exactly (only `normalize` changes what is hashed and checked); every other
    type is trimmed of surrounding white space first.  Integers, floats and decimals are strict and
    lossless: out of range, or more fraction digits than the scale (other than trailing zeros),
    or a timestamp finer than microseconds is a type failure, never a rounding."""
    if not isinstance(v, str):
        raise Bad("not a scalar")                    # JSON array or object
    try:
        v.encode("utf-8")                            # surrogate escapes = invalid UTF-8 bytes
    except UnicodeEncodeError:
        raise Bad("invalid UTF-8")
    if ftype == "string":
        return v
    t = v.strip()
    if ftype in ("int32", "int64"):
        if not INT_RE.fullmatch(t):
            raise Bad("not an integer")
        n = int(t)
        lim = 2 ** 31 if ftype == "int32" else 2 ** 63
        if not -lim <= n < lim:
            raise Bad("out of range")
        return n
    if ftype == "float64":
        if not FLOAT_RE.fullmatch(t):
            raise Bad("not a float")
        return float(t)
    if ftype.startswith("decimal("):
        p, s = map(int, re.fullmatch(r"decimal\((\d+),(\d+)\)", ftype).groups())
        if not DEC_RE.fullmatch(t):
            raise Bad("not a decimal")
        d = Decimal(t)
        q = d.quantize(Decimal(1).scaleb(-s))
        if q != d:
            raise Bad("too many decimals")
        if abs(q.scaleb(s)) >= Decimal(10) ** p:
            raise Bad("precision")
        if q == 0:
            q = abs(q)                               # no "-0.00": the value is an unscaled integer
        return q
    if ftype == "boolean":
        b = BOOL_TEXT.get(t.lower())
        if b is None:
            raise Bad("not a boolean")
        return b
    if ftype == "date":
        try:
            if fmt:
                return datetime.strptime(t, fmt).date()
            if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", t):
                raise ValueError
            return date.fromisoformat(t)
        except ValueError:
            raise Bad("not a date")
    if ftype == "timestamp":
        assert not fmt
        m = TS_RE.fullmatch(t)
        if not m:
            raise Bad("not a timestamp")
        y, mo, d, h, mi, se, frac, tz = m.groups()
        if frac is not None and se is None:
            raise Bad("not a timestamp")
        try:
            base = datetime(int(y), int(mo), int(d), int(h), int(mi), int(se or 0), tzinfo=timezone.utc)
        except ValueError:
            raise Bad("not a timestamp")
        if tz and tz not in "Zz":                    # no offset at all means UTC
            sign = 1 if tz[0] == "+" else -1
            base -= sign * timedelta(hours=int(tz[1:3]), minutes=int(tz[4:6]))
        nanos = int((frac or "").ljust(9, "0"))
        if nanos % 1000:
            raise Bad("finer than microseconds")
        return (base, nanos)
    raise AssertionError(ftype)


def json_text(v):
    """A JSON value as the text ingot types it from: strings as they are, numbers in their JSON
    text, booleans true/false; null -> None; arrays/objects are passed through (type failure)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    return v


def normalize(steps, v):
    for st in steps or []:
        if st == "trim":
            v = v.strip()
        elif st == "lower":
            v = v.lower()
        elif st == "upper":
            v = v.upper()
        else:
            raise AssertionError(f"normalize step {st} not used by the demo contracts")
    return v


def float_text(x):
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    r = repr(x)
    if "e" in r or "E" in r:
        r = format(Decimal(r), "f")
    if r.endswith(".0"):
        r = r[:-2]
    return r


def canonical(ftype, v):
    if v is None:
        return None
    if ftype == "string":
        return v
    if ftype in ("int32", "int64"):
        return str(v)
    if ftype == "float64":
        return float_text(v)
    if ftype.startswith("decimal("):
        return format(v, "f")
    if ftype == "boolean":
        return "true" if v else "false"
    if ftype == "date":
        return v.isoformat()
    if ftype == "timestamp":
        dt, nanos = v
        s = dt.strftime("%Y-%m-%dT%H:%M:%S")
        if nanos:
            s += "." + str(nanos).rjust(9, "0").rstrip("0")
        return s + "Z"
    raise AssertionError(ftype)


def sha(s):
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def fingerprint(contract, canon):
    nk = contract["natural_key"]
    parts = [canon[k] if canon[k] is not None else "" for k in nk["fields"]]
    return sha(f"{nk['version']}|" + "|".join(parts))


def row_hash(contract, canon):
    parts = []
    for f in contract["fields"]:
        if f.get("volatile"):
            continue
        c = canon[f["name"]]
        parts.append("\\N" if c is None else c.replace("\\", "\\\\").replace("|", "\\|"))
    return sha("1|" + "|".join(parts))


def check_record(contract, rec):
    """rec: {field: text or None}. Returns (canonical dict, [rules failed], key_ok).

    Per field, in contract order: type, then required (null or missing), then min, max, allowed,
    pattern on the normalized value.  key_ok is False when a natural-key field failed its type or
    was a missing required value: the fingerprint cannot be computed then."""
    failures, canon, key_ok = [], {}, True
    keys = set(contract["natural_key"]["fields"])
    for f in contract["fields"]:
        name, ftype = f["name"], f["type"]
        raw = rec.get(name)
        try:
            val = None if raw is None else parse_value(ftype, f.get("format"), raw)
        except Bad:
            failures.append(f"type:{name}")
            canon[name] = None
            key_ok = key_ok and name not in keys
            continue
        if ftype == "string" and val is not None:
            val = normalize(f.get("normalize"), val)
        if val is None:
            if f.get("required"):
                failures.append(f"required:{name}")
                key_ok = key_ok and name not in keys
            canon[name] = None
            continue
        if "min" in f and val < f["min"]:
            failures.append(f"min:{name}")
        if "max" in f and val > f["max"]:
            failures.append(f"max:{name}")
        c = canonical(ftype, val)
        if "allowed" in f and c not in [str(a) for a in f["allowed"]]:
            failures.append(f"allowed:{name}")
        if "pattern" in f and not re.search(f["pattern"], c):
            failures.append(f"pattern:{name}")
        canon[name] = c
    return canon, failures, key_ok


# ---------------------------------------------------------------------------
# Reading a landing file back the way ingot must (BOM, CRLF, quotes, gzip, NDJSON)
# ---------------------------------------------------------------------------

class RunFails(Exception):
    pass


def lossy(text):
    """Text decoded with surrogateescape -> the same bytes decoded with U+FFFD replacement
    (what Rust's String::from_utf8_lossy gives for a raw_payload with invalid UTF-8)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def split_csv_records(text, delim, quote):
    """Yields (raw_text, fields) per CSV record, like csv-core: a quote opens a quoted field only
    at the start of a field, "" inside quotes is one quote, a line break inside quotes is data,
    \n, \r and \r\n end a record, empty lines are skipped.  raw_text is the record exactly as in
    the file without its line terminator."""
    out = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in "\r\n":
            i += 1                                   # empty line (or the \n of \r\n)
            continue
        start, fields, cur, state = i, [], [], "start"
        while i < n:
            ch = text[i]
            if state == "quoted":
                if ch == quote:
                    state = "quote_in_quoted"
                else:
                    cur.append(ch)
                i += 1
                continue
            if state == "quote_in_quoted" and ch == quote:
                cur.append(quote)
                state = "quoted"
                i += 1
                continue
            if ch in "\r\n":
                break
            if ch == delim:
                fields.append("".join(cur))
                cur, state = [], "start"
            elif state == "start" and ch == quote:
                state = "quoted"
            else:
                cur.append(ch)
                state = "unquoted"
            i += 1
        fields.append("".join(cur))
        out.append((text[start:i], fields))
        if i < n and text[i] == "\r" and i + 1 < n and text[i + 1] == "\n":
            i += 1
        i += 1
    return out


def read_records(contract, path):
    """Returns [(record_number, rec or None, raw_payload, extra_rule)]. Raises RunFails.

    rec maps contract fields to their text (None for null or missing); raw_payload is the record
    as it arrived (CSV record / NDJSON line without its line terminator, invalid UTF-8 bytes as
    U+FFFD).  extra_rule is set when the record is rejected as a whole (malformed_record)."""
    data = open(path, "rb").read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    names = [f["name"] for f in contract["fields"]]
    required = [f["name"] for f in contract["fields"] if f.get("required")]
    if contract["format"] == "ndjson":
        out = []
        for line in data.split(b"\n"):
            line = line.rstrip(b"\r\n")
            if all(b in b" \t\r\n\x0c" for b in line):
                continue                             # blank lines are not records
            recno = len(out) + 1
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                out.append((recno, None, line.decode("utf-8", "replace"), "malformed_record"))
                continue

            def no_constant(c):
                raise ValueError(c)                  # NaN / Infinity are not JSON
            try:
                obj = json.loads(text, parse_constant=no_constant)
            except ValueError:
                obj = None
            if not isinstance(obj, dict):
                out.append((recno, None, text, "malformed_record"))
                continue
            unknown = set(obj) - set(names)
            if unknown and contract.get("unknown_fields", "reject") == "reject":
                raise RunFails(f"unknown field(s) {sorted(unknown)}")
            out.append((recno, {k: json_text(obj.get(k)) for k in names}, text, None))
        return out
    opts = contract.get("csv", {})
    nulls = opts.get("null_values", [""])
    text = data.decode("utf-8", errors="surrogateescape")
    delim, quote = opts.get("delimiter", ","), opts.get("quote", '"')
    records = split_csv_records(text, delim, quote)
    # cross-check the record splitter against Python's csv module on every file we wrote
    ref = [r for r in csv.reader(io.StringIO(text, newline=""), delimiter=delim, quotechar=quote, strict=True) if r]
    assert ref == [f for _, f in records], path
    if not records:
        raise RunFails("file is empty (no header)")
    header = [h.strip() for h in records[0][1]]
    if any(lossy(h) != h for h in header):
        raise RunFails("header is not valid UTF-8")
    unknown = [h for h in header if h not in names]
    if unknown and contract.get("unknown_fields", "reject") == "reject":
        raise RunFails(f"unknown column(s) {unknown} (unknown_fields: reject)")
    missing = [n for n in required if n not in header]
    if missing:
        raise RunFails(f"required column(s) missing from the header: {missing}")
    out = []
    for i, (raw, row) in enumerate(records[1:]):
        if len(row) != len(header):
            out.append((i + 1, None, lossy(raw), "malformed_record"))
            continue
        rec = {}
        for h, v in zip(header, row):
            if h in names:
                rec[h] = None if v in nulls else v   # null markers match the raw field text
        out.append((i + 1, rec, lossy(raw), None))
    return out


def oracle_name(path):
    """data/landing/<source>/<file> -> <source>/<file>; data/bad/<file> -> bad/<file>."""
    rel = os.path.relpath(path, os.path.join(ROOT, "data")).replace(os.sep, "/")
    return rel[len("landing/"):] if rel.startswith("landing/") else rel


def ingest(contract, path, state):
    """Simulates one ingest run.
    state: {"hashes": set, "current": {fp: (row_hash, file, source_row_number)}, "bronze_rows": n}.

    res["failures"]: (recno, rule[, other recnos]) for EXPECTED.md; res["fail_rows"] and
    res["written"]: the rows of audit.row_failure_log and bronze.<source> this run writes, for
    data/expected.json."""
    fh = hashlib.sha256(open(path, "rb").read()).hexdigest()
    name = oracle_name(path)
    res = {"file": os.path.relpath(path, ROOT), "name": name, "source": contract["source"],
           "file_hash": fh, "bytes": os.path.getsize(path),
           "seen": 0, "inserted": 0, "updated": 0, "unchanged": 0, "failed": 0, "failures": [],
           "fail_rows": [], "written": [], "status": None, "error": None}
    if fh in state["hashes"]:
        res["status"] = "skipped_duplicate_file"
        return res
    try:
        records = read_records(contract, path)
    except RunFails as e:
        res["status"], res["error"] = "failed", str(e)
        return res
    res["seen"] = len(records)

    def fail(recno, rule, fp, raw, others=None):
        res["failures"].append((recno, rule) if others is None else (recno, rule, others))
        res["fail_rows"].append({"source_row_number": recno, "rule": rule,
                                 "natural_key_fingerprint": fp, "raw_payload": raw})

    valid = []                       # (recno, fp, rh)
    for recno, rec, raw, extra in records:
        if extra:
            fail(recno, extra, None, raw)
            continue
        canon, fails, key_ok = check_record(contract, rec)
        if fails:
            assert len(fails) == 1, f"{path} record {recno} fails several rules {fails}: keep demo rows single-fault"
            fail(recno, fails[0], fingerprint(contract, canon) if key_ok else None, raw)
            continue
        valid.append((recno, fingerprint(contract, canon), row_hash(contract, canon)))
    groups = {}
    for recno, fp, rh in valid:
        groups.setdefault(fp, []).append((recno, rh))
    new_current = dict(state["current"])
    for recno, fp, rh in valid:
        g = groups[fp]
        if len({h for _, h in g}) > 1:
            others = [n for n, _ in g if n != recno]
            # raw_payload of a conflict row is JSON of its typed fields on the Rust side; that
            # format is not pinned down, so the oracle leaves it null (tests skip it).
            fail(recno, "natural_key_conflict", fp, None, others)
            continue
        if g[0][0] != recno:
            res["unchanged"] += 1            # in-file exact duplicate
            continue
        old = state["current"].get(fp)
        if old is not None and old[0] == rh:
            res["unchanged"] += 1            # not written again; current keeps the old version
            continue
        res["inserted" if old is None else "updated"] += 1
        res["written"].append({"source_row_number": recno, "natural_key_fingerprint": fp, "row_hash": rh})
        new_current[fp] = (rh, name, recno)
    res["failures"].sort(key=lambda t: (t[0], t[1]))
    res["fail_rows"].sort(key=lambda r: (r["source_row_number"], r["rule"]))
    res["written"].sort(key=lambda r: r["source_row_number"])
    res["failed"] = len(res["failures"])
    assert res["seen"] == res["inserted"] + res["updated"] + res["unchanged"] + res["failed"]
    res["status"] = "succeeded_with_failures" if res["failed"] else "succeeded"
    state["hashes"].add(fh)
    state["current"] = new_current
    state["bronze_rows"] += res["inserted"] + res["updated"]
    return res


# ---------------------------------------------------------------------------
# Writing helpers
# ---------------------------------------------------------------------------

def csv_field(v):
    if v is None:
        return ""
    s = str(v)
    if any(c in s for c in ',"\r\n') or s != s.strip():
        return '"' + s.replace('"', '""') + '"'
    return s


def csv_bytes(header, rows, eol="\n", bom=False):
    lines = [",".join(header)] + [",".join(csv_field(v) for v in r) for r in rows]
    data = (eol.join(lines) + eol).encode("utf-8")
    return (b"\xef\xbb\xbf" + data) if bom else data


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def gzip_bytes(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="", compresslevel=9) as g:
        g.write(data)
    return buf.getvalue()


def money(cents):
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100}.{cents % 100:02d}"


def days(start, n):
    return [start + timedelta(days=i) for i in range(n)]


# ---------------------------------------------------------------------------
# The story
# ---------------------------------------------------------------------------

HOTELS = [  # code, name, city, country, rooms, opened_on
    ("AMS01", "Canal House Amsterdam", "Amsterdam", "NL", 84, "2009-04-01"),
    ("AMS02", "Zuidas Business Hotel", "Amsterdam", "NL", 212, "2016-09-15"),
    ("RTM01", "Maas Harbour Hotel", "Rotterdam", "NL", 120, "2012-03-01"),
    ("BER01", "Spree Loft Berlin", "Berlin", "DE", 156, "2011-05-20"),
    ("BER02", "Kreuzberg Yard", "Berlin", "DE", 64, "2019-06-01"),
    ("MUC01", "Isar Garden Hotel", "Munich", "DE", 98, "2005-02-14"),
    ("HAM01", "Elbe Warehouse Hotel", "Hamburg", "DE", 143, "2014-10-01"),
    ("PAR01", "Hotel Marais Lumiere", "Paris", "FR", 72, "2003-01-10"),
    ("PAR02", "Montmartre Terrace", "Paris", "FR", 48, "2018-04-01"),
    ("NCE01", "Promenade Bleue", "Nice", "FR", 90, "2010-06-15"),
    ("BCN01", "Eixample Courtyard", "Barcelona", "ES", 130, "2013-07-01"),
    ("MAD01", "Gran Via Rooftop", "Madrid", "ES", 175, "2015-03-19"),
    ("ROM01", "Hotel Roma Centrale", "Rome", "IT", 110, "2001-09-01"),
    ("MIL01", "Navigli Design Hotel", "Milan", "IT", 66, "2017-02-01"),
    ("LON01", "Southbank Quarters", "London", "GB", 240, "2008-11-11"),
    ("EDI01", "Old Town Wynd Hotel", "Edinburgh", "GB", 58, "2012-08-01"),
    ("LIS01", "Alfama Azulejo Hotel", "Lisbon", "PT", 77, "2016-05-05"),
    ("BRU01", "Sablon Residence", "Brussels", "BE", 95, "2010-01-20"),
    ("VIE01", "Ringstrasse Hof", "Vienna", "AT", 134, "2007-12-01"),
    ("ZRH01", "Limmat Quay Hotel", "Zurich", "CH", 88, "2014-04-15"),
]
NEW_HOTEL = ("POR01", "Ribeira Wine Hotel", "Porto", "PT", 52, "2026-10-01")
CURRENCY = {"GB": "GBP", "CH": "CHF"}
FIRST = ["anna", "ben", "chloe", "david", "emma", "felix", "giulia", "hugo", "ines", "jan",
         "katja", "lucas", "marie", "nils", "olivia", "pablo", "quinn", "rosa", "sven", "tess",
         "umberto", "vera", "willem", "xavier", "yara", "zoe"]
LAST = ["smith", "de.vries", "muller", "martin", "garcia", "rossi", "jansen", "schmidt",
        "dubois", "lopez", "bianchi", "brown", "silva", "peeters", "huber", "meier"]
DOMAINS = ["example.com", "example.org", "mail.example.net", "example.de", "example.fr"]
CHANNELS_CLEAN = ["direct", "booking_com", "expedia", "agency"]
CHANNELS_MESSY = ["Booking.com", "bcom", " Direct", "EXPEDIA", "Agency "]

BOOKING_HEADER = ["booking_ref", "hotel_code", "guest_email", "channel", "booking_status",
                  "check_in", "check_out", "nights", "amount", "currency", "notes", "exported_at"]
SPEND_HEADER = ["hotel_code", "day", "channel", "campaign", "spend", "clicks", "impressions"]
HOTEL_HEADER = ["hotel_code", "hotel_id", "name", "city", "country", "rooms", "opened_on"]


def gen_hotels(rng):
    ids = rng.sample(range(1001, 1100), len(HOTELS))
    day1 = [[code, hid, name, city, cc, rooms, opened]
            for (code, name, city, cc, rooms, opened), hid in zip(HOTELS, ids)]
    day2 = [list(r) for r in day1]
    for r in day2:
        if r[0] == "PAR02":
            r[1] = 2044                                   # PMS migration re-numbered it
        if r[0] == "ROM01":
            r[2] = "Roma Centrale Boutique Hotel"          # renamed
    code, name, city, cc, rooms, opened = NEW_HOTEL
    day2.append([code, 2045, name, city, cc, rooms, opened])
    return day1, day2


class Booking(dict):
    pass


def booking_row(b):
    return [b[h] for h in BOOKING_HEADER]


def gen_bookings(rng, hotel_codes):
    country = {h[0]: h[3] for h in HOTELS}
    country[NEW_HOTEL[0]] = NEW_HOTEL[3]
    next_ref = [100001]

    def email():
        r = rng.random()
        if r < 0.06:
            return "NA"                                   # null by null_values
        return f"{rng.choice(FIRST)}.{rng.choice(LAST)}@{rng.choice(DOMAINS)}"

    def new(hotel=None, exported=None):
        hotel = hotel or rng.choice(hotel_codes)
        ci = date(2026, 11, 5) + timedelta(days=rng.randint(0, 110))
        nights = rng.choice([1, 1, 2, 2, 2, 3, 3, 4, 5, 7])
        rate = rng.randint(7900, 34900)
        r = rng.random()
        st = "confirmed" if r < 0.86 else ("cancelled" if r < 0.97 else "no_show")
        ch = rng.choice(CHANNELS_MESSY) if rng.random() < 0.1 else rng.choice(CHANNELS_CLEAN)
        b = Booking(booking_ref=f"BK{next_ref[0]}", hotel_code=hotel, guest_email=email(),
                    channel=ch, booking_status=st, check_in=ci.isoformat(),
                    check_out=(ci + timedelta(days=nights)).isoformat(), nights=nights,
                    amount=money(rate * nights), currency=CURRENCY.get(country.get(hotel), "EUR"),
                    notes=None, exported_at=None)
        if rng.random() < 0.05:
            b["notes"] = rng.choice(["late arrival", "sea view requested", "honeymoon",
                                     "late arrival, after 22:00", "allergic to feathers"])
        next_ref[0] += rng.randint(1, 3)
        return b

    rows = [new() for _ in range(290)]
    tags = {}                                             # tag -> Booking (by identity)

    def put(pos, b, tag):
        rows.insert(pos, b)
        tags[tag] = b

    ann = new("AMS01")
    ann["guest_email"] = "  Ann.Smith@Example.COM "
    put(17, ann, "ann")
    b = new(); b["amount"] = "abc"; put(41, b, "bad_amount_type")
    b = new(); b["check_in"] = "2026-13-45"; put(63, b, "bad_check_in")
    b = new(); b["booking_ref"] = None; put(88, b, "missing_ref")
    b = new(); b["amount"] = "-120.00"; put(104, b, "negative_amount")
    b = new(); b["currency"] = "eur1"; put(129, b, "bad_currency")
    b = new(); b["booking_status"] = "tentative"; put(150, b, "bad_status")
    c1 = new("BER01")
    c2 = Booking(c1); c2["amount"] = money(int(Decimal(c1["amount"]) * 100) + 4500)
    put(170, c1, "conflict_a"); put(212, c2, "conflict_b")
    d = new("PAR01"); put(190, d, "dup_a"); put(191, Booking(d), "dup_b")
    s1 = new("AMS01"); s2 = new("BER01"); s2["booking_ref"] = s1["booking_ref"]
    put(230, s1, "shared_ref_ams"); put(231, s2, "shared_ref_ber")
    k = new(); k["check_out"] = (date.fromisoformat(k["check_in"]) - timedelta(days=2)).isoformat()
    put(250, k, "checkout_before_checkin")
    t = new("AMS01"); t["booking_ref"] = "TEST0001"; t["notes"] = "test booking, please ignore"
    put(270, t, "test_booking")
    base = datetime(2026, 11, 1, 2, 0, 0)
    for i, b in enumerate(rows):
        b["exported_at"] = (base + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
    # dup_b must be byte-identical to dup_a, including exported_at
    tags["dup_b"]["exported_at"] = tags["dup_a"]["exported_at"]
    day1 = rows

    # day 3: BOM + CRLF, 20 new bookings, one multi-line note, new hotel, unknown hotel
    day3 = []
    base3 = datetime(2026, 11, 3, 2, 0, 0)
    for i in range(20):
        hotel = "POR01" if i in (3, 11) else ("OPO02" if i == 15 else None)
        b = new(hotel)
        if hotel == "OPO02":
            b["currency"] = "EUR"
        b["notes"] = None
        if i == 7:
            b["notes"] = "Guest asks for a cot,\nand a late check-out"
        if i == 12:
            b["notes"] = 'VIP: "repeat guest"'
        b["exported_at"] = (base3 + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
        day3.append(b)

    # day 4: corrected re-delivery of day 1
    changed = {}
    good = [b for b in day1 if b not in tags.values() and b["booking_status"] == "confirmed"
            and b["guest_email"] != "NA"]
    amount_fix = [good[20], good[120]]
    status_fix = good[200]
    retype = [b for b in good[30:260:20] if b not in amount_fix and b is not status_fix]
    day4 = []
    base4 = datetime(2026, 11, 4, 3, 30, 0)
    for i, b0 in enumerate(day1):
        if b0 is tags["conflict_b"]:
            continue                                        # the PMS kept one of the two
        b = Booking(b0)
        b["exported_at"] = (base4 + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
        if b0 is tags["dup_b"]:
            b["exported_at"] = day4[-1]["exported_at"]       # still an exact duplicate line
        if any(b0 is x for x in amount_fix):
            b["amount"] = money(int(Decimal(b0["amount"]) * 100) - 1000)
            changed.setdefault("amount", []).append(b0["booking_ref"])
        if b0 is status_fix:
            b["booking_status"] = "cancelled"
            changed["status"] = [b0["booking_ref"]]
        if any(b0 is x for x in retype):
            e = b0["guest_email"]
            n = retype.index(b0) % 3
            b["guest_email"] = [e.upper(), " " + e.title() + "  ", e.capitalize() + " "][n]
        if b0 is tags["ann"]:
            b["guest_email"] = "ann.smith@example.com"
        if b0 is tags["bad_amount_type"]:
            b["amount"] = money(rng.randint(9000, 40000))
        if b0 is tags["bad_check_in"]:
            b["check_in"] = (date.fromisoformat(b0["check_out"]) - timedelta(days=b0["nights"])).isoformat()
        if b0 is tags["bad_currency"]:
            b["currency"] = "EUR"
        day4.append(b)
    info = {"tags": tags, "day1": day1, "day3": day3, "day4": day4, "amount_fix": amount_fix,
            "status_fix": status_fix, "retype": retype}
    return info


def gen_spend(rng):
    plan = {
        "AMS01": [("google_ads", "brand"), ("google_ads", "retargeting"), ("meta", "winter_sale")],
        "BER01": [("google_ads", "brand"), ("meta", "winter_sale")],
        "PAR01": [("google_ads", "brand"), ("tripadvisor", "sponsored")],
        "BCN01": [("google_ads", "brand"), ("meta", "winter_sale"), ("tripadvisor", "sponsored")],
        "LON01": [("google_ads", "brand"), ("meta", "retargeting")],
    }
    all_days = days(date(2026, 10, 3), 30)                 # 2026-10-03 .. 2026-11-01

    def row(hotel, d, ch, camp):
        clicks = rng.randint(3, 180)
        cpc = rng.randint(18, 95)                          # cents per click
        impressions = clicks * rng.randint(25, 70)
        return [hotel, d.isoformat(), ch, camp, money(clicks * cpc), clicks, impressions]

    rows = {}
    for d in all_days:
        for hotel, pairs in plan.items():
            for ch, camp in pairs:
                rows[(hotel, d, ch, camp)] = row(hotel, d, ch, camp)
    lis = [("google_ads", "brand"), ("meta", "winter_sale")]
    for d in all_days[-7:]:                                # LIS01 comes back in the last week
        for ch, camp in lis:
            rows[("LIS01", d, ch, camp)] = row("LIS01", d, ch, camp)
    for d in all_days[11:14]:                              # agency uses a code the PMS lacks
        rows[("MAD99", d, "google_ads", "brand")] = row("MAD99", d, "google_ads", "brand")
    neg = rows[("BER01", date(2026, 10, 8), "meta", "winter_sale")]
    neg[4], neg[5], neg[6] = "-35.20", 0, 0                # refund credited by Meta
    bad = rows[("PAR01", date(2026, 10, 15), "tripadvisor", "sponsored")]
    bad[5] = "12k"                                        # type:clicks

    def ordered(lo, hi):
        return [r for k, r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2], kv[0][3]))
                if lo <= k[1] <= hi]

    backfill = row("LIS01", date(2025, 10, 10), "google_ads", "brand")
    part1 = [backfill] + ordered(date(2026, 10, 3), date(2026, 10, 12))
    part2 = ordered(date(2026, 10, 13), date(2026, 10, 22))
    part3 = [list(r) for r in ordered(date(2026, 10, 21), date(2026, 11, 1))]
    restated = 0
    for r in part3:                                        # google restates its 10-22 spend
        if r[1] == "2026-10-22" and r[2] == "google_ads":
            r[4] = money(int(Decimal(r[4]) * 100) + rng.randint(1, 250))
            restated += 1
    return part1, part2, part3, restated


def gen_sessions(rng):
    hotels = ["AMS01", "BER01", "PAR01", "BCN01", "LON01"]
    pages = ["/", "/rooms", "/offers", "/book", "/gallery", "/location"]
    all_days = days(date(2026, 10, 19), 14)                # 2026-10-19 .. 2026-11-01
    spike_day = date(2026, 10, 30)
    by_day = {}

    def sess(hotel, d, bot=False):
        secs = rng.randint(6 * 3600, 23 * 3600)
        frac = rng.choice(["", "", ".25", ".5", ".125", ".75", ".04", ".333"])
        ts = datetime(d.year, d.month, d.day) + timedelta(seconds=secs)
        if bot:
            pv, dur, dev, page, conv = 1, rng.randint(5, 40) / 100, "desktop", "/", False
        else:
            pv = rng.randint(1, 12)
            dur = rng.randint(800, 90000) / 100 if rng.random() < 0.9 else float(rng.randint(10, 600))
            dev = rng.choice(["desktop", "mobile", "mobile", "tablet"])
            page = rng.choice(pages)
            conv = rng.random() < 0.08
        return {"session_id": f"ws_{rng.getrandbits(64):016x}", "hotel_code": hotel,
                "day": d.isoformat(), "session_started_at": ts.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z",
                "landing_page": page, "device": dev, "pageviews": pv, "duration_s": dur,
                "converted": conv}

    for d in all_days:
        lst = []
        for h in hotels:
            n = 3 if h == "AMS01" else rng.randint(1, 4)
            if h == "AMS01" and d == spike_day:
                lst += [sess(h, d, bot=True) for _ in range(37)]
            lst += [sess(h, d) for _ in range(n)]
        lst.sort(key=lambda s: (s["session_started_at"], s["session_id"]))
        by_day[d] = lst
    week1 = [s for d in all_days[:7] for s in by_day[d]]
    week2 = [s for d in all_days[7:] for s in by_day[d]]
    # the analytics tool's daily counts of these same sessions (site_traffic), taken before the
    # story below damages single objects of the per-session export
    daily = {}
    for d in all_days:
        for s in by_day[d]:
            c = daily.setdefault((s["hotel_code"], d), [0, 0, 0])
            c[0] += 1
            c[1] += s["pageviews"]
            c[2] += s["converted"]
    # story rows
    extra = next(s for s in week1 if s["hotel_code"] == "BER01" and s["day"] == "2026-10-21")
    extra["utm_source"] = "newsletter"                      # unknown key, dropped (ignore)
    many = next(s for s in week1 if s["hotel_code"] == "PAR01" and s["day"] == "2026-10-23")
    many["pageviews"] = "many"                              # type:pageviews
    # late re-delivery: PAR01's sessions of 2026-10-25 again, one now converted
    resent = [dict(s) for s in by_day[all_days[6]] if s["hotel_code"] == "PAR01"]
    flip = next(s for s in resent if not s["converted"])
    flip["converted"] = True
    noid = next(s for s in week2 if s["hotel_code"] == "LON01" and s["day"] == "2026-10-28")
    del noid["session_id"]                                  # required:session_id
    tv = next(s for s in week2 if s["hotel_code"] == "BCN01" and s["day"] == "2026-10-29")
    tv["device"] = "smart_tv"                               # allowed:device
    week2 = resent + week2
    return week1, week2, {"spike_day": spike_day, "resent": len(resent), "flip": flip["session_id"],
                          "flip_day": all_days[6], "days": all_days, "daily": daily}


TRAFFIC_HEADER = ["hotel_code", "day", "sessions", "pageviews", "conversions"]


def gen_traffic(rng, winfo):
    """site_traffic: the analytics tool's daily export per hotel website.  Four weeks of history
    before the per-session export starts (2026-09-21..10-18, counts simulated like the sessions:
    AMS01 2-4 a day, the others 1-4), then exactly the daily counts of the sessions in
    web_sessions.  The 11-02 delivery restates 2026-10-25: PAR01's late conversion, which
    web_sessions re-sends as an updated session."""
    hotels = sorted({h for h, _ in winfo["daily"]})
    first = winfo["days"][0]
    history = days(first - timedelta(days=28), 28)

    def simulated(hotel):
        n = rng.randint(2, 4) if hotel == "AMS01" else rng.randint(1, 4)
        pv = sum(rng.randint(1, 12) for _ in range(n))
        conv = sum(rng.random() < 0.08 for _ in range(n))
        return [n, pv, conv]

    counts = {}
    for d in history:
        for h in hotels:
            counts[(h, d)] = simulated(h)
    counts.update({k: list(v) for k, v in winfo["daily"].items()})

    def rows(lo, hi, restate=None):
        out = []
        for d in days(lo, (hi - lo).days + 1):
            for h in hotels:
                n, pv, conv = (restate or counts)[(h, d)]
                out.append([h, d.isoformat(), n, pv, conv])
        return out

    flip_day = winfo["flip_day"]
    part1 = rows(history[0], history[-1])
    part2 = rows(first, flip_day)
    late = dict(counts)
    late[("PAR01", flip_day)] = counts[("PAR01", flip_day)][:2] + [counts[("PAR01", flip_day)][2] + 1]
    part3 = rows(flip_day, winfo["days"][-1], late)
    return part1, part2, part3, {"history": (history[0], history[-1]), "hotels": hotels}


def ndjson_bytes(objs):
    return "".join(json.dumps(o, separators=(",", ":")) + "\n" for o in objs).encode("utf-8")


# ---------------------------------------------------------------------------
# data/bad: run-level edge cases against the bookings contract
# ---------------------------------------------------------------------------

def gen_bad(out, rng):
    def rows(n, start):
        res = []
        for i in range(n):
            ci = date(2026, 12, 1) + timedelta(days=i)
            res.append([f"BX{start + i}", "AMS01", f"guest{start + i}@example.com", "direct",
                        "confirmed", ci.isoformat(), (ci + timedelta(days=2)).isoformat(), 2,
                        money(25000 + 100 * i), "EUR", None, "2026-11-05T01:00:00Z"])
        return res

    files = {}
    files["empty.csv"] = b""
    files["header_only.csv"] = csv_bytes(BOOKING_HEADER, [])
    r = rows(3, 900001)
    r[1][10] = "cot needed,\nquiet room"
    files["bom_crlf.csv"] = csv_bytes(BOOKING_HEADER, r, eol="\r\n", bom=True)
    r = rows(4, 900101)
    body = csv_bytes(BOOKING_HEADER, r)
    files["invalid_utf8.csv"] = body.replace(b"guest900102@example.com", b"gu\xff\xfeest900102@example.com")
    r = rows(5, 900201)
    lines = csv_bytes(BOOKING_HEADER, r).decode().split("\n")
    lines[2] += ",surplus"                                  # record 2: 13 fields
    lines[4] = lines[4].rsplit(",", 1)[0]                   # record 4: 11 fields
    files["ragged.csv"] = "\n".join(lines).encode()
    files["missing_required_column.csv"] = csv_bytes(BOOKING_HEADER[1:], [x[1:] for x in rows(3, 900301)])
    files["unknown_column.csv"] = csv_bytes(BOOKING_HEADER + ["promo_code"],
                                            [x + ["WINTER10"] for x in rows(3, 900401)])
    for name, data in files.items():
        write(os.path.join(out, "data", "bad", name), data)
    return sorted(files)


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def generate(out):
    rng = random.Random(SEED)
    landing = os.path.join(out, "data", "landing")
    for d in (landing, os.path.join(out, "data", "bad")):
        if os.path.isdir(d):
            shutil.rmtree(d)

    h1, h2 = gen_hotels(rng)
    write(os.path.join(landing, "hotels", "2026-11-01_hotels.csv"), csv_bytes(HOTEL_HEADER, h1))
    write(os.path.join(landing, "hotels", "2026-11-03_hotels.csv"), csv_bytes(HOTEL_HEADER, h2))

    bk = gen_bookings(rng, [h[0] for h in HOTELS])
    d1 = csv_bytes(BOOKING_HEADER, [booking_row(b) for b in bk["day1"]])
    write(os.path.join(landing, "bookings", "2026-11-01_bookings.csv"), d1)
    write(os.path.join(landing, "bookings", "2026-11-02_bookings_resend.csv"), d1)
    write(os.path.join(landing, "bookings", "2026-11-03_bookings.csv"),
          csv_bytes(BOOKING_HEADER, [booking_row(b) for b in bk["day3"]], eol="\r\n", bom=True))
    write(os.path.join(landing, "bookings", "2026-11-04_bookings_corrected.csv"),
          csv_bytes(BOOKING_HEADER, [booking_row(b) for b in bk["day4"]]))

    p1, p2, p3, restated = gen_spend(rng)
    write(os.path.join(landing, "marketing_spend", "2026-10-13_marketing_spend.csv"), csv_bytes(SPEND_HEADER, p1))
    write(os.path.join(landing, "marketing_spend", "2026-10-23_marketing_spend.csv"), csv_bytes(SPEND_HEADER, p2))
    write(os.path.join(landing, "marketing_spend", "2026-11-02_marketing_spend.csv.gz"),
          gzip_bytes(csv_bytes(SPEND_HEADER, p3)))

    w1, w2, winfo = gen_sessions(rng)
    write(os.path.join(landing, "web_sessions", "2026-10-26_web_sessions.ndjson"), ndjson_bytes(w1))
    write(os.path.join(landing, "web_sessions", "2026-11-02_web_sessions.ndjson"), ndjson_bytes(w2))

    bad = gen_bad(out, rng)

    # site_traffic last, so that every file above stays what it was before the source existed
    t1, t2, t3, tinfo = gen_traffic(rng, winfo)
    write(os.path.join(landing, "site_traffic", "2026-10-19_site_traffic.csv"), csv_bytes(TRAFFIC_HEADER, t1))
    write(os.path.join(landing, "site_traffic", "2026-10-26_site_traffic.csv"), csv_bytes(TRAFFIC_HEADER, t2))
    write(os.path.join(landing, "site_traffic", "2026-11-02_site_traffic.csv"), csv_bytes(TRAFFIC_HEADER, t3))
    partner = gen_partner(out, bk["day1"])
    return {"bookings": bk, "restated": restated, "sessions": winfo, "traffic": tinfo, "bad": bad,
            "partner": partner}


SOURCES = ["hotels", "bookings", "marketing_spend", "web_sessions", "site_traffic"]


def expectations(out):
    contracts = {s: load_contract(s) for s in SOURCES}
    results, finals, currents = {}, {}, {}
    for s in SOURCES:
        state = {"hashes": set(), "current": {}, "bronze_rows": 0}
        folder = os.path.join(out, "data", "landing", s)
        results[s] = [ingest(contracts[s], os.path.join(folder, f), state) for f in sorted(os.listdir(folder))]
        finals[s] = (state["bronze_rows"], len(state["current"]))
        currents[s] = state["current"]
    bad = []
    folder = os.path.join(out, "data", "bad")
    for f in sorted(x for x in os.listdir(folder) if x.endswith(".csv")):
        state = {"hashes": set(), "current": {}, "bronze_rows": 0}
        bad.append(ingest(contracts["bookings"], os.path.join(folder, f), state))
    return contracts, results, finals, bad, currents


SPIKE = {"column": "sessions", "by": "hotel_code", "window": 28, "factor": 10, "min_history": 7}


def traffic_story(out, contracts, currents):
    """Cross-checks of site_traffic, from the files on disk: (1) its current daily counts equal
    the sessions of the web_sessions NDJSON (every object once, the latest delivery of a
    session_id winning) wherever the NDJSON covers a hotel and day; (2) the rows a
    `spike: {column: sessions, by: [hotel_code], order: day, window: 28, factor: 10}` flags
    (docs/guide.md#rules: at least min_history earlier rows, mean of the up to `window` previous
    values > 0, value > factor x mean; ties by fingerprint).  Returns (flagged rows, compared days)."""
    c = contracts["site_traffic"]
    rows = []
    for fp, (rh, name, recno) in currents["site_traffic"].items():
        path = os.path.join(out, "data", "landing", name)
        rec = next(r for n, r, _, _ in read_records(c, path) if n == recno)
        canon, fails, _ = check_record(c, rec)
        assert not fails
        rows.append(dict(canon, natural_key_fingerprint=fp))
    by_key = {(r["hotel_code"], r["day"]): r for r in rows}
    sessions = {}
    folder = os.path.join(out, "data", "landing", "web_sessions")
    for f in sorted(os.listdir(folder)):
        for i, line in enumerate(open(os.path.join(folder, f), encoding="utf-8")):
            o = json.loads(line)
            sessions[o.get("session_id") or (f, i)] = o
    per_day = {}
    for o in sessions.values():
        c3 = per_day.setdefault((o["hotel_code"].strip().upper(), o["day"]), [0, 0, 0])
        c3[0] += 1
        c3[1] = c3[1] + o["pageviews"] if isinstance(c3[1], int) and isinstance(o["pageviews"], int) else None
        c3[2] += o["converted"] is True
    for (h, d), (n, pv, conv) in per_day.items():
        r = by_key[(h, d)]
        assert int(r["sessions"]) == n and int(r["conversions"]) == conv, (h, d, r, n, conv)
        assert pv is None or int(r["pageviews"]) == pv, (h, d, r, pv)
    flagged = []
    groups = {}
    for r in rows:
        groups.setdefault(r[SPIKE["by"]], []).append(r)
    for g in groups.values():
        g.sort(key=lambda r: (r["day"], r["natural_key_fingerprint"]))
        for i, r in enumerate(g):
            prev = [int(x[SPIKE["column"]]) for x in g[max(0, i - SPIKE["window"]):i]]
            v = int(r[SPIKE["column"]])
            if i >= SPIKE["min_history"] and sum(prev) > 0 and v * len(prev) > SPIKE["factor"] * sum(prev):
                flagged.append((r, sum(prev), len(prev)))
    flagged.sort(key=lambda t: (t[0]["hotel_code"], t[0]["day"]))
    return flagged, len(per_day)


def spot_hashes(contracts, out):
    """A few records with their canonical text, fingerprint and row_hash."""
    spots = []

    def add(source, relpath, recno, why):
        c = contracts[source]
        for n, rec, raw, extra in read_records(c, os.path.join(out, relpath)):
            if n == recno:
                canon, fails, _ = check_record(c, rec)
                assert not fails
                nk = c["natural_key"]
                fp_in = f"{nk['version']}|" + "|".join(canon[k] or "" for k in nk["fields"])
                rh_in = "1|" + "|".join("\\N" if canon[f["name"]] is None else
                                        canon[f["name"]].replace("\\", "\\\\").replace("|", "\\|")
                                        for f in c["fields"] if not f.get("volatile"))
                spots.append((why, relpath, recno, fp_in, fingerprint(c, canon), rh_in, row_hash(c, canon)))
                return
        raise AssertionError((relpath, recno))
    return spots, add


def fmt_fail(f):
    if len(f) == 3:
        return f"#{f[0]} `{f[1]}` (with #{', #'.join(map(str, f[2]))})"
    return f"#{f[0]} `{f[1]}`"


def find_recno(path, contract, pred):
    for n, rec, raw, extra in read_records(contract, path):
        if rec is not None and pred(rec):
            return n
    raise AssertionError(path)


def render_expected(out, info, contracts, results, finals, bad):
    L = []
    w = L.append
    w("# Expected ingest outcomes for data/landing and data/bad")
    w("")
    w("Generated by `python3 scripts/gen_demo_data.py` from the files it wrote; do not edit by hand.")
    w("The script re-reads every file from disk, applies `contracts/<source>.yaml` with the rules of")
    w("[contracts](../docs/guide.md#contracts), [ingest](../docs/guide.md#ingest) and")
    w("[hashes](../docs/formats.md#hashes), and prints this table. The Rust tests compare against it.")
    w("")
    w("## How the counting works")
    w("")
    w("* Each source is independent: its files are ingested one run per file in sorted file-name order,")
    w("  starting from an empty lake. Order between sources does not change any number below.")
    w("* `record` numbers are `source_row_number`: 1-based data records, the CSV header not counted;")
    w("  a quoted field with a line break is still one record. For NDJSON, one line = one record.")
    w("* A row is checked field by field: type (unparsable text -> `type:<field>`), then null/missing ->")
    w("  `required:<field>`, then `min`/`max`/`allowed`/`pattern` on the normalized value. Every failing")
    w("  demo row breaks exactly one rule (the generator asserts this), so rule order never matters.")
    w("* Rows that pass are grouped by `natural_key_fingerprint` within the file. A group whose rows")
    w("  have more than one `row_hash` is a natural-key conflict: every row of it fails with")
    w("  `natural_key_conflict`. In a group with a single `row_hash` the first row is compared with")
    w("  `bronze.<source>_current` (new fingerprint -> inserted; other row_hash -> updated; same ->")
    w("  unchanged) and every later row is `unchanged` (in-file exact duplicate, not written).")
    w("* `volatile` fields (bookings.exported_at) are not in row_hash; `normalize` steps apply before")
    w("  hashing, so re-typed e-mails (case, surrounding spaces) hash the same.")
    w("* A file whose SHA-256 equals an already committed file of the source is `skipped_duplicate_file`:")
    w("  nothing is read, all row counts are 0.")
    w("* `rows_seen = inserted + updated + unchanged + failed` on every line.")
    w("* status: `succeeded` when failed = 0, `succeeded_with_failures` otherwise.")
    w("")
    w("## data/landing")
    w("")
    w("| file | status | seen | inserted | updated | unchanged | failed |")
    w("|---|---|---:|---:|---:|---:|---:|")
    for s in SOURCES:
        for r in results[s]:
            w(f"| `{r['file'].replace('data/landing/', '')}` | {r['status']} | {r['seen']} | {r['inserted']} | "
              f"{r['updated']} | {r['unchanged']} | {r['failed']} |")
    w("")
    w("Failed records per file (record number, rule):")
    w("")
    for s in SOURCES:
        for r in results[s]:
            if r["failures"]:
                w(f"* `{r['file'].replace('data/landing/', '')}`: " + "; ".join(fmt_fail(f) for f in r["failures"]))
    w("")
    w("After all landing files (per source): rows in `bronze.<source>` (all versions) and in")
    w("`bronze.<source>_current` (one per fingerprint):")
    w("")
    w("| source | bronze rows | current rows |")
    w("|---|---:|---:|")
    for s in SOURCES:
        w(f"| {s} | {finals[s][0]} | {finals[s][1]} |")
    w("")
    w("File hashes (SHA-256 of the bytes as stored, the `.gz` file compressed):")
    w("")
    w("| file | bytes | file_hash |")
    w("|---|---:|---|")
    for s in SOURCES:
        for r in results[s]:
            w(f"| `{r['file'].replace('data/landing/', '')}` | {r['bytes']} | `{r['file_hash']}` |")
    w("")
    w("## What each landing file demonstrates")
    w("")
    bk = info["bookings"]
    tags = bk["tags"]
    c = contracts["bookings"]
    p1 = os.path.join(out, "data/landing/bookings/2026-11-01_bookings.csv")
    p4 = os.path.join(out, "data/landing/bookings/2026-11-04_bookings_corrected.csv")

    def rn(path, b):
        return find_recno(path, c, lambda rec: rec["booking_ref"] == b["booking_ref"] and rec["hotel_code"] == b["hotel_code"]
                          and rec["amount"] == b["amount"])

    def refs(lst):
        return ", ".join(f"{b['hotel_code']}/{b['booking_ref']}" for b in lst)

    w("### bookings")
    w("")
    w("`2026-11-01_bookings.csv` (LF, no BOM), the day-one export:")
    w(f"* record {rn(p1, tags['ann'])}: `{tags['ann']['hotel_code']}/{tags['ann']['booking_ref']}` has guest_email "
      f"`\"  Ann.Smith@Example.COM \"` (quoted, spaces kept); it normalizes to `ann.smith@example.com`.")
    w(f"* record {rn(p1, tags['bad_amount_type'])}: amount `abc` -> `type:amount`.")
    w(f"* record {rn(p1, tags['bad_check_in'])}: check_in `2026-13-45` -> `type:check_in`.")
    w(f"* record {rn(p1, tags['missing_ref'])}: empty booking_ref -> `required:booking_ref`.")
    w(f"* record {rn(p1, tags['negative_amount'])}: amount `-120.00` -> `min:amount`.")
    w(f"* record {rn(p1, tags['bad_currency'])}: currency `eur1` -> `pattern:currency`.")
    w(f"* record {rn(p1, tags['bad_status'])}: booking_status `tentative` -> `allowed:booking_status`.")
    w(f"* records {rn(p1, tags['conflict_a'])} and {rn(p1, tags['conflict_b'])}: "
      f"`{tags['conflict_a']['hotel_code']}/{tags['conflict_a']['booking_ref']}` twice with amounts "
      f"{tags['conflict_a']['amount']} and {tags['conflict_b']['amount']} -> both `natural_key_conflict`.")
    dup_n = rn(p1, tags["dup_a"])
    w(f"* records {dup_n} and {dup_n + 1}: the byte-identical line twice "
      f"(`{tags['dup_a']['hotel_code']}/{tags['dup_a']['booking_ref']}`): one inserted, one unchanged.")
    w(f"* records {rn(p1, tags['shared_ref_ams'])} and {rn(p1, tags['shared_ref_ber'])}: booking_ref "
      f"`{tags['shared_ref_ams']['booking_ref']}` at AMS01 and at BER01: two different records (key is hotel_code + booking_ref).")
    w(f"* record {rn(p1, tags['checkout_before_checkin'])}: check_out before check_in; valid for bronze, "
      f"for silver to reject (`check_out > check_in`).")
    w(f"* record {rn(p1, tags['test_booking'])}: `AMS01/TEST0001`, a test booking for a silver `filter`.")
    w("* about 6% of guest_email values are `NA` (null by `null_values`); about 10% of channel values are")
    w("  messy (`Booking.com`, `bcom`, ` Direct`, `EXPEDIA`, `Agency `) for silver to map.")
    w("")
    w("`2026-11-02_bookings_resend.csv`: byte-identical copy of day one -> `skipped_duplicate_file`.")
    w("")
    w("`2026-11-03_bookings.csv`: UTF-8 BOM, CRLF line ends, 20 new bookings. Record 8 has notes")
    w("`\"Guest asks for a cot,\\nand a late check-out\"` (comma and LF inside quotes); record 13 has")
    w("notes `VIP: \"repeat guest\"` (escaped quotes). Records 4 and 12 are for POR01, the hotel first")
    w("exported on 2026-11-03; record 16 is for `OPO02`, a code no hotels export has: it loads into bronze")
    w("and a silver build rejects it with rule `resolve:hotel` (on_missing: reject).")
    w("")
    d4 = results["bookings"][3]
    w("`2026-11-04_bookings_corrected.csv`: the PMS re-delivers day one, corrected. Every exported_at")
    w("differs from day one (volatile: no effect). Exactly three real changes -> 3 updated:")
    w(f"amount lowered by 10.00 on {refs(bk['amount_fix'])}; {refs([bk['status_fix']])} now `cancelled`.")
    w(f"guest_email re-typed with other case and spaces on {len(bk['retype'])} rows plus the Ann Smith row")
    w("(`ann.smith@example.com`): same normalized value -> unchanged. Of the day-one bad rows:")
    w("`type:amount`, `type:check_in` and `pattern:currency` rows are fixed and the conflict is resolved")
    w("(the PMS sends only the first of the two versions) -> 4 inserted; `required:booking_ref`,")
    w("`min:amount` and `allowed:booking_status` are still bad and fail again. The exact duplicate line")
    w("is still sent twice -> both unchanged.")
    w(f"Totals: {d4['seen']} seen = {d4['inserted']} inserted + {d4['updated']} updated + "
      f"{d4['unchanged']} unchanged + {d4['failed']} failed.")
    w("")
    w("### hotels")
    w("")
    w("`2026-11-01_hotels.csv`: 20 hotels. `2026-11-03_hotels.csv`: PAR02 has a new hotel_id (2044; the")
    w("PMS re-numbered it: same hotel_code, so an update of the same record, and silver resolves PAR02")
    w("bookings to 2044 from then on), ROM01 is renamed, POR01 (hotel_id 2045) is new; 18 unchanged.")
    w("")
    w("### marketing_spend")
    w("")
    w("`2026-10-13_marketing_spend.csv`: 2026-10-03..2026-10-12 plus one LIS01 row dated 2025-10-10.")
    w("BER01/2026-10-08/meta/winter_sale has spend `-35.20` (a refund): loads (no `min`), silver flags it.")
    w("`2026-10-23_marketing_spend.csv`: 2026-10-13..2026-10-22. PAR01/2026-10-15/tripadvisor has clicks")
    w("`12k` -> `type:clicks`. Three MAD99 rows (2026-10-14..16): no such hotel, silver resolves hotel_id")
    w("to null (on_missing: null).")
    w(f"`2026-11-02_marketing_spend.csv.gz` (gzip, mtime 0): 2026-10-21..2026-11-01. It restates")
    w(f"2026-10-21 unchanged and 2026-10-22 with {info['restated']} google_ads rows corrected ->")
    w(f"{info['restated']} updated. LIS01 reports again from 2026-10-26, 381 days after its 2025-10-10 row")
    w("(a first_seen rule with gap_days 365 fires on the 2025-10-10 row and on the first, by")
    w("natural_key_fingerprint, of LIS01's two 2026-10-26 rows).")
    w("")
    w("### web_sessions")
    w("")
    ws = info["sessions"]
    w("`2026-10-26_web_sessions.ndjson`: 2026-10-19..2026-10-25. One BER01 object (2026-10-21) has an extra")
    w("key `utm_source`: the contract says `unknown_fields: ignore`, so the key is dropped and the row")
    w("loads. One PAR01 object (2026-10-23) has `\"pageviews\":\"many\"` -> `type:pageviews`.")
    w(f"`2026-11-02_web_sessions.ndjson`: first the {ws['resent']} PAR01 sessions of 2026-10-25 again, one")
    w(f"(`{ws['flip']}`) now `converted: true` -> 1 updated, {ws['resent'] - 1} unchanged; then")
    w(f"2026-10-26..2026-11-01. AMS01 has exactly 3 sessions every day except {ws['spike_day']}: 40 (37 bot")
    w("sessions, 1 pageview each), more than 10x its mean: the spike beat, flagged on the daily count")
    w("in site_traffic. One LON01 object has no session_id -> `required:session_id`; one BCN01 object")
    w("has device `smart_tv` -> `allowed:device`.")
    w("")
    w("### site_traffic")
    w("")
    tr = info["traffic"]
    lo, hi = tr["history"]
    w("The analytics tool's daily export: one row per hotel website and day (sessions, pageviews,")
    w(f"conversions) for the {len(tr['hotels'])} hotels of web_sessions ({', '.join(tr['hotels'])}).")
    w(f"`2026-10-19_site_traffic.csv`: four weeks of history ({lo}..{hi}), before the")
    w("per-session export starts. `2026-10-26_site_traffic.csv`: 2026-10-19..2026-10-25.")
    w(f"`2026-11-02_site_traffic.csv`: restates {ws['flip_day']} (PAR01 has one more conversion, the late")
    w("one of web_sessions -> 1 updated, 4 unchanged), then 2026-10-26..2026-11-01.")
    w("From 2026-10-19 on, the counts are those of the sessions in the web_sessions NDJSON, each object")
    w("counted once and the latest delivery of a session_id winning (the generator checks all")
    w(f"{tr['compared']} hotel-days). The two objects bronze rejects still count, so")
    w("bronze.web_sessions_current has one session fewer on PAR01 2026-10-23 and LON01 2026-10-28.")
    assert len(tr["flagged"]) == 1
    for r, total, n in tr["flagged"]:
        w("A `spike` on sessions (by hotel_code, order day, window 28, factor 10) fires on exactly one")
        w(f"row: {r['hotel_code']} {r['day']}, {r['sessions']} sessions against a mean of {total}/{n} = "
          f"{float(Decimal(total) / n):.2f} over the {n} days before it.")
    w("")
    w("## Hash spot checks ([formulas](../docs/formats.md#hashes))")
    w("")
    spots, add = spot_hashes(contracts, out)
    ann = tags["ann"]
    add("bookings", "data/landing/bookings/2026-11-01_bookings.csv", rn(p1, ann), "Ann Smith, day one (spaces, upper case)")
    add("bookings", "data/landing/bookings/2026-11-04_bookings_corrected.csv",
        find_recno(p4, c, lambda r: r["booking_ref"] == ann["booking_ref"] and r["hotel_code"] == "AMS01"),
        "Ann Smith, day four (re-typed, new exported_at): same fingerprint and row_hash")
    add("bookings", "data/landing/bookings/2026-11-03_bookings.csv", 8, "multi-line note, CRLF/BOM file")
    ps = os.path.join(out, "data/landing/marketing_spend/2026-10-13_marketing_spend.csv")
    add("marketing_spend", "data/landing/marketing_spend/2026-10-13_marketing_spend.csv",
        find_recno(ps, contracts["marketing_spend"], lambda r: r["spend"] == "-35.20"), "negative decimal")
    pw = os.path.join(out, "data/landing/web_sessions/2026-10-26_web_sessions.ndjson")
    add("web_sessions", "data/landing/web_sessions/2026-10-26_web_sessions.ndjson",
        find_recno(pw, contracts["web_sessions"], lambda r: r["session_started_at"].endswith(".125Z")),
        "fractional timestamp, float, boolean")
    add("web_sessions", "data/landing/web_sessions/2026-10-26_web_sessions.ndjson",
        find_recno(pw, contracts["web_sessions"],
                   lambda r: r["duration_s"] is not None and r["duration_s"].endswith(".0")
                   and "." not in r["session_started_at"]),
        "integral float written as `N.0` in JSON (canonical `N`), timestamp without fraction")
    pt = os.path.join(out, "data/landing/site_traffic/2026-11-02_site_traffic.csv")
    add("site_traffic", "data/landing/site_traffic/2026-11-02_site_traffic.csv",
        find_recno(pt, contracts["site_traffic"],
                   lambda r: r["hotel_code"] == "AMS01" and r["day"] == ws["spike_day"].isoformat()),
        "the spike day (key hotel_code + day, int64 counts)")
    for why, rel, n, fp_in, fp, rh_in, rh in spots:
        w(f"* {why}: `{rel.replace('data/landing/', '')}` record {n}")
        w(f"  * fingerprint input `{json.dumps(fp_in)[1:-1]}` -> `{fp}`")
        w(f"  * row_hash input `{json.dumps(rh_in)[1:-1]}` -> `{rh}`")
    w("")
    w("(Inputs are shown JSON-escaped: `\\n` is one LF byte, `\\\\N` is the two characters `\\N`.)")
    w("")
    w("## data/bad (each file ingested as `bookings` into its own empty lake)")
    w("")
    w("| file | status | seen | inserted | updated | unchanged | failed | failures / error |")
    w("|---|---|---:|---:|---:|---:|---:|---|")
    for r in bad:
        detail = r["error"] or "; ".join(fmt_fail(f) for f in r["failures"]) or "-"
        w(f"| `{r['file'].replace('data/bad/', '')}` | {r['status']} | {r['seen']} | {r['inserted']} | "
          f"{r['updated']} | {r['unchanged']} | {r['failed']} | {detail} |")
    w("")
    w("See data/bad/README.md for the decisions behind these lines (`malformed_record` and")
    w("`type:guest_email` for invalid UTF-8 are ingot's own rule names, see")
    w("[failure rules](../docs/guide.md#failure-rules)).")
    return "\n".join(L) + "\n"


def render_bad_readme(bad):
    rows = {r["file"].split("/")[-1]: r for r in bad}
    L = ["# data/bad: edge cases for the `bookings` contract", "",
         "Generated by `scripts/gen_demo_data.py`. Not under data/landing, so `ingot run` never sees them;",
         "tests ingest each one as source `bookings` (`ingot ingest bookings data/bad/<file>`) into a",
         "fresh lake. Expected counts are in data/EXPECTED.md.", ""]
    text = {
        "empty.csv": "0 bytes, not even a header. The run fails (status `failed`, exit code 1, error says "
                     "the file is empty / has no header); nothing is published.",
        "header_only.csv": "A valid header and no records. The run succeeds with rows_seen = 0 "
                           "(status `succeeded`).",
        "bom_crlf.csv": "UTF-8 BOM, CRLF line ends, and record 2's notes is a quoted `cot needed,` LF "
                        "`quiet room`. Parses like any other file: the BOM is not part of the first column "
                        "name, the CR is not part of the last field, the quoted line break is data. "
                        "3 records, all inserted.",
        "invalid_utf8.csv": "Record 2 has the bytes 0xFF 0xFE inside guest_email. Decision: that record is "
                            "rejected with rule `type:guest_email` (the field is not valid UTF-8; raw_payload "
                            "keeps the line with U+FFFD replacement characters), the other 3 load. The run "
                            "does not fail.",
        "ragged.csv": "Record 2 has 13 fields (one too many), record 4 has 11 (one too few). Decision: "
                      "each is rejected with rule `malformed_record` (reason names expected and found "
                      "field counts), the other 3 load. Missing trailing fields are not silently null.",
        "missing_required_column.csv": "The header has no `booking_ref` column, which the contract marks "
                                       "required. The run fails (status `failed`, exit code 1, error names "
                                       "the missing column `booking_ref`); no rows are loaded or rejected.",
        "unknown_column.csv": "The header has an extra column `promo_code`; bookings has "
                              "`unknown_fields: reject`. The run fails (status `failed`, exit code 1, error "
                              "names `promo_code`); nothing is published.",
    }
    for name in sorted(text):
        r = rows[name]
        L.append(f"* `{name}`: {text[name]}")
        L.append(f"  Expected: status `{r['status']}`, seen {r['seen']}, inserted {r['inserted']}, "
                 f"failed {r['failed']}" + (f" ({'; '.join(fmt_fail(f) for f in r['failures'])})" if r['failures'] else "") + ".")
    return "\n".join(L) + "\n"


def render_expected_json(results, currents, bad):
    """data/expected.json: the machine-readable oracle the Rust integration tests compare whole
    tables against (see the module docstring of this script for the shape)."""
    counts = ("seen", "inserted", "updated", "unchanged", "failed")

    def run(r):
        d = {"source": r["source"], "file": r["name"], "file_hash": r["file_hash"], "file_bytes": r["bytes"],
             "status": r["status"], "failures": r["fail_rows"], "written": r["written"]}
        for k in counts:
            d["rows_" + k] = r[k]
        return d

    doc = {
        "landing": [run(r) for s in sorted(results) for r in results[s]],
        "current": {s: [{"natural_key_fingerprint": fp, "row_hash": rh, "file": f, "source_row_number": n}
                        for fp, (rh, f, n) in sorted(currents[s].items())]
                    for s in sorted(currents)},
        "bad": [dict(run(r), outcome=r["status"]) for r in bad],
    }
    return (json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


PARTNER_HEADER = ["ref", "hotel", "guest", "status", "arrival", "departure", "nights", "total",
                  "currency", "updated_at"]


def gen_partner(out, day1):
    """data/partner/partner_bookings/: the partner channel manager's view of the same bookings
    (examples/partner, demo step 18): 20 of day one's bookings as they are, one with another
    amount (the conflict the demo decides), and 5 the booking engine does not have. Its own
    random.Random, so the files above stay as they were."""
    rng = random.Random(SEED + 44)
    d = os.path.join(out, "data", "partner")
    if os.path.isdir(d):
        shutil.rmtree(d)
    valid = [b for b in day1 if b["booking_ref"] and b["booking_ref"].startswith("BK")
             and re.fullmatch(r"\d+\.\d\d", str(b["amount"] or "")) and b["currency"] == "EUR"
             and b["booking_status"] in ("confirmed", "cancelled", "no_show")
             and b["check_out"] > b["check_in"] and b["hotel_code"] in [h[0] for h in HOTELS]]
    seen = {}
    for b in valid:
        seen.setdefault((b["hotel_code"], b["booking_ref"]), []).append(b)
    shared = [v[0] for v in seen.values() if len(v) == 1][:21]
    rows = []
    base = datetime(2026, 11, 2, 6, 0, 0)
    for i, b in enumerate(shared):
        total = b["amount"]
        if i == 7:
            total = money(int(Decimal(b["amount"]) * 100) + 1000)   # the conflict: 10.00 more
        rows.append([b["booking_ref"], b["hotel_code"].lower(), b["guest_email"], b["booking_status"],
                     b["check_in"], b["check_out"], b["nights"], total, b["currency"],
                     (base + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ")])
    for i in range(5):
        hotel = rng.choice([h[0] for h in HOTELS])
        ci = date(2026, 12, 1) + timedelta(days=rng.randint(0, 30))
        n = rng.choice([1, 2, 3])
        rows.append([f"PB{700001 + i}", hotel, f"{rng.choice(FIRST)}.{rng.choice(LAST)}@{rng.choice(DOMAINS)}",
                     "confirmed", ci.isoformat(), (ci + timedelta(days=n)).isoformat(), n,
                     money(rng.randint(9000, 30000) * n), "EUR",
                     (base + timedelta(seconds=100 + i)).strftime("%Y-%m-%dT%H:%M:%SZ")])
    write(os.path.join(d, "partner_bookings", "2026-11-02_partner_bookings.csv"), csv_bytes(PARTNER_HEADER, rows))
    return {"conflict": shared[7]["booking_ref"], "shared": len(shared), "new": 5}


def build(out):
    info = generate(out)
    contracts, results, finals, bad, currents = expectations(out)
    info["traffic"]["flagged"], info["traffic"]["compared"] = traffic_story(out, contracts, currents)
    spike = [(r["hotel_code"], r["day"]) for r, _, _ in info["traffic"]["flagged"]]
    assert spike == [("AMS01", info["sessions"]["spike_day"].isoformat())], spike
    write(os.path.join(out, "data", "EXPECTED.md"),
          render_expected(out, info, contracts, results, finals, bad).encode("utf-8"))
    write(os.path.join(out, "data", "expected.json"), render_expected_json(results, currents, bad))
    write(os.path.join(out, "data", "bad", "README.md"), render_bad_readme(bad).encode("utf-8"))
    return results, finals, bad


def tree_bytes(base):
    res = {}
    for sub in ("data/landing", "data/bad", "data/partner"):
        for dp, _, fs in os.walk(os.path.join(base, sub)):
            for f in fs:
                p = os.path.join(dp, f)
                res[os.path.relpath(p, base)] = open(p, "rb").read()
    for f in ("data/EXPECTED.md", "data/expected.json"):
        p = os.path.join(base, f)
        res[f] = open(p, "rb").read() if os.path.exists(p) else None
    return res


def main():
    if "--check" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.join(ROOT, "contracts"), os.path.join(tmp, "contracts"))
            global_root = ROOT
            try:
                globals()["ROOT"] = tmp
                build(tmp)
                fresh = tree_bytes(tmp)
            finally:
                globals()["ROOT"] = global_root
        on_disk = tree_bytes(ROOT)
        if fresh != on_disk:
            diff = sorted(set(fresh) ^ set(on_disk)) + sorted(k for k in set(fresh) & set(on_disk) if fresh[k] != on_disk[k])
            print("differs from a fresh generation: " + ", ".join(diff))
            return 1
        print("data/landing, data/bad, data/EXPECTED.md and data/expected.json match a fresh generation")
        return 0
    results, finals, bad = build(ROOT)
    print(f"{'file':58} {'status':24} seen  ins  upd  unch fail")
    for s in SOURCES:
        for r in results[s]:
            print(f"{r['file']:58} {r['status']:24} {r['seen']:4} {r['inserted']:4} {r['updated']:4} "
                  f"{r['unchanged']:5} {r['failed']:4}")
    for r in bad:
        print(f"{r['file']:58} {r['status']:24} {r['seen']:4} {r['inserted']:4} {r['updated']:4} "
              f"{r['unchanged']:5} {r['failed']:4}")
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.join(ROOT, "data", "landing")) for f in fs)
    print(f"data/landing total: {total} bytes")
    print("wrote data/landing, data/bad, data/EXPECTED.md, data/expected.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
