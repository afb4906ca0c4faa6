#!/usr/bin/env python3
"""Run one command and measure it: wall-clock seconds and the child's peak RSS.

    measure.py --label NAME --out FILE.json [--log FILE] -- CMD [ARGS...]

One process per measurement: this script starts exactly one child, waits for it, then reads
getrusage(RUSAGE_CHILDREN).ru_maxrss, which on Linux is the peak resident set size (KiB) of the
largest waited-for descendant. It also records the machine's steal time during the job (the
`steal` column of /proc/stat: CPU time the hypervisor gave to other guests while this one wanted
it), so a run slowed by a noisy neighbour can be told from a slow run. The child's stdout/stderr pass through (and are copied to --log
when given). The measurement is written as JSON to --out and summarised on stderr. The exit
status is the child's.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time


def steal_s():
    """Seconds of steal time of all CPUs so far (Linux), or None where /proc/stat has none."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


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

    steal0 = steal_s()
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
    steal1 = steal_s()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = {
        "label": a.label,
        "cmd": cmd,
        "exit": rc,
        "wall_s": round(wall, 3),
        "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),  # Linux: KiB
        "user_s": round(ru.ru_utime, 3),
        "sys_s": round(ru.ru_stime, 3),
        "steal_s": round(steal1 - steal0, 3) if steal0 is not None and steal1 is not None else None,
    }
    with open(a.out, "w") as f:
        json.dump(rec, f)
        f.write("\n")
    print(
        f"[measure] {a.label}: {wall:.2f} s wall, {rec['user_s']:.1f} s user, "
        f"{rec['sys_s']:.1f} s sys, {rec['steal_s'] if rec['steal_s'] is not None else '?'} s stolen, peak RSS {rec['peak_rss_mb']:.0f} MB, exit {rc}",
        file=sys.stderr,
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
