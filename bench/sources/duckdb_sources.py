#!/usr/bin/env python3
"""DuckDB doing ingot's two-source survivorship of bench/sources/rules/lineitem_two/v1.yaml, and
the check of ingot's result against it (bench/sources.sh).

    duckdb_sources.py build OUT_DIR BRONZE_GLOB_A BRONZE_GLOB_B [--current]
        The table as SQL over ingot's bronze Parquet files of lineitem_a and lineitem_b:
        OUT_DIR/silver.parquet (one row per record, the rules' columns, the provenance columns
        contributing_sources, field_sources and conflict_fields, anomaly_flags with
        source_conflict, the lineage of the first contributing source) and
        OUT_DIR/conflicts.parquet (one row per conflict, as audit.source_conflict_log has it:
        every candidate, its canonical value, candidate_set_hash, the source taken), zstd
        Parquet. Timed by bench/sources.sh.
        Without --current every bronze row must be current (a source with one run, as after the
        first ingests: DuckDB is spared the deduplication, as in bench/silver_duckdb.py); with
        --current each source's rows are first reduced to the latest version per
        natural_key_fingerprint (the greatest ingestion_run_id: run ids are UUIDv7, so that is
        the latest run here, where runs commit in the order they start), tombstones left out.

    duckdb_sources.py check INGOT_SILVER.parquet INGOT_CONFLICTS.parquet OUT_DIR SPLIT_JSON [--after-redelivery]
        Compare ingot's table (exported with `ingot sql ... --format parquet`) and its build's
        conflicts with DuckDB's OUT_DIR files and with the counts bench/sources/split.py wrote:
        rows, distinct keys, records with two contributing sources, conflicts, a checksum of
        l_extendedprice and l_quantity, the winners per field (field_sources entries by field
        and source), then every row and every conflict column by column. Prints one line per
        check and exits 1 on any difference. Not timed.

The semantics (docs/guide.md#several-sources), for two sources of ranks 1 and 2:

* candidates meet on natural_key_fingerprint (a FULL OUTER JOIN of A and B);
* precedence (the default): among the candidates with a value, the first by rank: COALESCE(A, B).
  Ties on rank cannot happen with ranks 1 and 2, so `order_by`, source name and row_hash never
  break one;
* most_recent by l_updated (l_shipinstruct): among the candidates with a value, the latest
  l_updated (nulls last), then rank;
* a listed conflict (l_comment): the candidates' non-null values differ; on_conflict: flag keeps
  the survivorship winner, lists the field in conflict_fields and flags the row
  source_conflict. Tie conflicts (same_precedence: conflict) need equal ranks: none here;
* contributing_sources in rank order; field_sources: a list of {field, source}, in column
  order, for each unit another source than the first contributing one won (empty, never null,
  when none); lineage (row_hash,
  ingestion_run_id) of the first contributing source.
"""
import json
import os
import sys

import duckdb

# Keep in step with bench/sources/rules/lineitem_two/v1.yaml and the contracts.
SOURCES = [("lineitem_a", 1), ("lineitem_b", 2)]  # (name, rank), in rank order
COLUMNS = ["l_orderkey", "l_partkey", "l_suppkey", "l_linenumber", "l_quantity", "l_extendedprice", "l_discount",
           "l_tax", "l_returnflag", "l_linestatus", "l_shipdate", "l_commitdate", "l_receiptdate",
           "l_shipinstruct", "l_shipmode", "l_comment", "l_updated"]
MOST_RECENT = {"l_shipinstruct": "l_updated"}  # field -> its order column; every other: precedence
LISTED = ["l_comment"]  # conflicts.fields (string columns: their canonical text is the string)
FLAG = "source_conflict"
FP = "natural_key_fingerprint"


def sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def source_rel(glob: str, current: bool) -> str:
    rel = f"SELECT * FROM read_parquet({sql_str(glob)}, hive_partitioning = false)"
    if not current:
        return rel
    return (f"SELECT * FROM ({rel}) QUALIFY row_number() OVER (PARTITION BY {FP} ORDER BY ingestion_run_id DESC) = 1 "
            f"AND NOT coalesce(is_deleted, false)")


def joined(glob_a: str, glob_b: str, current: bool, how: str = "FULL OUTER") -> str:
    cols = ", ".join(f"{s}.{c} AS {s}_{c}" for s in ("a", "b") for c in COLUMNS + ["row_hash", "ingestion_run_id"])
    return f"""
    a AS ({source_rel(glob_a, current)}),
    b AS ({source_rel(glob_b, current)}),
    j AS (
      SELECT coalesce(a.{FP}, b.{FP}) AS fp, a.{FP} IS NOT NULL AS has_a, b.{FP} IS NOT NULL AS has_b, {cols}
      FROM a {how} JOIN b ON a.{FP} = b.{FP}
    )"""


