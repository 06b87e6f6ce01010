#!/usr/bin/env python3
"""Plots k25bench results: output tok/s (and the decode-alone rate) and TPOT against concurrency.

usage: bench/plot.py --out FILE.png RESULTS.jsonl [MORE.jsonl ...]

Each RESULTS file holds the JSON lines k25bench --json writes (one object per concurrency
level); several files become several labelled curves (label: backend, ranks, git revision,
or --label). FILE is written as PNG whatever its name. Exits 2 on bad input or a FILE that
cannot be written (checked first), else 3 when matplotlib is missing (k25bench then skips the
plot).
"""
import argparse
import io
import sys

from k25results import check_out, fail, read_jsonl, write_out

WHO = "plot.py"
# What every curve needs of a line; decode_profile.decode_tok_s is drawn where there is one.
NEEDED = ("max_concurrency", "output_throughput", "median_tpot_ms", "p99_tpot_ms")


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def load(path):
    rows = read_jsonl(path, WHO)
    if not rows:
        fail(f"{WHO}: {path}: no results")
    for n, r in enumerate(rows, 1):
        for k in NEEDED:
            if k not in r:
                fail(f"{WHO}: {path}:{n}: no {k} (not a k25bench --json line)")
            if not is_number(r[k]):
                fail(f"{WHO}: {path}:{n}: {k} {r[k]!r} is not a number")
        if type(r["max_concurrency"]) is not int or r["max_concurrency"] < 1:
            fail(f"{WHO}: {path}:{n}: max_concurrency {r['max_concurrency']!r} is not a positive "
                 "integer")
        prof = r.get("decode_profile", {})
        if not isinstance(prof, dict) or not is_number(prof.get("decode_tok_s", 0)):
            fail(f"{WHO}: {path}:{n}: decode_profile is not an object with a number "
                 "decode_tok_s")
    return sorted(rows, key=lambda r: r["max_concurrency"])


def default_label(rows):
    r = rows[0]
    return f'{r.get("backend", "?")}, {r.get("ranks", "?")} ranks, git {r.get("git", "?")}'


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="PNG file to write")
    ap.add_argument("--label", action="append", default=[], help="curve label, one per file")
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    check_out(args.out, WHO)
    runs = [load(p) for p in args.results]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("plot.py: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 3

    labels = [args.label[i] if i < len(args.label) else default_label(r)
              for i, r in enumerate(runs)]

    fig, (ax_tput, ax_tpot) = plt.subplots(1, 2, figsize=(12, 4.5))
    for rows, label in zip(runs, labels):
        conc = [r["max_concurrency"] for r in rows]
        tput = ax_tput.plot(conc, [r["output_throughput"] for r in rows], "o-", label=label)[0]
        # full-batch decode steps alone (the breakdown's unprofiled steps), where measured
        dec = [(r["max_concurrency"], r["decode_profile"]["decode_tok_s"]) for r in rows
               if r.get("decode_profile", {}).get("decode_tok_s")]
        if dec:
            ax_tput.plot([c for c, _ in dec], [v for _, v in dec], "s--", color=tput.get_color(),
                         label=f"{label} (decode steps alone)")
        line = ax_tpot.plot(conc, [r["median_tpot_ms"] for r in rows], "o-",
                            label=f"{label} (median)")[0]
        ax_tpot.fill_between(conc, [r["median_tpot_ms"] for r in rows],
                             [r["p99_tpot_ms"] for r in rows], color=line.get_color(), alpha=0.15,
                             label=f"{label} (median..p99)")
    levels = sorted({r["max_concurrency"] for rows in runs for r in rows})
    for ax in (ax_tput, ax_tpot):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("concurrency (requests in flight)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_tput.set_ylabel("output tokens / s")
    ax_tput.set_title("Output throughput")
    ax_tpot.set_ylabel("TPOT, ms (excl. first token)")
    ax_tpot.set_title("Time per output token")
    first = runs[0][0]
    fig.suptitle(f'k25bench: {first.get("model", "")}\n'
                 f'input {first.get("input_len")} / output {first.get("output_len")} tokens, '
                 f'{first.get("devices", "")}, {first.get("date", "")}', fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    write_out(args.out, png.getvalue(), WHO)
    return 0


if __name__ == "__main__":
    sys.exit(main())
