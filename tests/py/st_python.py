"""Writes safetensors files with the Python safetensors library for t_safetensors_python.sh.

  st_python.py arrays OUT.safetensors EXPECTED.txt
      numpy arrays of several dtypes through safetensors.numpy.save_file; EXPECTED.txt gets one
      line per tensor "<name> <DTYPE> <d0,d1,...|-> <crc32>" (the format of
      `test_safetensors --dump`), computed here from the arrays.
  st_python.py reshard SRC_DIR DST_DIR N
      reads every tensor of the checkpoint SRC_DIR (header parsed here, cross-checked with
      safetensors.deserialize), writes them again with the library's serializer into N shards
      assigned round-robin by name (another layout than the source), plus the index and
      config.json.
"""
import json
import os
import shutil
import struct
import sys
import zlib

import numpy as np
import safetensors
from safetensors.numpy import save_file

# safetensors header dtype -> the serializer's dtype name
SERIALIZER_NAME = {
    "BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8",
    "I16": "int16", "I32": "int32", "I64": "int64", "U8": "uint8", "U16": "uint16",
    "U32": "uint32", "U64": "uint64", "BOOL": "bool",
}
HEADER_NAME = {v: k for k, v in SERIALIZER_NAME.items()}


def dump_line(name, dtype, shape, data):
    dims = ",".join(str(d) for d in shape) if len(shape) else "-"
    return "%s %s %s %08x" % (name, dtype, dims, zlib.crc32(data) & 0xFFFFFFFF)


def arrays(out, expected):
    rng = np.random.default_rng(20240607)
    t = {
        "model.embed.weight": rng.standard_normal((7, 5)).astype(np.float32),
        "model.layers.0.packed": rng.integers(-2**31, 2**31 - 1, (3, 4), dtype=np.int64)
        .astype(np.int32),
        "model.half": rng.standard_normal((2, 3, 2)).astype(np.float16),
        "model.count": np.array(123456789012, dtype=np.int64),  # 0-rank
        "model.bytes": rng.integers(0, 255, (9,), dtype=np.uint8),
        "model.empty": np.zeros((0, 4), dtype=np.float32),
        "model.f64": rng.standard_normal((3,)).astype(np.float64),
    }
    save_file(t, out, metadata={"format": "np", "note": "written by safetensors.numpy"})
    lines = [dump_line(k, HEADER_NAME[v.dtype.name], v.shape, v.tobytes())
             for k, v in t.items()]
    with open(expected, "w") as f:
        f.write("\n".join(sorted(lines)) + "\n")


def read_shard(path):
    """name -> (dtype, shape, bytes), from the raw header; checked against the library."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], tuple(e["shape"]), blob[base + b:base + end])
    lib = safetensors.deserialize(blob)
    assert len(lib) == len(out), "%s: library sees %d tensors, header %d" % (
        path, len(lib), len(out))
    for name, info in lib:
        dt, shape, data = out[name]
        lib_dt = HEADER_NAME.get(info["dtype"], info["dtype"])
        assert lib_dt == dt and tuple(info["shape"]) == shape and bytes(info["data"]) == data, \
            "%s: %s differs between the library and the header" % (path, name)
    return out


def serialize(tensors, path):
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.7
        keep, specs = [], {}
        for name, (dt, shape, data) in tensors.items():
            buf = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(1, np.uint8)
            keep.append(buf)
            specs[name] = safetensors.TensorSpec(dtype=SERIALIZER_NAME[dt], shape=list(shape),
                                                 data_ptr=buf.ctypes.data, data_len=len(data))
        safetensors.serialize_file(specs, path, {"format": "pt"})
    else:
        safetensors.serialize_file(
            {n: {"dtype": SERIALIZER_NAME[dt], "shape": list(s), "data": d}
             for n, (dt, s, d) in tensors.items()}, path, {"format": "pt"})


def reshard(src, dst, n_shards):
    with open(os.path.join(src, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for fn in files:
        tensors.update(read_shard(os.path.join(src, fn)))
    os.makedirs(dst, exist_ok=True)
    names = sorted(tensors)
    weight_map, total = {}, 0
    expected = []
    for s in range(n_shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, n_shards)
        part = {k: tensors[k] for k in names[s::n_shards]}
        serialize(part, os.path.join(dst, fn))
        for k, (dt, shape, data) in part.items():
            weight_map[k] = fn
            total += len(data)
            expected.append(fn + " " + dump_line(k, dt, shape, data))
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    with open(os.path.join(dst, "expected.txt"), "w") as f:
        f.write("\n".join(sorted(expected)) + "\n")
    print("resharded %d tensors into %d shards" % (len(names), n_shards))


if __name__ == "__main__":
    if sys.argv[1] == "arrays":
        arrays(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "reshard":
        reshard(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit("usage: st_python.py arrays OUT EXPECTED | reshard SRC DST N")
