#!/usr/bin/env python3
"""Writes tests/data/int4_fixture/int4_pack.txt: an INT4 matrix packed by compressed-tensors.

The words are produced by compressed-tensors' own pack_to_int32 (the packer that wrote the
Kimi-K2.5 checkpoint's weight_packed tensors), checked against its unpack_from_int32, and the
dequantized values by its PackedQuantizationCompressor.decompress (group strategy, group 32).
tests/test_int4_fixture.c checks src/int4.h against this file.

File format (text, one item per line, '#' lines are comments):
    K25INT4FIXTURE 1
    compressed_tensors <version>
    torch <version>
    rows R
    cols C
    q            then R lines of C signed values in [-8, 7]
    packed       then R lines of C/8 words, hex (0x%08x), word j of row n = pack_to_int32(q)[n][j]
    scale        then R lines of C/32 bf16 bit patterns, hex (0x%04x)
    dequant      then R lines of C float32 bit patterns, hex (0x%08x): the library's q * scale

Regenerate (deterministic): python3 scripts/golden/make_int4_fixture.py
"""

import os
import sys

import compressed_tensors
import torch
from compressed_tensors.compressors.pack_quantized import (
    PackedQuantizationCompressor,
    pack_to_int32,
    unpack_from_int32,
)
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROWS, COLS, GROUP = 8, 64, 32
SEED = 4


def main():
    gen = torch.Generator().manual_seed(SEED)
    q = torch.randint(-8, 8, (ROWS, COLS), generator=gen, dtype=torch.int8)
    # Every code in every nibble position of some word, and the extremes side by side.
    q[0, :16] = torch.arange(-8, 8, dtype=torch.int8)
    q[1, :16] = torch.arange(7, -9, -1, dtype=torch.int8)
    q[2, :8] = -8                       # 0x00000000
    q[2, 8:16] = 7                      # 0xffffffff
    q[3, 0:8] = torch.tensor([-8, 7, -8, 7, -8, 7, -8, 7], dtype=torch.int8)
    q[3, 8:16] = 0                      # 0x88888888
    for v in range(-8, 8):
        assert (q == v).any()

    packed = pack_to_int32(q, 4)
    assert packed.dtype == torch.int32 and tuple(packed.shape) == (ROWS, COLS // 8)
    assert torch.equal(unpack_from_int32(packed, 4, q.shape), q)

    scale = (0.01 + torch.rand(ROWS, COLS // GROUP, generator=gen)).to(torch.bfloat16)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP))
    # dequantize() works in the scale's dtype: widen to float32 so q * scale is exact.
    deq = PackedQuantizationCompressor.decompress(
        {"weight_packed": packed, "weight_scale": scale.to(torch.float32),
         "weight_shape": torch.tensor([ROWS, COLS], dtype=torch.int32)}, scheme)["weight"]
    assert deq.dtype == torch.float32
    assert torch.equal(deq, q.float() * scale.float().repeat_interleave(GROUP, 1))

    outdir = os.path.join(REPO, "tests", "data", "int4_fixture")
    os.makedirs(outdir, exist_ok=True)
    lines = ["# INT4 pack-quantized fixture written by scripts/golden/make_int4_fixture.py",
             "K25INT4FIXTURE 1",
             f"compressed_tensors {compressed_tensors.__version__}",
             f"torch {torch.__version__}",
             f"rows {ROWS}", f"cols {COLS}", "q"]
    lines += [" ".join(str(int(v)) for v in row) for row in q]
    lines.append("packed")
    lines += [" ".join(f"0x{int(v) & 0xffffffff:08x}" for v in row) for row in packed]
    lines.append("scale")
    lines += [" ".join(f"0x{int(v) & 0xffff:04x}" for v in row) for row in scale.view(torch.int16)]
    lines.append("dequant")
    lines += [" ".join(f"0x{int(v) & 0xffffffff:08x}" for v in row) for row in deq.view(torch.int32)]
    path = os.path.join(outdir, "int4_pack.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