def winner(c: str) -> str:
    """'a', 'b' or NULL (no candidate has a value): the source the field's value comes from."""
    if c in MOST_RECENT:
        o = MOST_RECENT[c]
        return (f"CASE WHEN a_{c} IS NULL THEN (CASE WHEN b_{c} IS NOT NULL THEN 'b' END) "
                f"WHEN b_{c} IS NULL THEN 'a' "
                f"WHEN b_{o} IS NOT NULL AND (a_{o} IS NULL OR b_{o} > a_{o}) THEN 'b' ELSE 'a' END")
    return f"CASE WHEN a_{c} IS NOT NULL THEN 'a' WHEN b_{c} IS NOT NULL THEN 'b' END"


def conflict(c: str) -> str:
    return f"(a_{c} IS NOT NULL AND b_{c} IS NOT NULL AND a_{c} <> b_{c})"


def silver_query(glob_a: str, glob_b: str, current: bool) -> str:
    (name_a, _), (name_b, _) = SOURCES
    win = ",\n        ".join(f"{winner(c)} AS w_{c}" for c in COLUMNS)
    values = ", ".join(f"CASE w_{c} WHEN 'a' THEN a_{c} WHEN 'b' THEN b_{c} END AS {c}" for c in COLUMNS)
    # the first contributing source is A whenever A has the record: an entry for each unit B won
    # (in column order; empty, never null, when none)
    entries = ", ".join(f"CASE WHEN w_{c} = 'b' THEN {{'field': {sql_str(c)}, 'source': {sql_str(name_b)}}} END"
                        for c in COLUMNS)
    field_sources = (f"CASE WHEN has_a AND has_b THEN list_filter([{entries}], lambda x: x IS NOT NULL) "
                     f"ELSE CAST([] AS STRUCT(field VARCHAR, source VARCHAR)[]) END")
    conflicts = " OR ".join(conflict(c) for c in LISTED)
    listed = ", ".join(f"CASE WHEN {conflict(c)} THEN {sql_str(c)} END" for c in LISTED)
    return f"""
    WITH {joined(glob_a, glob_b, current)},
    w AS (SELECT *,
        {win},
        {conflicts} AS __conflict,
        {field_sources} AS __fs
      FROM j)
    SELECT {values},
      CASE WHEN has_a AND has_b THEN [{sql_str(name_a)}, {sql_str(name_b)}]
           WHEN has_a THEN [{sql_str(name_a)}] ELSE [{sql_str(name_b)}] END AS contributing_sources,
      __fs AS field_sources,
      CASE WHEN __conflict THEN list_filter([{listed}], lambda x: x IS NOT NULL) END AS conflict_fields,
      CAST(1 AS INTEGER) AS rules_version,
      CASE WHEN __conflict THEN [{sql_str(FLAG)}] ELSE CAST([] AS VARCHAR[]) END AS anomaly_flags,
      __conflict AS is_anomaly,
      fp AS {FP},
      CASE WHEN has_a THEN a_row_hash ELSE b_row_hash END AS row_hash,
      CASE WHEN has_a THEN a_ingestion_run_id ELSE b_ingestion_run_id END AS ingestion_run_id
    FROM w"""


def conflicts_query(glob_a: str, glob_b: str, current: bool) -> str:
    (name_a, _), (name_b, _) = SOURCES
    parts = []
    for c in LISTED:
        # candidate_set_hash (docs/formats.md#candidate_set_hash): field, then per candidate in
        # source-name order its name and "-" for a null or "<bytes>:<canonical text>"
        def text(s: str) -> str:
            return f"CASE WHEN {s}_{c} IS NULL THEN '-\n' ELSE strlen({s}_{c}) || ':' || {s}_{c} || '\n' END"
        names = sorted([("a", name_a), ("b", name_b)], key=lambda x: x[1])
        hashed = " || ".join([sql_str(c + "\n")] + [f"{sql_str(n + chr(10))} || {text(s)}" for s, n in names])
        cands = ", ".join(f"{{'source': {sql_str(n)}, 'ingestion_run_id': {s}_ingestion_run_id, "
                          f"'row_hash': {s}_row_hash, 'value': {s}_{c}}}" for s, n in names)
        taken = f"CASE {winner(c)} WHEN 'a' THEN {sql_str(name_a)} WHEN 'b' THEN {sql_str(name_b)} END"
        parts.append(f"""SELECT fp AS {FP}, {sql_str(c)} AS field, 'listed' AS kind, [{cands}] AS candidates,
          sha256({hashed}) AS candidate_set_hash, 'flag' AS on_conflict, 'open' AS status, {taken} AS taken_source
        FROM j WHERE {conflict(c)}""")
    # only records both sources have can conflict: an inner join
    return f"WITH {joined(glob_a, glob_b, current, 'INNER')}\n" + "\nUNION ALL\n".join(parts)


