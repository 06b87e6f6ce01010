"""Reader of k25dec's --dump-logits files (numpy), shared by the tests and compare scripts.

Format: magic "K25LOGIT", uint32 version (1), vocab, n_rows, reserved; then per row int32
position, int32 token fed, float32 logits[vocab].
"""

import struct
from typing import NamedTuple

import numpy as np

MAGIC = b"K25LOGIT"


class Dump(NamedTuple):
    vocab: int
    reserved: int
    pos: np.ndarray     # [n_rows] int32
    tok: np.ndarray     # [n_rows] int32
    logits: np.ndarray  # [n_rows][vocab] float32


def read(path):
    """The whole file; ValueError naming the file when it is not a well-formed dump."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24 or data[:8] != MAGIC:
        raise ValueError(f"{path}: not a K25LOGIT file")
    version, vocab, n_rows, reserved = struct.unpack_from("<IIII", data, 8)
    if version != 1:
        raise ValueError(f"{path}: version {version}, expected 1")
    row_bytes = 8 + 4 * vocab
    if len(data) != 24 + n_rows * row_bytes:
        raise ValueError(f"{path}: {len(data)} bytes, expected {24 + n_rows * row_bytes} "
                         f"for {n_rows} rows of vocab {vocab}")
    rows = np.frombuffer(data, dtype=np.uint8, offset=24).reshape(n_rows, row_bytes)
    head = rows[:, :8].copy().view("<i4")
    logits = rows[:, 8:].copy().view("<f4")
    return Dump(vocab, reserved, head[:, 0], head[:, 1], logits)
