#!/usr/bin/env python3
"""Where a kernel's warps wait, by SASS instruction, from ncu's source page.

    ncu -i report.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/ncu_source.py sass.csv [--top 20] [--kernel N]

Prints, per profiled kernel (or only the N-th, from 0), the stall reasons summed over all
sampled instructions and the instructions with the most samples, each with its three largest
stall reasons, as markdown. The report must have been collected with warp sampling (--set full).
A file that cannot be read ends it with one line on stderr and exit status 2.
"""
import argparse
import collections
import csv

from k25results import at_least, fail, open_text

WHO = "ncu_source.py"
SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(rows):
    """(name, header, data rows) for each kernel block of the CSV."""
    i = 0
    while i < len(rows):
        if rows[i] and rows[i][0] == "Kernel Name":
            name = rows[i][1] if len(rows[i]) > 1 else "?"
            head = rows[i + 1] if i + 1 < len(rows) else []
            j = i + 2
            while j < len(rows) and not (rows[j] and rows[j][0] == "Kernel Name"):
                j += 1
            yield name, head, [r for r in rows[i + 2:j] if r]
            i = j
        else:
            i += 1


def num(s):
    try:
        return float(s)
    except ValueError:
        return 0.0


def check(path, name, head, data):
    """Ends the tool unless the kernel block has the columns report reads, in every row."""
    if SAMPLES not in head:
        fail(f"{WHO}: {path}: kernel {name}: no '{SAMPLES}' column (collected without warp "
             "sampling? ncu --set full)")
    if any(len(r) < max(len(head), 2) for r in data):  # 2: the address and the instruction
        fail(f"{WHO}: {path}: kernel {name}: a row has fewer fields than the header")


def report(name, head, data, top):
    col = {n: k for k, n in enumerate(head)}
    stalls = [n for n in head if n.startswith("stall_") and "Not Issued" not in n]
    samp = col[SAMPLES]
    total = collections.Counter()
    for r in data:
        for s in stalls:
            total[s] += num(r[col[s]])
    n = sum(total.values()) or 1
    short = name[:name.find(">(") + 1] if ">(" in name else name.split("(")[0]
    print(f"### {short}\n\n{int(n)} samples\n")
    print("| stall reason | samples | share |\n| --- | ---: | ---: |")
    for s, v in total.most_common():
        if v:
            print(f"| {s[6:]} | {int(v)} | {100 * v / n:.1f}% |")
    print("\n| address | samples | share | instruction | top reasons |\n"
          "| --- | ---: | ---: | --- | --- |")
    for r in sorted(data, key=lambda r: -num(r[samp]))[:top]:
        why = sorted(((num(r[col[s]]), s[6:]) for s in stalls), reverse=True)[:3]
        why = ", ".join(f"{s} {int(v)}" for v, s in why if v)
        print(f"| {r[0][-5:]} | {int(num(r[samp]))} | {100 * num(r[samp]) / n:.1f}% "
              f"| `{r[1].strip()}` | {why} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=at_least(0), default=20)
    ap.add_argument("--kernel", type=at_least(0), default=None,
                    help="only the N-th kernel (from 0)")
    a = ap.parse_args()
    rows = list(csv.reader(open_text(a.csv, WHO)))
    # the export can repeat a kernel's block: keep the first of identical ones
    found = []
    for k in kernels(rows):
        if not found or found[-1] != k:
            found.append(k)
    if not found:
        fail(f"{WHO}: {a.csv}: no 'Kernel Name' block (not an ncu --page source --csv export)")
    if a.kernel is not None and a.kernel >= len(found):
        fail(f"{WHO}: {a.csv}: --kernel {a.kernel}: the file holds {len(found)} kernel(s) "
             f"(0..{len(found) - 1})")
    for name, head, data in found:
        check(a.csv, name, head, data)
    for k, (name, head, data) in enumerate(found):
        if a.kernel is None or a.kernel == k:
            report(name, head, data, a.top)


if __name__ == "__main__":
    main()
