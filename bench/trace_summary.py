#!/usr/bin/env python3
"""Summary of a kernel trace (k25bench --trace FILE.csv) as markdown tables.

For each batch size (rows) in the trace:
  - the step: its span on the GPU (first kernel start to last kernel end), the time some kernel
    ran, and the idle time between kernels;
  - per kernel: launches a step, mean duration in place (start to end, overlap included), and the
    time it adds to the step's frontier: walking the kernels in start order, the part of each
    one that ends after every earlier kernel has ended. The frontier times and the idle time add
    up to the span, so they say where the step's time goes with the overlap of programmatic
    dependent launch and of the second stream counted once;
  - with --layer, one layer's kernels in order (from after one attention kernel to the next, in
    the middle of the first step): start after the previous kernel's end (negative: overlap),
    duration, frontier time, shared-memory configuration; then each of those kernels' median
    frontier time over every layer of every step with the same kernel sequence (one layer's
    figures move by tenths of a microsecond from layer to layer);
  - with --against OTHER (another build's trace), those medians beside OTHER's for the same
    row count, kernel by kernel (a kernel only one of them has gets a row of its own).
A trace that cannot be read ends it with one line on stderr and exit status 2.
"""
import argparse
import difflib
import statistics
from collections import OrderedDict, defaultdict

from k25results import at_least, fail, number, read_csv

WHO = "trace_summary.py"
COLUMNS = ["rows", "step", "start_ns", "end_ns", "stream", "grid", "block", "smem_config", "name"]


def short_name(name):
    """The kernel's name with its template arguments, without return type and parameters."""
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            return name[:i]
    return name


def load(path):
    steps = defaultdict(lambda: defaultdict(list))  # rows -> step -> kernels
    for line, r in read_csv(path, WHO, COLUMNS):
        v = {c: number(r[c], int, f"{WHO}: {path}:{line}: {c}")
             for c in ("rows", "step", "start_ns", "end_ns", "smem_config")}
        if v["end_ns"] < v["start_ns"]:
            fail(f"{WHO}: {path}:{line}: the kernel ends before it starts")
        k = {
            "start": v["start_ns"] / 1000.0,
            "end": v["end_ns"] / 1000.0,
            "stream": r["stream"],
            "grid": r["grid"],
            "block": r["block"],
            "smem": v["smem_config"] // 1024,
            "name": short_name(r["name"]),
        }
        steps[v["rows"]][v["step"]].append(k)
    for rows, by_step in steps.items():
        for ks in by_step.values():
            ks.sort(key=lambda k: k["start"])
        # the shares of the span need some span
        if all(ks[-1]["end"] == ks[0]["start"] for ks in by_step.values()):
            fail(f"{WHO}: {path}: the {rows}-row steps take no time (each kernel ends as it "
                 "starts)")
    return steps


def frontier(ks):
    """Per kernel the time it adds to the frontier; idle time; busy time."""
    front = ks[0]["start"]
    idle = 0.0
    adds = []
    for k in ks:
        if k["start"] > front:
            idle += k["start"] - front
            front = k["start"]
        adds.append(max(0.0, k["end"] - front))
        front = max(front, k["end"])
    return adds, idle


