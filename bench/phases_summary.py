#!/usr/bin/env python3
"""Summary of in-kernel phase stamps (k25bench --phases FILE.csv, a build with make PHASES=1).

The stamps are the last MoE layer's of the breakdown's last decode step as served: the router's
top-k (with the routing sort), then the grouped W4A16 gate+up and down GEMMs
(kernels/phase_stamps.cuh names the phases). For each batch size (rows) in the file:
  - each phase's time over the blocks (median, 10th percentile, maximum), in us after the
    routing's end (block 0 of the router at its last stamp): when the blocks reach it;
  - each block's intervals between phases (median and maximum over the blocks), and the units a
    block ran with the mean time a unit took after the wait.
Blocks whose entry stamp is more than 1 ms older than their kernel's latest one are left out:
they belong to an earlier launch with a larger grid. A file that cannot be read, or holds no
stamps, ends it with one line on stderr and exit status 2.
"""
import argparse
import statistics
from collections import defaultdict

from k25results import fail, number, read_csv

WHO = "phases_summary.py"

PHASES = {
    "router": ["entry", "waited", "row chosen", "end"],
    "gate_up": ["entry", "waited", "expert id", "first chunk", "consumed", "counted",
                "unit end", "exit"],
}
PHASES["down"] = PHASES["gate_up"]
INTERVALS = [("entry -> waited", 0, 1), ("entry -> expert id", 0, 2), ("wait -> expert id", 1, 2),
             ("expert id -> first chunk", 2, 3),
             ("first chunk -> consumed", 3, 4), ("consumed -> counted", 4, 5),
             ("counted -> unit end", 5, 6), ("consumed -> unit end", 4, 6),
             ("entry -> exit", 0, 7)]


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def load(path):
    by_rows = defaultdict(lambda: defaultdict(list))
    stamps = ["t%d" % p for p in range(8)]
    for line, r in read_csv(path, WHO, ["rows", "site", "units"] + stamps):
        where = f"{WHO}: {path}:{line}:"
        if not r["t0"]:
            fail(f"{where} no t0 (every block stamps its entry)")
        t = [number(r[s], float, f"{where} {s}") / 1e3 if r[s] else None for s in stamps]
        by_rows[number(r["rows"], int, f"{where} rows")][r["site"]].append(
            (number(r["units"], int, f"{where} units"), t))
    if not by_rows:
        fail(f"{WHO}: {path}: no stamps")
    for sites in by_rows.values():
        for site, blocks in sites.items():
            latest = max(t[0] for _, t in blocks)
            sites[site] = [(u, t) for u, t in blocks if t[0] >= latest - 1000.0]
    return by_rows


def summarize(rows, sites):
    out = ["## %d rows" % rows, ""]
    router = sites.get("router", [])
    origin = next((t[3] for u, t in router if t[3] is not None), None)
    if origin is None:
        origin = min(t[0] for blocks in sites.values() for _, t in blocks)
        out += ["(no router stamps: times after the earliest stamp)", ""]
    out += ["| kernel | blocks | phase | median us | p10 | max |",
            "| --- | ---: | --- | ---: | ---: | ---: |"]
    for site in ("router", "gate_up", "down"):
        blocks = sites.get(site, [])
        for p, name in enumerate(PHASES[site]):
            v = [t[p] - origin for _, t in blocks if t[p] is not None]
            if v:
                out.append("| %s | %d | %s | %.2f | %.2f | %.2f |" % (
                    site, len(v), name, statistics.median(v), pct(v, 0.1), max(v)))
    out += ["", "| kernel | interval (each block) | blocks | median us | max |",
            "| --- | --- | ---: | ---: | ---: |"]
    for site in ("gate_up", "down"):
        blocks = sites.get(site, [])
        for name, a, b in INTERVALS:
            v = [t[b] - t[a] for _, t in blocks if t[a] is not None and t[b] is not None]
            if v:
                out.append("| %s | %s | %d | %.2f | %.2f |" % (site, name, len(v),
                                                              statistics.median(v), max(v)))
        units = [(u, t) for u, t in blocks if u > 0 and t[1] is not None and t[7] is not None]
        if units:
            per = [(t[7] - t[1]) / u for u, t in units]
            out.append("| %s | units a block: median %d, max %d; us a unit after the wait | %d "
                       "| %.2f | %.2f |" % (site, statistics.median(u for u, _ in units),
                                            max(u for u, _ in units), len(per),
                                            statistics.median(per), max(per)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="k25bench --phases output")
    a = ap.parse_args()
    by_rows = load(a.csv)
    lines = []
    for rows in sorted(by_rows):
        lines += summarize(rows, by_rows[rows]) + [""]
    print("\n".join(lines).rstrip())


if __name__ == "__main__":
    main()
