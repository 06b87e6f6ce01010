#!/usr/bin/env python3
"""Reference side of tests/t_tokenizer_tiktoken.sh: the `tiktoken` package from PyPI.

Commands (records are separated by NUL bytes, id lists are one line per record):
  pattern NAME              print a pre-tokenizer pattern: kimi (Moonshot's tokenization_kimi.py),
                            cl100k / o200k (taken from tiktoken_ext/openai_public.py)
  cases                     write the test texts: corpus paragraphs, the whole corpus, long runs,
                            and seeded random strings over many scripts
  encode TOKDIR NAME        texts on stdin -> ids (Moonshot's TikTokenTokenizer.encode: 400,000-char
                            chunks, 25,000-char whitespace/non-whitespace runs, allowed_special="all")
  decode TOKDIR             id lines on stdin -> texts (tiktoken decode, errors="replace")
  random-ids TOKDIR         seeded random id lines (all ids, incl. specials and partial UTF-8 tokens)

TOKDIR holds tiktoken.model and tokenizer_config.json. The vocabulary has 256 special ids after
the mergeable ranks, named from added_tokens_decoder, others <|reserved_token_{id}|>.
"""
import json
import os
import random
import sys

os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the local file, cache nothing
import tiktoken  # noqa: E402
from tiktoken.load import load_tiktoken_bpe  # noqa: E402

KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
N_RESERVED = 256
HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "data", "tokenizer", "corpus.txt")


def pattern(name):
    if name == "kimi":
        return KIMI_PATTERN
    import tiktoken_ext.openai_public as op

    op.load_tiktoken_bpe = lambda *a, **k: {}  # only the pattern is wanted; nothing to download
    return {"cl100k": op.cl100k_base, "o200k": op.o200k_base}[name]()["pat_str"]


def encoding(tokdir, pat):
    ranks = load_tiktoken_bpe(os.path.join(tokdir, "tiktoken.model"))
    n_base = len(ranks)
    names = {}
    cfg = os.path.join(tokdir, "tokenizer_config.json")
    if os.path.exists(cfg):
        with open(cfg) as f:
            dec = json.load(f).get("added_tokens_decoder", {})
        names = {int(k): v["content"] for k, v in dec.items()}
    specials = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(n_base, n_base + N_RESERVED)}
    return tiktoken.Encoding(name="test", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)


def split_runs(s, limit):
    """Moonshot's _split_whitespaces_or_nonwhitespaces, restated."""
    start, run, space = 0, 0, s[0].isspace() if s else False
    for i, ch in enumerate(s):
        sp = ch.isspace()
        if sp != space:
            run, space = 1, sp
        else:
            run += 1
            if run > limit:
                yield s[start:i]
                start, run = i, 1
    yield s[start:]


def kimi_encode(enc, text):
    ids = []
    for i in range(0, len(text), 400_000):
        for sub in split_runs(text[i : i + 400_000], 25_000):
            ids.extend(enc.encode(sub, allowed_special="all"))
    return ids


def read_records():
    data = sys.stdin.buffer.read()
    recs = data.split(b"\0")
    return recs[:-1] if recs and recs[-1] == b"" else recs


# ----------------------------------------------------------------------------
# Test texts

POOLS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~",
    ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'Ll", "'d", "'D", "'ſ", "'K", "'"],
    [" ", " ", " ", "  ", "    ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u3000", "\u00a0", "\u0085", "\u180e",
     "\u2028", "\u2003", "\u000b", "\u000c", "\u001c", "\u200b", "\ufeff"],
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经",
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコンー々〆ヶゞ",
    "가나다라마바사아자차카타파하한국어입니다서울은",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯ",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي١٢٣٤٥ًٌٍَُِّْ",
    "नमस्तेदुनियािीुूेैोौंः",
    ["\u0301", "\u0308", "\u0303", "\u20dd", "\ufe0f", "\ufe0e", "\u200d", "\u0345"],
    ["😀", "👍", "🏽", "👩", "💻", "👨", "👧", "🏳", "🌈", "❤", "✌", "🇯", "🇵", "1️⃣", "👨‍👩‍👧‍👦", "🧑🏻‍🤝‍🧑🏿"],
    "ǅǈǋǲᾈᾉᾼῌῼʰʱˆˇˠ々〻ⅰⅱⅫ〇²³½¾௰٣߀𝐀𝐁𝐚𝐛𝟎𝟏",
    ["𠀀", "𠀁", "𪀀", "丽", "\ue000", "\U000F0000", "\ufffd", "\u00ad", "ｱｲｳ", "ＡＢＣａｂｃ１２３", "ß", "ẞ", "İ", "ı"],
    ["<|im_end|>", "<|im_user|>", "<|im_middle|>", "<think>", "</think>", "[BOS]", "[EOS]", "<|im_", "<|", "|>",
     "<think", "<<|im_end|>>", "<|reserved_token_9999|>"],
]


def random_text(rng, words):
    parts = []
    for _ in range(rng.randint(1, 60)):
        r = rng.random()
        if r < 0.25:
            parts.append(rng.choice(words))
        else:
            pool = rng.choice(POOLS)
            k = rng.choice([1, 1, 1, 2, 3, 5, 8])
            parts.append("".join(rng.choice(pool) for _ in range(k)))
    return "".join(parts)


def cases():
    with open(CORPUS, encoding="utf-8", newline="") as f:
        corpus = f.read()
    out = [corpus]
    out += [p for p in corpus.split("\n\n") if p]
    out += corpus.splitlines(keepends=True)
    words = corpus.split()
    rng = random.Random(20240517)
    out += [random_text(rng, words) for _ in range(1500)]
    # Long runs: the 25,000 code point cuts, the BPE heap path, and a 400,000 code point chunk cut.
    out += [
        " " * 30000 + "x",
        "\n" * 26000 + "y",
        "a" * 26001,
        "ab" * 13000,
        "中" * 25003,
        "x " * 12600 + " " * 25010 + "z" * 25010,
        "é" * 300 + "\u0301" * 300,
        "1234567890" * 3000,
        "word " * 80001,  # 400,005 code points
        "<|im_end|>" * 3000,  # a special-token run longer than 25,000 code points
    ]
    for c in out:
        assert "\0" not in c
    sys.stdout.buffer.write(b"".join(c.encode("utf-8") + b"\0" for c in out))


def main():
    cmd = sys.argv[1]
    if cmd == "pattern":
        sys.stdout.write(pattern(sys.argv[2]))
    elif cmd == "cases":
        cases()
    elif cmd == "encode":
        enc = encoding(sys.argv[2], pattern(sys.argv[3]))
        w = sys.stdout.write
        for rec in read_records():
            w(" ".join(map(str, kimi_encode(enc, rec.decode("utf-8")))) + "\n")
    elif cmd == "decode":
        enc = encoding(sys.argv[2], KIMI_PATTERN)
        out = sys.stdout.buffer
        for line in sys.stdin.read().splitlines():
            out.write(enc.decode([int(x) for x in line.split()]).encode("utf-8") + b"\0")
    elif cmd == "random-ids":
        enc = encoding(sys.argv[2], KIMI_PATTERN)
        rng = random.Random(7)
        n = enc.n_vocab
        n_base = n - N_RESERVED
        # Mostly mergeable ids (many are partial UTF-8 sequences), some specials.
        for _ in range(2000):
            k = rng.randint(1, 12)
            ids = [rng.randrange(n) if rng.random() < 0.1 else rng.randrange(n_base) for _ in range(k)]
            print(" ".join(map(str, ids)))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
