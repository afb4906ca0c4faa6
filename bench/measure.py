#!/usr/bin/env python3
"""Run one command and measure it: wall-clock seconds and the child's peak RSS.

    measure.py --label NAME --out FILE.json [--log FILE] -- CMD [ARGS...]

One process per measurement: this script starts exactly one child, waits for it, then reads
getrusage(RUSAGE_CHILDREN).ru_maxrss, which on Linux is the peak resident set size (KiB) of the
largest waited-for descendant. The child's stdout/stderr pass through (and are copied to --log
when given). The measurement is written as JSON to --out and summarised on stderr. The exit
status is the child's.
"""
import argparse
import json
import resource
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True, help="JSON file the measurement is written to")
    ap.add_argument("--log", help="also copy the child's stdout and stderr to this file")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command given after --")

    t0 = time.perf_counter()
    if a.log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        with open(a.log, "wb") as log:
            for line in p.stdout:  # type: ignore[union-attr]
                log.write(line)
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
        rc = p.wait()
    else:
        rc = subprocess.call(cmd)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = {
        "label": a.label,
        "cmd": cmd,
        "exit": rc,
        "wall_s": round(wall, 3),
        "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),  # Linux: KiB
        "user_s": round(ru.ru_utime, 3),
        "sys_s": round(ru.ru_stime, 3),
    }
    with open(a.out, "w") as f:
        json.dump(rec, f)
        f.write("\n")
    print(
        f"[measure] {a.label}: {wall:.2f} s wall, {rec['user_s']:.1f} s user, "
        f"{rec['sys_s']:.1f} s sys, peak RSS {rec['peak_rss_mb']:.0f} MB, exit {rc}",
        file=sys.stderr,
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