def summarize(rows, by_step, top, layer, other=None):
    spans, idles, counts = [], [], []
    per = OrderedDict()
    for ks in by_step.values():
        adds, idle = frontier(ks)
        spans.append(ks[-1]["end"] - ks[0]["start"])
        idles.append(idle)
        counts.append(len(ks))
        for k, a in zip(ks, adds):
            p = per.setdefault(k["name"], {"n": 0, "dur": 0.0, "add": 0.0, "smem": set()})
            p["n"] += 1
            p["dur"] += k["end"] - k["start"]
            p["add"] += a
            p["smem"].add(k["smem"])
    n = len(by_step)
    span = statistics.mean(spans)
    print(f"## {rows} rows: {n} steps, span {span:.1f} us (min {min(spans):.1f}, max "
          f"{max(spans):.1f}), idle between kernels {statistics.mean(idles):.1f} us, "
          f"{statistics.mean(counts):.0f} kernels a step\n")
    print("| kernel | a step | mean us | frontier us a step | % of span | smem config KB |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    order = sorted(per.items(), key=lambda kv: -kv[1]["add"])
    for name, p in order[:top]:
        smem = ",".join(str(s) for s in sorted(p["smem"]))
        print(f"| `{name}` | {p['n'] / n:.0f} | {p['dur'] / p['n']:.2f} | {p['add'] / n:.1f} | "
              f"{100 * p['add'] / n / span:.1f} | {smem} |")
    rest = order[top:]
    if rest:
        add = sum(p["add"] for _, p in rest) / n
        print(f"| {len(rest)} others | | | {add:.1f} | {100 * add / span:.1f} | |")
    print(f"| idle | | | {statistics.mean(idles):.1f} | "
          f"{100 * statistics.mean(idles) / span:.1f} | |\n")
    if layer:
        ref = print_layer(rows, by_step[min(by_step)], layer)
        if ref:
            mine = print_layer_medians(by_step, layer, ref)
            if other:
                print_against(other, layer, ref, mine)


def layer_bounds(ks, anchor):
    """[lo, hi) of each layer of a step: after one anchor kernel up to and with the next."""
    at = [i for i, k in enumerate(ks) if k["name"].startswith(anchor)]
    return [(a + 1, b + 1) for a, b in zip(at, at[1:])]


def middle_layer(ks, anchor):
    """[lo, hi) of the middle layer of the step ks, None without a layer."""
    bounds = layer_bounds(ks, anchor)
    return bounds[(len(bounds) - 1) // 2] if bounds else None


def print_layer(rows, ks, anchor):
    """The middle layer of the step ks; returns its kernel names (None without a layer)."""
    mid = middle_layer(ks, anchor)
    if not mid:
        print(f"(no two '{anchor}' kernels in a {rows}-row step: no layer shown)\n")
        return None
    lo, hi = mid
    adds, _ = frontier(ks)
    print(f"One layer of a {rows}-row step (kernels {lo}-{hi - 1}, after one `{anchor}` kernel to "
          "the next):\n")
    print("| # | kernel | stream | grid | block | after prev end us | us | frontier us | smem KB |")
    print("| ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    tot = 0.0
    for i in range(lo, hi):
        k = ks[i]
        gap = k["start"] - ks[i - 1]["end"]
        tot += adds[i]
        print(f"| {i} | `{k['name']}` | {k['stream']} | {k['grid']} | {k['block']} | {gap:.2f} | "
              f"{k['end'] - k['start']:.2f} | {adds[i]:.2f} | {k['smem']} |")
    print(f"\nThe layer's span: {ks[hi - 1]['end'] - ks[lo - 1]['end']:.1f} us; its kernels' "
          f"frontier time {tot:.1f} us.\n")
    return [k["name"] for k in ks[lo:hi]]


def layer_frontiers(by_step, anchor, ref):
    """Per position of the layer ref, its frontier times over every layer with ref's kernels."""
    per = [[] for _ in ref]
    for ks in by_step.values():
        adds, _ = frontier(ks)
        for lo, hi in layer_bounds(ks, anchor):
            if [k["name"] for k in ks[lo:hi]] == ref:
                for j in range(hi - lo):
                    per[j].append(adds[lo + j])
    return per


def print_layer_medians(by_step, anchor, ref):
    """Prints the medians (with min and max) of the layer ref's kernels; returns the medians."""
    per = layer_frontiers(by_step, anchor, ref)
    n = len(per[0])
    print(f"Frontier us of the same kernels over {n} layers with this sequence "
          "(median, min, max):\n")
    print("| # | kernel | median | min | max |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for j, name in enumerate(ref):
        print(f"| {j} | `{name}` | {statistics.median(per[j]):.2f} | {min(per[j]):.2f} | "
              f"{max(per[j]):.2f} |")
    medians = [statistics.median(p) for p in per]
    print(f"\nSum of the medians: {sum(medians):.1f} us.\n")
    return medians


def print_against(other, anchor, ref, mine):
    """This trace's layer medians (mine, of ref's kernels) beside those of other (the same row
    count's steps)."""
    ks = other[min(other)]
    mid = middle_layer(ks, anchor)
    if not mid:
        print(f"(the other trace has no layer between '{anchor}' kernels)\n")
        return
    lo, hi = mid
    oref = [k["name"] for k in ks[lo:hi]]
    theirs = [statistics.median(p) for p in layer_frontiers(other, anchor, oref)]
    print("Medians against the other trace (us; a kernel only one of them has: its own row):\n")
    print("| # | kernel | this | other | this - other |")
    print("| ---: | --- | ---: | ---: | ---: |")
    match = difflib.SequenceMatcher(None, ref, oref, autojunk=False)
    for op, i0, i1, j0, j1 in match.get_opcodes():
        if op == "equal":
            for i, j in zip(range(i0, i1), range(j0, j1)):
                print(f"| {i} | `{ref[i]}` | {mine[i]:.2f} | {theirs[j]:.2f} | "
                      f"{mine[i] - theirs[j]:+.2f} |")
            continue
        for i in range(i0, i1):
            print(f"| {i} | `{ref[i]}` | {mine[i]:.2f} | — | |")
        for j in range(j0, j1):
            print(f"| | `{oref[j]}` | — | {theirs[j]:.2f} | |")
    print(f"\nSums: this {sum(mine):.1f} us, other {sum(theirs):.1f} us, difference "
          f"{sum(mine) - sum(theirs):+.1f} us.\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="CSV written by k25bench --trace (or that CSV xz-compressed)")
    ap.add_argument("--top", type=at_least(0), default=25, help="kernels listed per batch size")
    ap.add_argument("--layer", default="mla_attn", metavar="NAME",
                    help="kernel that delimits the layer shown ('' for none)")
    ap.add_argument("--against", metavar="OTHER",
                    help="another trace: its layer medians beside these, per row count")
    a = ap.parse_args()
    steps = load(a.trace)
    if not steps:
        fail(f"{WHO}: {a.trace}: no kernels in marked steps")
    other = load(a.against) if a.against else {}
    if a.against and not other:
        fail(f"{WHO}: {a.against}: no kernels in marked steps")
    for rows in sorted(steps):
        summarize(rows, steps[rows], a.top, a.layer, other.get(rows))


if __name__ == "__main__":
    main()
