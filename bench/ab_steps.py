#!/usr/bin/env python3
"""Two builds' decode steps side by side: the k25bench --profile-only results of an A/B job
(bench/run_h200.sh ab), the builds' runs alternated in one job so that both see the same GPU.

  python3 bench/ab_steps.py --base FILE [FILE ...] --new FILE [FILE ...] [--out FILE.md]

Prints a markdown table with a row per (context, rows): every run's decode step as served
(graph_step_ms, in the files' order), the change of new's mean step against base's, and new's
tok/s. A level only one build has is named on stderr and left out. A file without decode
profiles, or with a step that is not a positive number, stops it with the file's name and exit
status 2, as do builds without a level in common and an --out that cannot be written (checked
before anything is printed)."""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k25results import check_out, fail, read_jsonl, write_out, write_stdout  # noqa: E402

WHO = "ab_steps"


def steps(paths):
    """{(context, rows): [step ms of each file, in order]} of one build's files."""
    runs = {}
    for path in paths:
        rows = read_jsonl(path, WHO)
        profiles = [r.get("decode_profile") for r in rows]
        if not rows or not all(isinstance(p, dict) for p in profiles):
            fail(f"{WHO}: {path}: no decode profile on every line "
                 "(k25bench --profile-only writes one per level)")
        for n, p in enumerate(profiles, 1):
            ms = p.get("graph_step_ms")
            if type(ms) not in (int, float) or not 0 < ms < math.inf:
                fail(f"{WHO}: {path}:{n}: graph_step_ms {ms!r} is not a positive number "
                     "(no graph steps ran)")
            for k in ("context", "batch"):
                if k not in p:
                    fail(f"{WHO}: {path}:{n}: decode_profile has no {k}")
                if type(p[k]) is not int or p[k] < 1:
                    fail(f"{WHO}: {path}:{n}: decode_profile {k} {p[k]!r} is not a positive "
                         "integer")
            runs.setdefault((p["context"], p["batch"]), []).append(float(ms))
    return runs


def table(base, new):
    """The markdown lines of the comparison and the warnings for one-sided levels."""
    lines = ["| ctx | rows | base ms | new ms | change | new tok/s |",
             "| ---: | ---: | --- | --- | ---: | ---: |"]
    warn = []
    for key in sorted(set(base) | set(new)):
        if key not in base or key not in new:
            side = "base" if key in base else "new"
            warn.append(f"{WHO}: context {key[0]}, {key[1]} rows: only in {side}'s results")
            continue
        b, n = base[key], new[key]
        mb, mn = sum(b) / len(b), sum(n) / len(n)
        fmt = lambda v: " / ".join(f"{x:.3f}" for x in v)  # noqa: E731
        lines.append(f"| {key[0]} | {key[1]} | {fmt(b)} | {fmt(n)} | "
                     f"{100.0 * (mn - mb) / mb:+.1f}% | {1000.0 * key[1] / mn:.0f} |")
    return lines, warn


def main():
    ap = argparse.ArgumentParser(prog=WHO, description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", nargs="+", required=True, help="the base build's .jsonl files")
    ap.add_argument("--new", nargs="+", required=True, help="the new build's .jsonl files")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    if a.out:
        check_out(a.out, WHO)
    lines, warn = table(steps(a.base), steps(a.new))
    for w in warn:
        print(w, file=sys.stderr)
    if len(lines) == 2:
        fail(f"{WHO}: base and new have no (context, rows) level in common")
    text = "\n".join(lines) + "\n"
    write_stdout(text, WHO)
    if a.out:
        write_out(a.out, text, WHO)


if __name__ == "__main__":
    main()
