#!/usr/bin/env python3
"""A second reference: the decode math of KIMI_K25.md §4 in numpy, read straight from a
Kimi-K2.5-layout checkpoint directory (safetensors parsed by hand, INT4 experts unpacked here).

It decodes one token at a time like k25dec does (absorbed MLA over a latent cache of normalized
kv latents and rotated k_pe), not the way transformers computes (expanded K/V, full sequence),
so agreement with the golden reference.k25logits checks the documented math against
transformers, and the per-layer dumps help locate a disagreement with k25dec.

    numpy_forward.py tests/data/golden_tiny                 # compare with reference.k25logits
    numpy_forward.py DIR --dump-layers POS                  # print per-layer stats at POS
    numpy_forward.py DIR --out FILE.k25logits               # write its own logits

Needs numpy only.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# ------------------------------------------------------------------------------------------------
# Checkpoint reading
# ------------------------------------------------------------------------------------------------

DTYPES = {"F32": np.float32, "I32": np.int32, "BF16": np.uint16, "F16": np.float16,
          "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + hlen])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.frombuffer(data, dtype=DTYPES[info["dtype"]], count=(b - a) //
                            np.dtype(DTYPES[info["dtype"]]).itemsize, offset=8 + hlen + a)
        arr = arr.reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    return out


def load_model(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg = cfg.get("text_config", cfg)
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    w = {}
    for fname in sorted(set(index["weight_map"].values())):
        w.update(read_safetensors(os.path.join(d, fname)))
    w = {k[len("language_model."):] if k.startswith("language_model.") else k: v
         for k, v in w.items()}
    return cfg, w


def int4_dense(w, name):
    """W [out, in] = q * scale from weight_packed / weight_scale (KIMI_K25.md §2.3)."""
    packed = w[name + ".weight_packed"].view(np.uint32)
    scale = w[name + ".weight_scale"].astype(np.float64)
    out, words = packed.shape
    shifts = (4 * np.arange(8)).astype(np.uint32)
    q = ((packed[:, :, None] >> shifts) & 0xF).astype(np.int64) - 8
    q = q.reshape(out, words * 8)
    assert tuple(w[name + ".weight_shape"]) == q.shape
    return q * np.repeat(scale, 32, axis=1)


# ------------------------------------------------------------------------------------------------
# Forward (float64; KIMI_K25.md §4)
# ------------------------------------------------------------------------------------------------

class Model:
    def __init__(self, cfg, w):
        self.c, self.w = cfg, {k: v.astype(np.float64) for k, v in w.items()
                               if not k.endswith(("weight_packed", "weight_shape"))}
        self.raw = w
        rs = cfg["rope_scaling"]
        dr = cfg["qk_rope_head_dim"]
        base, factor = cfg["rope_theta"], rs["factor"]
        corr = lambda r: dr * math.log(rs["original_max_position_embeddings"] /
                                       (2 * math.pi * r)) / (2 * math.log(base))
        low = max(math.floor(corr(rs["beta_fast"])), 0)
        high = min(math.ceil(corr(rs["beta_slow"])), dr - 1)
        if low == high:
            high += 0.001
        i = np.arange(dr // 2)
        b = 1.0 / base ** (2 * i / dr)
        ramp = np.clip((i - low) / (high - low), 0, 1)
        self.inv_freq = b * (1 - ramp) + b / factor * ramp
        m = 0.1 * rs["mscale_all_dim"] * math.log(factor) + 1.0
        self.scale = (cfg["qk_nope_head_dim"] + dr) ** -0.5 * m * m
        self.cache = [dict(c=[], pe=[]) for _ in range(cfg["num_hidden_layers"])]
        self.experts = {}
        self.trace = None

    def rope(self, x, p):
        ang = p * self.inv_freq
        c, s = np.cos(ang), np.sin(ang)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2] = x0 * c - x1 * s
        y[..., 1::2] = x0 * s + x1 * c
        return y

    @staticmethod
    def rmsnorm(x, wt, eps):
        return wt * (x / np.sqrt(np.mean(x * x) + eps))

    def expert(self, name):
        if name not in self.experts:
            self.experts[name] = int4_dense(self.raw, name)
        return self.experts[name]

    @staticmethod
    def swiglu(x, g, u, dn):
        a = g @ x
        return dn @ (a / (1 + np.exp(-a)) * (u @ x))

    def mla(self, L, x, p):
        c, w = self.c, self.w
        pre = f"model.layers.{L}.self_attn."
        nh, dn, dr, dv = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                          c["v_head_dim"])
        kl = c["kv_lora_rank"]
        cq = self.rmsnorm(w[pre + "q_a_proj.weight"] @ x, w[pre + "q_a_layernorm.weight"], 1e-6)
        q = (w[pre + "q_b_proj.weight"] @ cq).reshape(nh, dn + dr)
        q_nope, q_pe = q[:, :dn], self.rope(q[:, dn:], p)
        ckv = w[pre + "kv_a_proj_with_mqa.weight"] @ x
        cache = self.cache[L]
        cache["c"].append(self.rmsnorm(ckv[:kl], w[pre + "kv_a_layernorm.weight"], 1e-6))
        cache["pe"].append(self.rope(ckv[kl:], p))
        C, PE = np.array(cache["c"]), np.array(cache["pe"])         # [t, kl], [t, dr]
        kvb = w[pre + "kv_b_proj.weight"].reshape(nh, dn + dv, kl)
        w_uk, w_uv = kvb[:, :dn], kvb[:, dn:]
        q_abs = np.einsum("hd,hdc->hc", q_nope, w_uk)
        s = (q_abs @ C.T + q_pe @ PE.T) * self.scale                # [h, t]
        s = np.exp(s - s.max(axis=1, keepdims=True))
        P = s / s.sum(axis=1, keepdims=True)
        o = np.einsum("hc,hdc->hd", P @ C, w_uv)
        return w[pre + "o_proj.weight"] @ o.reshape(-1)

    def moe(self, L, x):
        c, w = self.c, self.w
        pre = f"model.layers.{L}.mlp."
        E, K = c["n_routed_experts"], c["num_experts_per_tok"]
        G, TG = c["n_group"], c["topk_group"]
        s = 1 / (1 + np.exp(-(w[pre + "gate.weight"] @ x)))
        sel = s + w[pre + "gate.e_score_correction_bias"]
        gs = np.sort(sel.reshape(G, E // G), axis=1)[:, -2:].sum(axis=1)
        keep = np.zeros(G, bool)
        keep[np.argsort(-gs, kind="stable")[:TG]] = True
        sel = np.where(np.repeat(keep, E // G), sel, -np.inf)
        idx = np.argsort(-sel, kind="stable")[:K]
        wt = s[idx] / s[idx].sum() * c["routed_scaling_factor"]
        y = sum(wt[k] * self.swiglu(x, self.expert(f"{pre}experts.{e}.gate_proj"),
                                    self.expert(f"{pre}experts.{e}.up_proj"),
                                    self.expert(f"{pre}experts.{e}.down_proj"))
                for k, e in enumerate(idx))
        sh = pre + "shared_experts."
        y = y + self.swiglu(x, w[sh + "gate_proj.weight"], w[sh + "up_proj.weight"],
                            w[sh + "down_proj.weight"])
        if self.trace is not None:
            self.trace.append(f"  layer {L} experts {sorted(idx.tolist())} "
                              f"weights {np.round(wt[np.argsort(idx)], 5).tolist()}")
        return y

    def step(self, token, p):
        c, w = self.c, self.w
        eps = c["rms_norm_eps"]
        h = w["model.embed_tokens.weight"][token].copy()
        for L in range(c["num_hidden_layers"]):
            pre = f"model.layers.{L}."
            h = h + self.mla(L, self.rmsnorm(h, w[pre + "input_layernorm.weight"], eps), p)
            if self.trace is not None:
                self.trace.append(f"  layer {L} after attention: |h| {np.linalg.norm(h):.9g} "
                                  f"h[:4] {np.round(h[:4], 7).tolist()}")
            x = self.rmsnorm(h, w[pre + "post_attention_layernorm.weight"], eps)
            if L < c["first_k_dense_replace"]:
                h = h + self.swiglu(x, w[pre + "mlp.gate_proj.weight"],
                                    w[pre + "mlp.up_proj.weight"], w[pre + "mlp.down_proj.weight"])
            else:
                h = h + self.moe(L, x)
            if self.trace is not None:
                self.trace.append(f"  layer {L} after ffn:       |h| {np.linalg.norm(h):.9g} "
                                  f"h[:4] {np.round(h[:4], 7).tolist()}")
        return w["lm_head.weight"] @ self.rmsnorm(h, w["model.norm.weight"], eps)


def read_logits(path):
    data = open(path, "rb").read()
    _, vocab, n, _ = struct.unpack_from("<IIII", data, 8)
    rows = np.frombuffer(data, np.uint8, offset=24).reshape(n, 8 + 4 * vocab)
    return rows[:, :8].copy().view("<i4"), rows[:, 8:].copy().view("<f4")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--dump-layers", type=int, default=-1, help="trace this position")
    ap.add_argument("--out", help="write the logits in the --dump-logits format")
    a = ap.parse_args()
    cfg, w = load_model(a.dir)
    m = Model(cfg, w)
    head, ref = read_logits(os.path.join(a.dir, "reference.k25logits"))
    logits = []
    for p, tok in head:
        m.trace = [] if p == a.dump_layers else None
        logits.append(m.step(int(tok), int(p)))
        if m.trace is not None:
            print(f"position {p} token {tok}:\n" + "\n".join(m.trace))
    logits = np.array(logits)
    err = np.abs(logits - ref).max(axis=1) / np.abs(ref).max(axis=1)
    print(f"{a.dir}: numpy (KIMI_K25.md math, float64, absorbed MLA) vs transformers: "
          f"max over rows of max|d|/max|ref| = {err.max():.3e} (row {int(err.argmax())})")
    if a.out:
        with open(a.out, "wb") as f:
            f.write(b"K25LOGIT" + struct.pack("<IIII", 1, logits.shape[1], len(head), 0))
            for (p, tok), row in zip(head, logits):
                f.write(struct.pack("<ii", p, tok) + row.astype("<f4").tobytes())
    return 0 if err.max() <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
