#!/usr/bin/env python3
"""Merges the results of one benchmark sweep into one markdown table (and a plot).

usage: bench/merge_results.py RESULTS_DIR [--expect N] [--no-plot]

RESULTS_DIR is what scripts/slurm/bench-sweep.sbatch tasks wrote: task_<i>.jsonl (the JSON
lines of k25bench --json, one object per concurrency level) and task_<i>.args (the sweep line
of task i). Writes into RESULTS_DIR:
  summary.md     run description + one table row per (task, level), also printed on stdout
  results.jsonl  every row, with "sweep_task" and "sweep_args" added
  plot.png       output tok/s and TPOT against concurrency, one curve per setting (the sweep
                 line without its --concurrency), through bench/plot.py when it and
                 matplotlib are there
Exit status: 0; 1 when a task of 0..N-1 (--expect) has no results, or misses a level its
--concurrency asked for (the table still lists what there is), or when the plot fails (not when
matplotlib is missing: then there is no plot, with a message); 2 on unreadable input or an
output file that cannot be written (both found before any file is written), or a failing stdout.
"""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

from k25results import at_least, check_out, fail, open_text, read_jsonl, write_out, write_stdout

WHO = "merge_results.py"

# Each column: header, the JSON names it may have (k25bench's first), format.
COLUMNS = [
    ("conc", ("max_concurrency", "concurrency"), "{:d}"),
    ("reqs", ("completed", "num_prompts"), "{:d}"),
    ("out tok/s", ("output_throughput", "output_tok_s"), "{:.2f}"),
    ("total tok/s", ("total_token_throughput", "total_tok_s"), "{:.2f}"),
    ("TTFT p50 ms", ("median_ttft_ms", "ttft_ms_median"), "{:.2f}"),
    ("TPOT p50 ms", ("median_tpot_ms", "tpot_ms_median"), "{:.2f}"),
    ("TPOT p99 ms", ("p99_tpot_ms", "tpot_ms_p99"), "{:.2f}"),
    ("ITL p50 ms", ("median_itl_ms", "itl_ms_median"), "{:.2f}"),
    ("E2E p50 ms", ("median_e2el_ms", "e2el_ms_median"), "{:.2f}"),
]
# Facts about the run printed above the table when every row agrees on them.
FACTS = ["model", "weights", "ranks", "tp", "pp", "backend", "devices", "nccl", "hosts", "git",
         "input_len", "output_len", "range_ratio", "ctx_size"]


def field(row, names):
    for n in names:
        if n in row:
            return row[n]
    return None


def fmt(value, spec):
    if value is None:
        return "-"
    try:
        return spec.format(int(value) if spec == "{:d}" else float(value))
    except (TypeError, ValueError):
        return str(value)


def split_args(line):
    """The sweep line's --concurrency levels (None when absent) and the rest of the line."""
    words = shlex.split(line)
    levels, rest, i = None, [], 0
    while i < len(words):
        w = words[i]
        if w == "--concurrency" and i + 1 < len(words):
            levels, i = words[i + 1], i + 2
            continue
        if w.startswith("--concurrency="):
            levels, i = w.split("=", 1)[1], i + 1
            continue
        rest.append(w)
        i += 1
    parsed = None
    if levels is not None:
        try:
            parsed = sorted({int(x) for x in levels.split(",") if x})
        except ValueError:
            parsed = None
    return parsed, " ".join(shlex.quote(w) for w in rest)


def load(results_dir):
    """{task index: (sweep line, [rows])} for every task_<i>.jsonl / task_<i>.args."""
    tasks = {}
    paths = glob.glob(os.path.join(results_dir, "task_*.jsonl"))
    paths += glob.glob(os.path.join(results_dir, "task_*.args"))
    for p in sorted(paths):
        m = re.fullmatch(r"task_(\d+)\.(jsonl|args)", os.path.basename(p))
        if not m:
            fail(f"{WHO}: {p}: not a task's file (task_<number>.jsonl or .args)")
        i = int(m.group(1))
        line, rows = tasks.get(i, ("", []))
        if p.endswith(".args"):
            line = open_text(p, WHO).read().strip()
            try:
                shlex.split(line)
            except ValueError as e:
                fail(f"{WHO}: {p}: not a sweep line: {e}")
        else:
            rows = read_jsonl(p, WHO)
            for n, r in enumerate(rows, 1):
                if r.get("profile_only") is True:
                    fail(f"{WHO}: {p}:{n}: a k25bench --profile-only line (decode steps, no "
                         "serving level): the summary tabulates serving levels")
                level = field(r, COLUMNS[0][1])
                if type(level) is not int or level < 1:
                    fail(f"{WHO}: {p}:{n}: concurrency level {level!r} is not a positive "
                         f"integer ({' or '.join(COLUMNS[0][1])})")
        tasks[i] = (line, rows)
    return tasks


