#!/usr/bin/env python3
"""Trains a small byte-level BPE vocabulary and writes it in tiktoken.model format.

The tokenizer tests need a real merge table (the Kimi vocabulary cannot be shipped), so this
script made tests/data/tokenizer/tiktoken.model:

    python3 tests/py/train_bpe.py --merges 6000 --out tests/data/tokenizer/tiktoken.model \
        tests/data/tokenizer/corpus.txt ... (see tests/data/tokenizer/README.md)

Ranks 0..255 are the single bytes, then one rank per merge in the order learned (most frequent
pair first; ties broken by the pair's bytes so the result is deterministic). Words come from a
GPT-2 style split with the `regex` module (a tiktoken dependency); the split used for training
does not need to match the encoding pattern.
"""
import argparse
import base64
import heapq
from collections import Counter, defaultdict

import regex

SPLIT = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def train(texts, n_merges):
    words = Counter()
    for text in texts:
        for w in SPLIT.findall(text):
            words[w.encode("utf-8")] += 1
    vocab = [bytes([b]) for b in range(256)]
    seqs = [list(w) for w in words]
    freqs = list(words.values())
    pair_count = defaultdict(int)
    where = defaultdict(set)
    for wi, seq in enumerate(seqs):
        for a, b in zip(seq, seq[1:]):
            pair_count[(a, b)] += freqs[wi]
            where[(a, b)].add(wi)

    def key(p):
        return (-pair_count[p], vocab[p[0]] + vocab[p[1]], vocab[p[0]])

    heap = [(key(p), p) for p in pair_count]
    heapq.heapify(heap)
    while len(vocab) < 256 + n_merges and heap:
        k, p = heapq.heappop(heap)
        if pair_count.get(p, 0) <= 1 or k != key(p):
            continue  # stale entry (or a pair seen once: not worth a token)
        new = len(vocab)
        vocab.append(vocab[p[0]] + vocab[p[1]])
        touched = set()
        for wi in list(where[p]):
            seq, f = seqs[wi], freqs[wi]
            for a, b in zip(seq, seq[1:]):
                pair_count[(a, b)] -= f
                touched.add((a, b))
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == p:
                    out.append(new)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[wi] = out
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] += f
                where[(a, b)].add(wi)
                touched.add((a, b))
        for q in touched:
            if pair_count[q] > 1:
                heapq.heappush(heap, (key(q), q))
    # Distinct byte strings only (two merges can spell the same bytes; tiktoken ranks are unique).
    seen, out = set(), []
    for tok in vocab:
        if tok not in seen:
            seen.add(tok)
            out.append(tok)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--merges", type=int, default=6000)
    ap.add_argument("--repeat-first", type=int, default=1, help="weight of the first input file")
    ap.add_argument("--out", required=True)
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args()
    texts = []
    for i, path in enumerate(args.inputs):
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            t = f.read()
        texts.extend([t] * (args.repeat_first if i == 0 else 1))
    vocab = train(texts, args.merges)
    with open(args.out, "w") as f:
        for rank, tok in enumerate(vocab):
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")
    print(f"{args.out}: {len(vocab)} tokens")


if __name__ == "__main__":
    main()
