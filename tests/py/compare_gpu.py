#!/usr/bin/env python3
"""Compares a GPU run's --dump-logits file with a reference (numpy only).

    compare_gpu.py REF.k25logits GOT.k25logits [--min-cos 0.999] [--min-gen 16] [--n-prompt N]
                   [--label NAME]

Both files use the --dump-logits format (magic "K25LOGIT", version 1, vocab, n_rows, reserved;
per row int32 position, int32 token fed, float32 logits[vocab]). Pass conditions, on the rows
both files have at the same position with the same fed token:
  * no NaN/Inf in GOT;
  * cosine similarity of every row >= min-cos;
  * the greedy tokens (the tokens fed after the prompt) agree with REF's for at least min-gen
    generated positions (counted from the first generated token until the first difference).
Prints the worst cosine, the mean relative L2 error and the number of matching tokens.
"""

import argparse
import sys

import numpy as np

import k25logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("got")
    ap.add_argument("--min-cos", type=float, default=0.999)
    ap.add_argument("--min-gen", type=int, default=16)
    ap.add_argument("--n-prompt", type=int, default=0, help="prompt length (0: from REF tokens)")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    try:
        r, g = k25logits.read(a.ref), k25logits.read(a.got)
    except (OSError, ValueError) as e:
        print(f"FAIL {e}")
        return 1
    vr, pr, tr, lr = r.vocab, r.pos, r.tok, r.logits
    vg, pg, tg, lg = g.vocab, g.pos, g.tok, g.logits
    label = a.label or a.got
    if vr != vg:
        print(f"FAIL {label}: vocab {vg} != {vr}")
        return 1
    n = min(len(pr), len(pg))
    if n == 0 or not (pr[:n] == pg[:n]).all():
        print(f"FAIL {label}: positions differ")
        return 1
    same = np.nonzero(tr[:n] != tg[:n])[0]
    # rows up to the first differing fed token (that row sees another input: not comparable)
    common = n if len(same) == 0 else int(same[0])
    if not np.isfinite(lg[:n]).all():
        print(f"FAIL {label}: NaN/Inf in the logits")
        return 1
    r, g = lr[:common].astype(np.float64), lg[:common].astype(np.float64)
    cos = (r * g).sum(1) / (np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1) + 1e-300)
    rel = np.linalg.norm(g - r, axis=1) / (np.linalg.norm(r, axis=1) + 1e-300)
    n_prompt = a.n_prompt
    if n_prompt <= 0:
        n_prompt = 1
    # generated tokens: fed tokens after the prompt
    gen_same = 0
    for i in range(n_prompt, n):
        if tr[i] != tg[i]:
            break
        gen_same += 1
    ok = cos.min() >= a.min_cos and gen_same >= min(a.min_gen, len(pr) - n_prompt)
    print(f"{'ok  ' if ok else 'FAIL'} {label}: rows {common}, worst cosine {cos.min():.6f} "
          f"(row {int(cos.argmin())}), mean rel L2 {rel.mean():.2e}, generated tokens equal to the "
          f"reference: {gen_same} (need {a.min_gen})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