def check(tasks, expect):
    """Messages for every missing task or level."""
    problems = []
    if not any(rows for _, rows in tasks.values()):
        problems.append("no results at all")
    indices = range(expect) if expect is not None else sorted(tasks)
    for i in indices:
        line, rows = tasks.get(i, ("", []))
        if not rows:
            problems.append(f"task {i} ({line or 'no sweep line'}): no results")
            continue
        levels, _ = split_args(line)
        if levels is None:
            continue
        got = {field(r, COLUMNS[0][1]) for r in rows}
        missing = [lv for lv in levels if lv not in got]
        if missing:
            problems.append(f"task {i} ({line}): no row for concurrency "
                            + ",".join(map(str, missing)))
    return problems


def markdown(name, tasks):
    rows = [(i, split_args(line)[1] or "(defaults)", r)
            for i, (line, task_rows) in sorted(tasks.items()) for r in task_rows]
    out = [f"# Sweep {name}", ""]
    for key in FACTS:
        values = [r[key] for _, _, r in rows if key in r]
        if len(values) == len(rows) and values and all(v == values[0] for v in values):
            out.append(f"- {key}: {values[0]}")
    dates = sorted(str(r["date"]) for _, _, r in rows if "date" in r)
    if dates:
        out.append(f"- date: {dates[0]}" + (f" .. {dates[-1]}" if dates[-1] != dates[0] else ""))
    out.append("")
    header = ["task", "settings"] + [c[0] for c in COLUMNS]
    out.append("| " + " | ".join(header) + " |")
    out.append("| ---: | --- | " + " | ".join("---:" for _ in COLUMNS) + " |")
    rows.sort(key=lambda t: (t[0], field(t[2], COLUMNS[0][1]) or 0))
    for i, setting, r in rows:
        cells = [str(i), setting.replace("|", "\\|")]
        cells += [fmt(field(r, names), spec) for _, names, spec in COLUMNS]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def units(args):
    """'--a 1 --b --c x' -> ['--a 1', '--b', '--c x']: options with their values."""
    out = []
    for w in shlex.split(args):
        if out and not w.startswith("-") and len(out[-1].split(" ")) == 1:
            out[-1] += " " + w
        else:
            out.append(w)
    return out


def short_labels(settings):
    """Curve labels: only what tells the settings apart (all of it for a single curve)."""
    if len(settings) < 2:
        return settings
    split = [units(s) for s in settings]
    common = set.intersection(*(set(u) for u in split))
    return [" ".join(u for u in us if u not in common) or "baseline" for us in split]


def plot(out, tasks):
    """One curve per setting through bench/plot.py. Returns a message for the log, and False
    when plot.py failed (no plot.py or no matplotlib is no failure)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot.py")
    if not os.path.exists(script):
        return "no plot: bench/plot.py not found", True
    groups = {}
    for i, (line, rows) in sorted(tasks.items()):
        groups.setdefault(split_args(line)[1] or "(defaults)", []).extend(rows)
    with tempfile.TemporaryDirectory() as tmp:
        labels, files = [], []
        for label, rows in zip(short_labels(list(groups)), groups.values()):
            if not rows:
                continue
            path = os.path.join(tmp, f"setting_{len(files)}.jsonl")
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            labels += ["--label", label]
            files.append(path)
        if not files:
            return "no plot: no results", True
        p = subprocess.run([sys.executable, script, "--out", out] + labels + files,
                           capture_output=True, text=True)
    if p.returncode == 3:
        return "no plot: matplotlib is not installed", True
    if p.returncode != 0:
        return f"{WHO}: no plot: bench/plot.py failed ({p.returncode}): {p.stderr.strip()}", False
    return f"plot: {out}", True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--expect", type=at_least(1), help="number of tasks in the sweep (0..N-1)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    if not os.path.isdir(args.results_dir):
        fail(f"{WHO}: {args.results_dir}: not a directory")
    summary, merged, png = (os.path.join(args.results_dir, f)
                            for f in ("summary.md", "results.jsonl", "plot.png"))
    for out in (summary, merged) + (() if args.no_plot else (png,)):
        check_out(out, WHO)
    tasks = load(args.results_dir)
    name = os.path.basename(os.path.normpath(args.results_dir))
    table = markdown(name, tasks)
    write_out(summary, table, WHO)
    write_out(merged, "".join(json.dumps(dict(r, sweep_task=i, sweep_args=line)) + "\n"
                              for i, (line, rows) in sorted(tasks.items()) for r in rows), WHO)
    write_stdout(table, WHO)
    plotted = True
    if not args.no_plot:
        msg, plotted = plot(png, tasks)
        print(msg, file=sys.stderr)
    problems = check(tasks, args.expect)
    for p in problems:
        print(f"{WHO}: {p}", file=sys.stderr)
    return 1 if problems or not plotted else 0


if __name__ == "__main__":
    sys.exit(main())
