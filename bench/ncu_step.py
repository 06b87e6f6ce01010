#!/usr/bin/env python3
"""One decode step kernel by kernel, from an ncu CSV of a k25dec run (isolated kernel times).

k25bench's --profile-steps times each backend operation alone with a sync after it, which
inflates every small kernel by a launch and a sync; ncu instead times every kernel of a CUDA
graph replay on the device. This script takes the kernels of the last step (from the last
embedding kernel on), prints them in stream order with grid and block, and sums them by
operation group, next to the bytes floor that the caller may pass per group.

  ncu --clock-control none --cache-control none --graph-profiling node \
      --metrics gpu__time_duration.sum --csv --log-file step.csv \
      ./k25dec --config config/kimi_k25.ini --synthetic 1 --backend cuda --set run.sim_tp=8 \
      --set model.num_hidden_layers=4 --tokens <ids> -n 4
  bench/ncu_step.py step.csv [--step -1] [--markdown]

ncu serializes kernels, so the durations do not include overlap with the previous kernel
(programmatic dependent launch) or the side branch beside the routed experts: the graph replay
of the same step takes less than the sum. A file that cannot be read ends it with one line on
stderr and exit status 2.
"""
import argparse
import csv
import re

from k25results import fail, number, open_text

WHO = "ncu_step.py"
# ncu's time units (--print-units auto or base) -> (multiplier, divisor) to microseconds
UNITS = {"ns": (1, 1000), "nsecond": (1, 1000), "us": (1, 1), "usecond": (1, 1),
         "ms": (1000, 1), "msecond": (1000, 1), "s": (1000000, 1), "second": (1000000, 1)}

# kernel name prefix -> operation group (the groups of k25bench's breakdown)
GROUPS = [
    ("embed_kernel", "other"),
    ("gemv_tile_kernel", "projections"),
    ("gemv_bf16_kernel", "projections"),
    ("nvjet", "projections"),
    ("cublasLt", "projections"),
    ("f32_to_bf16", "projections"),
    ("sum2", "projections"),  # the sum of a projection's hi and lo products (cuBLASLt path)
    ("mla_", "attention"),
    ("router_", "router"),
    ("moe_route", "experts"),
    ("w4a16_", "experts"),
    ("bf16_grouped", "experts"),
    ("moe_", "experts"),
    ("silu_mul", "ffn glue"),
    ("add_kernel", "ffn glue"),
    ("rmsnorm", "norms"),
    ("os_", "allreduce"),
    ("nccl", "allreduce"),
    ("sample", "sampling"),
]


def group_of(name):
    for prefix, g in GROUPS:
        if name.startswith(prefix):
            return g
    return "other"


def short(name):
    name = re.sub(r"^void ", "", name)
    return re.sub(r"\(.*", "", name)


def read(path):
    """(name, grid, block, microseconds) of every profiled kernel, in launch order."""
    lines = [l for l in open_text(path, WHO) if l.startswith('"')]  # ncu's messages are not CSV
    reader = csv.DictReader(lines)
    head = reader.fieldnames or []  # none: no CSV at all, named below with a hint
    missing = [c for c in ("Kernel Name", "Grid Size", "Block Size", "Metric Value")
               if head and c not in head]
    if missing:
        fail(f"{WHO}: {path}: no {missing[0]} column in its header")
    rows = []
    for d in reader:
        if d.get("Metric Name") != "gpu__time_duration.sum":
            continue
        what = f"{WHO}: {path}: kernel {d.get('ID', '?')} ({short(d['Kernel Name'] or '?')}):"
        if None in d.values():
            fail(f"{what} fewer fields than the header")
        v = number(d["Metric Value"].replace(",", ""), float, f"{what} duration")
        unit = d.get("Metric Unit", "ns")
        if unit not in UNITS:
            fail(f"{what} unit {unit!r} is none of {', '.join(UNITS)}")
        if v < 0:
            fail(f"{what} duration {v} is negative")
        mul, div = UNITS[unit]
        rows.append((d["Kernel Name"], d["Grid Size"], d["Block Size"], v * mul / div))
    if not rows:
        fail(f"{WHO}: {path}: no gpu__time_duration.sum rows (was ncu run with --csv and that "
             "metric?)")
    return rows


def steps(path, rows):
    starts = [i for i, r in enumerate(rows) if short(r[0]).startswith("embed_kernel")]
    if not starts:
        fail(f"{WHO}: {path}: no embedding kernel among its {len(rows)} kernels, so no step "
             "starts there (a window still in the weight upload? raise ncu's --launch-skip)")
    return [rows[a:b] for a, b in zip(starts, starts[1:] + [len(rows)])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=-1, help="which step (python index, default last)")
    ap.add_argument("--markdown", action="store_true", help="markdown tables")
    a = ap.parse_args()
    all_steps = steps(a.csv, read(a.csv))
    if not -len(all_steps) <= a.step < len(all_steps):
        fail(f"{WHO}: {a.csv}: --step {a.step}: the file holds {len(all_steps)} step(s) "
             f"(0..{len(all_steps) - 1}, or -1..-{len(all_steps)})")
    step = all_steps[a.step]
    total = sum(r[3] for r in step)
    if not total > 0:
        fail(f"{WHO}: {a.csv}: step {a.step}: its kernels took no time")
    md = a.markdown
    if md:
        print("| # | kernel | group | grid | block | us |\n|---:|---|---|---|---|---:|")
    for i, (name, grid, block, us) in enumerate(step):
        n, g = short(name), group_of(short(name))
        print(f"| {i} | {n} | {g} | {grid} | {block} | {us:.2f} |" if md else
              f"{i:4d}  {n:44.44s} {g:12s} {grid:>14s} {block:>14s} {us:9.2f}")
    sums = {}
    for name, _, _, us in step:
        g = group_of(short(name))
        sums[g] = sums.get(g, 0.0) + us
    print()
    if md:
        print("| group | kernels | us | share |\n|---|---:|---:|---:|")
    for g, us in sorted(sums.items(), key=lambda kv: -kv[1]):
        k = sum(1 for r in step if group_of(short(r[0])) == g)
        print(f"| {g} | {k} | {us:.1f} | {100 * us / total:.1f}% |" if md else
              f"{g:12s} {k:4d} kernels {us:9.1f} us {100 * us / total:5.1f}%")
    print(f"\n{len(step)} kernels, {total:.1f} us in all (step {a.step} of {len(all_steps)}; "
          "isolated kernel times: the graph replay overlaps part of them)")


if __name__ == "__main__":
    main()
