#!/usr/bin/env python3
"""Compares a k25dec --dump-logits file with a golden reference (numpy only).

    compare_logits.py REF.k25logits GOT.k25logits --tokens tokens.txt [--stdout OUT.txt]
                      [--rtol 1e-4] [--min-gen 32] [--label NAME]

REF and GOT use the --dump-logits format (magic "K25LOGIT", version 1, vocab, n_rows, reserved;
then per row int32 position, int32 token fed, float32 logits[vocab]). tokens.txt holds the
lines "prompt <ids>" and "continuation <ids>" of the golden directory.

Pass conditions:
  * headers agree (vocab), positions run 0, 1, 2, ... in both files;
  * the tokens fed at the prompt rows are the prompt;
  * every row of the common prefix (rows up to where the fed tokens first differ) has
    max|got - ref| <= rtol * max|ref| over the vocabulary of that row, and no NaN/Inf;
  * at least min-gen generated tokens equal the reference continuation (the generated tokens
    are the tokens fed after the prompt, plus the last one printed on stdout when --stdout
    is given), and each generated token is the argmax of k25dec's own logits row before it.
Prints the measured maximum errors for the prompt rows and the generated rows.
"""

import argparse
import sys

import numpy as np

import k25logits

def read_tokens(path):
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and not parts[0].startswith("#"):
                out[parts[0]] = [int(x) for x in parts[1:]]
    return out["prompt"], out["continuation"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ref")
    ap.add_argument("got")
    ap.add_argument("--tokens", required=True, help="golden tokens.txt")
    ap.add_argument("--stdout", help="k25dec stdout (generated ids on one line)")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--min-gen", type=int, default=32)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    label = f"{a.label}: " if a.label else ""
    fails = []

    try:
        prompt, cont = read_tokens(a.tokens)
        r, g = k25logits.read(a.ref), k25logits.read(a.got)
        rpos, rtok, ref = r.pos, r.tok, r.logits.astype(np.float64)
        gpos, gtok, got = g.pos, g.tok, g.logits.astype(np.float64)
    except (OSError, ValueError, KeyError) as e:
        print(f"{label}FAIL {e}")
        return 1
    n_prompt = len(prompt)
    if ref.shape[1] != got.shape[1]:
        print(f"{label}FAIL vocab {got.shape[1]}, reference {ref.shape[1]}")
        return 1
    for name, pos in (("reference", rpos), ("k25dec", gpos)):
        if not np.array_equal(pos, np.arange(len(pos))):
            fails.append(f"{name} positions are not 0..{len(pos) - 1} in order")
    if list(rtok[:n_prompt]) != prompt or list(rtok[n_prompt:]) != cont[:-1]:
        fails.append("reference rows do not match tokens.txt")
    if len(gtok) < n_prompt or list(gtok[:n_prompt]) != prompt:
        fails.append(f"k25dec was not fed the prompt: {list(gtok[:n_prompt])}")

    # Generated tokens: fed back after the prompt, plus the last one from stdout.
    gen = [int(t) for t in gtok[n_prompt:]]
    if a.stdout:
        with open(a.stdout) as f:
            printed = [int(x) for x in f.read().split()]
        if printed[:len(gen)] != gen:
            fails.append(f"stdout ids {printed} disagree with the fed tokens {gen}")
        gen = printed
    # With --temp 0 each generated token is the argmax of the row that produced it.
    for i, t in enumerate(gen):
        p = n_prompt - 1 + i
        if p < len(got) and np.all(np.isfinite(got[p])) and t != int(np.argmax(got[p])):
            fails.append(f"generated token {i} is {t}, but the argmax of k25dec's own logits at "
                         f"position {p} is {int(np.argmax(got[p]))}")
    n_same = 0
    while n_same < min(len(gen), len(cont)) and gen[n_same] == cont[n_same]:
        n_same += 1
    if n_same < a.min_gen:
        fails.append(f"only {n_same} generated tokens equal the reference (need {a.min_gen}); "
                     f"k25dec {gen[:n_same + 3]}..., reference {cont[:n_same + 3]}...")

    # Rows whose whole fed history agrees with the reference.
    n_rows = 0
    while n_rows < min(len(rtok), len(gtok)) and rtok[n_rows] == gtok[n_rows]:
        n_rows += 1
    worst = {}
    for p in range(n_rows):
        r, g = ref[p], got[p]
        kind = "prompt" if p < n_prompt else "generated"
        if not np.all(np.isfinite(g)):
            fails.append(f"position {p}: non-finite logits")
            continue
        err = float(np.max(np.abs(g - r)))
        scale = float(np.max(np.abs(r)))
        ratio = err / scale
        if ratio > a.rtol:
            j = int(np.argmax(np.abs(g - r)))
            fails.append(f"position {p} ({kind}): max|d| {err:.3e} > {a.rtol:g} * max|ref| "
                         f"{scale:.4g} (token {j}: got {g[j]:.6g}, ref {r[j]:.6g})")
        w = worst.setdefault(kind, [0.0, 0.0, -1, 0])
        w[3] += 1
        if ratio > w[1]:
            w[:3] = [err, ratio, p]
    for kind in ("prompt", "generated"):
        if kind in worst:
            err, ratio, p, n = worst[kind]
            print(f"{label}{kind} rows {n}: max|d| {err:.3e} = {ratio:.3e} * max|ref| "
                  f"(worst position {p if p >= 0 else '-'})")
    if worst.get("prompt", [0, 0, 0, 0])[3] != n_prompt:
        fails.append(f"only {worst.get('prompt', [0, 0, 0, 0])[3]} of {n_prompt} prompt rows "
                     "compared")
    print(f"{label}greedy: {n_same} of {len(cont)} generated tokens equal the reference; "
          f"{n_rows} of {len(rtok)} reference rows compared")
    for f in fails[:20]:
        print(f"{label}FAIL {f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
