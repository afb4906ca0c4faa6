#!/usr/bin/env python3
"""The peer of ingot's API pull in the benchmark: dlt's `rest_api` source loading the pages of
scripts/api_server.py to Parquet files with dlt's filesystem destination (a local folder).

    dlt_pull.py --base-url http://127.0.0.1:PORT/v2 --out DIR [--token T] [--page-size 1000]
                [--merge] [--updated-since TS]

Runs in the venv of bench/requirements-dlt.txt. Everything dlt writes stays inside DIR:
  DIR/data/<dataset>/orders/<load_id>.<file_id>.parquet   the loaded rows (dataset: vendor)
  DIR/data/<dataset>/_dlt_loads/, _dlt_pipeline_state/, _dlt_version/   dlt's own tables
  DIR/pipelines/                                          the pipeline's working folder
  DIR/dlt-home/                                           dlt's global folder (instead of ~/.dlt)
Telemetry is off and nothing asks a question. DIR is reused as it is: run it on an empty folder
for a first load.

The resource `orders`: endpoint path `orders`, records under `data`, the cursor paginator on
`meta.next` sent back as `cursor`, `limit` = --page-size, primary key `order_id`, column `amount`
hinted as text (the rest inferred by dlt). Write disposition `append` (the first-load
comparison) or, with --merge, `merge` on order_id; dlt's filesystem destination merges only
into Delta or Iceberg tables (on plain Parquet files it warns and appends), so --merge also
writes the table as Delta (table_format="delta", needs the deltalake package).

Prints which write disposition it used on stderr and, at the end, one JSON line on stdout:
  {"tool": "dlt", "version": ..., "write_disposition": ..., "rows": <rows dlt normalized into
   orders>, "rows_in_files": <rows of the table's Parquet files, read back with pyarrow>,
   "seconds": <wall time of pipeline.run>}
"""
import argparse
import glob
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description="dlt rest_api -> Parquet (filesystem) pull")
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:PORT/v2")
    ap.add_argument("--out", required=True, help="folder for the data and dlt's working files")
    ap.add_argument("--token", help="bearer token (or env VENDOR_TOKEN)")
    ap.add_argument("--page-size", type=int, default=1000)
    ap.add_argument("--merge", action="store_true",
                    help="write_disposition merge on order_id (a Delta table) instead of append")
    ap.add_argument("--updated-since", help="send updated_since=TS with every request")
    ap.add_argument("--dataset", default="vendor")
    a = ap.parse_args()
    token = a.token if a.token is not None else os.environ.get("VENDOR_TOKEN")

    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    data_dir = os.path.join(out, "data")
    # dlt reads its configuration from the environment too: set it before dlt is imported
    os.environ["RUNTIME__DLTHUB_TELEMETRY"] = "false"
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "WARNING")
    os.environ["DLT_DATA_DIR"] = os.path.join(out, "dlt-home")
    os.environ["DLT_PROJECT_DIR"] = out  # no .dlt/config.toml of the caller's folder is read
    os.environ.pop("DESTINATION__FILESYSTEM__CREDENTIALS", None)

    import dlt
    from dlt.sources.rest_api import rest_api_source
    import pyarrow.parquet as pq

    disposition = "merge" if a.merge else "append"
    client = {"base_url": a.base_url.rstrip("/") + "/"}
    if token:
        client["auth"] = {"type": "bearer", "token": token}
    params = {"limit": a.page_size}
    if a.updated_since:
        params["updated_since"] = a.updated_since
    resource = {
        "name": "orders",
        "endpoint": {
            "path": "orders",
            "params": params,
            "data_selector": "data",
            "paginator": {"type": "cursor", "cursor_path": "meta.next", "cursor_param": "cursor"},
        },
        "primary_key": "order_id",
        "write_disposition": disposition,
        "columns": {"amount": {"data_type": "text"}},
    }
    if a.merge:
        resource["table_format"] = "delta"
    source = rest_api_source({"client": client, "resources": [resource]}, name="vendor_api")

    pipeline = dlt.pipeline(
        pipeline_name="dlt_pull",
        pipelines_dir=os.path.join(out, "pipelines"),
        destination=dlt.destinations.filesystem(bucket_url="file://" + data_dir),
        dataset_name=a.dataset,
        progress=None,
    )
    print(f"dlt {dlt.__version__}: write_disposition {disposition}"
          f"{' (Delta table)' if a.merge else ' (Parquet files)'}, pages of {a.page_size}, "
          f"into {data_dir}", file=sys.stderr)

    t0 = time.perf_counter()
    info = pipeline.run(source, loader_file_format="parquet")
    seconds = time.perf_counter() - t0
    info.raise_on_failed_jobs()

    norm = pipeline.last_trace.last_normalize_info
    rows = sum(n for t, n in norm.row_counts.items() if t == "orders")
    table_dir = os.path.join(data_dir, a.dataset, "orders")
    if a.merge:
        from deltalake import DeltaTable  # the table's current rows, not every file's

        rows_in_files = DeltaTable(table_dir).to_pyarrow_dataset().count_rows()
    else:
        files = sorted(glob.glob(os.path.join(table_dir, "*.parquet")))
        rows_in_files = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    print(json.dumps({
        "tool": "dlt",
        "version": dlt.__version__,
        "write_disposition": disposition,
        "rows": rows,
        "rows_in_files": rows_in_files,
        "seconds": round(seconds, 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