def build(out_dir: str, glob_a: str, glob_b: str, current: bool) -> int:
    assert len({r for _, r in SOURCES}) == len(SOURCES) == 2, "the SQL is written for two sources of distinct ranks"
    os.makedirs(out_dir, exist_ok=True)
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    silver = os.path.join(out_dir, "silver.parquet")
    conflicts = os.path.join(out_dir, "conflicts.parquet")
    n = con.execute(f"COPY ({silver_query(glob_a, glob_b, current)}) TO {sql_str(silver)} "
                    f"(FORMAT parquet, COMPRESSION zstd)").fetchone()[0]
    k = con.execute(f"COPY ({conflicts_query(glob_a, glob_b, current)}) TO {sql_str(conflicts)} "
                    f"(FORMAT parquet, COMPRESSION zstd)").fetchone()[0]
    print(f"duckdb sources: {n} rows -> {silver}; {k} conflicts -> {conflicts}")
    return 0


def check(ingot_silver: str, ingot_conflicts: str, out_dir: str, split_json: str, after: bool) -> int:
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    split = json.load(open(split_json))
    ok = True
    summary = {}

    def verdict(what: str, got, want) -> None:
        nonlocal ok
        good = got == want
        ok &= good
        print(f"sources check: {'ok  ' if good else 'FAIL'} {what}: {got}" + ("" if good else f" (expected {want})"))

    con.execute(f"CREATE VIEW i AS SELECT * FROM read_parquet({sql_str(ingot_silver)})")
    con.execute(f"CREATE VIEW d AS SELECT * FROM read_parquet({sql_str(os.path.join(out_dir, 'silver.parquet'))})")
    con.execute(f"CREATE VIEW ic AS SELECT * FROM read_parquet({sql_str(ingot_conflicts)})")
    con.execute(f"CREATE VIEW dc AS SELECT * FROM read_parquet({sql_str(os.path.join(out_dir, 'conflicts.parquet'))})")
    q = lambda sql: con.execute(sql).fetchone()  # noqa: E731

    stats = """SELECT count(*), count(DISTINCT natural_key_fingerprint),
                 count(*) FILTER (WHERE len(contributing_sources) = 2),
                 count(*) FILTER (WHERE list_contains(anomaly_flags, 'source_conflict')),
                 sum(l_extendedprice), sum(l_quantity),
                 count(*) FILTER (WHERE len(field_sources) > 0), count(*) FILTER (WHERE field_sources IS NULL) FROM {}"""
    si, sd = q(stats.format("i")), q(stats.format("d"))
    summary.update(rows=si[0], two_sources=si[2], flagged=si[3], sum_extendedprice=str(si[4]))
    verdict("rows: ingot vs duckdb", si[0], sd[0])
    verdict("rows: ingot vs the split's distinct keys", si[0], split["distinct_keys"])
    verdict("distinct fingerprints in ingot's table", si[1], si[0])
    verdict("records with 2 contributing sources: ingot vs duckdb", si[2], sd[2])
    verdict("records with 2 contributing sources: ingot vs the split's overlap", si[2], split["overlap"])
    verdict("rows flagged source_conflict: ingot vs duckdb", si[3], sd[3])
    verdict("sum(l_extendedprice): ingot vs duckdb", si[4], sd[4])
    verdict("sum(l_quantity): ingot vs duckdb", si[5], sd[5])
    verdict("rows with field_sources entries: ingot vs duckdb", si[6], sd[6])
    verdict("rows with a null field_sources in ingot's table", si[7], 0)

    nci, ncd = q("SELECT count(*) FROM ic")[0], q("SELECT count(*) FROM dc")[0]
    want = split["conflicts_after_redelivery" if after else "comment_differs"]
    summary["conflicts"] = nci
    verdict("conflicts: ingot's audit.source_conflict_log of the build vs duckdb", nci, ncd)
    verdict("conflicts: ingot vs the split's changed comments", nci, want)
    verdict("rows flagged source_conflict vs conflicts (one listed field)", si[3], nci)

    # the winners: field_sources entries by field and source
    winners = """SELECT coalesce(list(k || '=' || v || ':' || n ORDER BY k, v), []) FROM (
                   SELECT e.field AS k, e.source AS v, count(*) AS n
                   FROM (SELECT unnest(field_sources) AS e FROM {})
                   GROUP BY k, v)"""
    wi, wd = q(winners.format("i"))[0], q(winners.format("d"))[0]
    summary["winners"] = wi
    verdict("field_sources entries by field=source:count, ingot vs duckdb", wi, wd)
    ship = dict(e.split(":") for e in wi).get("l_shipmode=lineitem_b", "0")
    verdict("l_shipmode taken from lineitem_b (A's null): ingot vs the split", int(ship), split["a_shipmode_null"])

    # every row, every column
    cols = [c for c in q("SELECT list(column_name) FROM (DESCRIBE d)")[0] if c != "natural_key_fingerprint"]
    icols = [c for c in q("SELECT list(column_name) FROM (DESCRIBE i)")[0] if c not in ("natural_key_fingerprint", "silver_build_id")]
    verdict("ingot's columns (but silver_build_id) vs duckdb's, in order", icols, cols)
    norm = {"field_sources": "CAST({}.field_sources AS VARCHAR)"}  # a list of structs, in column order
    expr = lambda side, c: norm[c].format(side) if c in norm else f"{side}.{c}"  # noqa: E731
    diffs = ", ".join(f"count(*) FILTER (WHERE i.natural_key_fingerprint IS NOT NULL AND d.natural_key_fingerprint IS NOT NULL "
                      f"AND {expr('i', c)} IS DISTINCT FROM {expr('d', c)})" for c in cols)
    counts = q(f"""SELECT count(*) FILTER (WHERE i.natural_key_fingerprint IS NULL),
                          count(*) FILTER (WHERE d.natural_key_fingerprint IS NULL), {diffs}
                   FROM i FULL OUTER JOIN d USING (natural_key_fingerprint)""")
    verdict("records only in duckdb's table", counts[0], 0)
    verdict("records only in ingot's table", counts[1], 0)
    bad = [f"{c}: {n}" for c, n in zip(cols, counts[2:]) if n]
    verdict(f"rows differing in any of the {len(cols)} columns ({', '.join(cols[:3])}, ...)", bad, [])

    ccols = ["kind", "candidates", "candidate_set_hash", "on_conflict", "status", "taken_source"]
    cdiffs = ", ".join(f"count(*) FILTER (WHERE ic.field IS NOT NULL AND dc.field IS NOT NULL "
                       f"AND CAST(ic.{c} AS VARCHAR) IS DISTINCT FROM CAST(dc.{c} AS VARCHAR))" for c in ccols)
    cc = q(f"""SELECT count(*) FILTER (WHERE ic.field IS NULL), count(*) FILTER (WHERE dc.field IS NULL), {cdiffs}
               FROM ic FULL OUTER JOIN dc USING (natural_key_fingerprint, field)""")
    verdict("conflicts only in duckdb's log", cc[0], 0)
    verdict("conflicts only in ingot's log", cc[1], 0)
    bad = [f"{c}: {n}" for c, n in zip(ccols, cc[2:]) if n]
    verdict(f"conflicts differing in {', '.join(ccols)}", bad, [])
    if not ok:
        rows = con.execute(f"""SELECT natural_key_fingerprint, {', '.join(f'{expr("i", c)}, {expr("d", c)}' for c in cols[:20])}
            FROM i FULL OUTER JOIN d USING (natural_key_fingerprint)
            WHERE i.natural_key_fingerprint IS NULL OR d.natural_key_fingerprint IS NULL OR
              {' OR '.join(f"{expr('i', c)} IS DISTINCT FROM {expr('d', c)}" for c in cols)}
            LIMIT 5""").fetchall()
        print("sources check: first differing rows (fingerprint, then ingot, duckdb per column):")
        for r in rows:
            print("  " + " | ".join(str(x) for x in r))
    print("sources summary: " + json.dumps(summary))
    print("sources check: " + ("ingot and duckdb agree" if ok else "MISMATCH: ingot and DuckDB disagree"))
    return 0 if ok else 1


def main() -> int:
    a = sys.argv[1:]
    if len(a) in (4, 5) and a[0] == "build" and (len(a) == 4 or a[4] == "--current"):
        return build(a[1], a[2], a[3], len(a) == 5)
    if len(a) in (5, 6) and a[0] == "check" and (len(a) == 5 or a[5] == "--after-redelivery"):
        return check(a[1], a[2], a[3], a[4], len(a) == 6)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
