#!/usr/bin/env python3
"""Builds the golden test models and their reference logits with Hugging Face transformers.

The reference is transformers' own DeepseekV3ForCausalLM (float32, eval, eager attention and
eager experts), an implementation independent of k25dec. Two small models are built with the
dimensions of config/tiny.ini and config/tiny_group.ini (group-limited routing); for each the
script writes, into tests/data/golden_tiny/ and tests/data/golden_group/:

  config.json                        Kimi-K2.5 wrapper (model_type kimi_k25, text_config with
                                     model_type kimi_k2, YaRN rope_scaling, compressed-tensors
                                     pack-quantized group-32 quantization_config, K2.5 ignore list)
  model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json
                                     every tensor prefixed "language_model."; routed experts as
                                     weight_packed int32 [out,in/8] (compressed-tensors' own
                                     packer), weight_scale bf16 [out,in/32], weight_shape int32 [2];
                                     everything else bf16; e_score_correction_bias float32
  reference.k25logits                teacher-forced logits at every prompt position and every fed
                                     back generated position, in the --dump-logits format
  tokens.txt                         prompt ids and the greedy continuation
  metadata.json                      library versions, seed, and the margins checked below

Weights are random but exact: every bf16 tensor is a float32 value representable in bf16, and
each routed-expert weight is W = q * scale with q in [-8, 7] and one bf16 scale per 32 input
columns, so the float32 reference model and the INT4 checkpoint describe the same function.

A seed is accepted only when the comparison it enables is meaningful:
  * the top-2 logit gap along the greedy path exceeds GAP_MIN (no near-ties in argmax),
  * the greedy path never produces an end-of-sequence or pad id,
  * every router decision (top-k cut, and the group cut for group-limited routing) has a margin
    of at least ROUTE_MARGIN_MIN, so float rounding cannot flip an expert choice,
  * the correction bias changes the chosen expert set for some (token, layer) pairs, and group
    limiting changes it for some pairs (golden_group only).

After writing, the checkpoint is read back, the experts are decompressed with compressed-tensors'
PackedQuantizationCompressor, and the reloaded model must reproduce the reference logits bit for
bit; the greedy path is also re-derived with transformers' generate() (KV cache); and an
unwrapped copy loaded by transformers' own compressed-tensors loader (from_pretrained) must land
on exactly the same parameters (experts up to the bf16 rounding that loader applies).

Regenerate (deterministic; needs torch, transformers, safetensors, compressed-tensors, numpy):
    python3 scripts/golden/make_golden.py                # both models into tests/data/
    python3 scripts/golden/make_golden.py --only tiny    # or --only group
The versions used for the committed files are recorded in each directory's metadata.json.
"""

import argparse
import configparser
import json
import math
import os
import struct
import sys

import numpy as np
import torch

import compressed_tensors
import safetensors
import transformers
from compressed_tensors.compressors.pack_quantized import (
    PackedQuantizationCompressor,
    pack_to_int32,
    unpack_from_int32,
)
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# ------------------------------------------------------------------------------------------------
# Model dimensions (common_formats item 3; cross-checked against config/*.ini when present)
# ------------------------------------------------------------------------------------------------

TINY = dict(
    hidden_size=128, num_hidden_layers=4, first_k_dense_replace=1, intermediate_size=256,
    moe_intermediate_size=128, n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4,
    n_group=1, topk_group=1, routed_scaling_factor=2.827, num_attention_heads=8, q_lora_rank=64,
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=512,
    max_position_embeddings=4096, rms_norm_eps=1e-5,
)
ROPE = dict(rope_theta=50000.0, factor=4.0, original_max_position_embeddings=256, beta_fast=32.0,
            beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
LATENT_NORM_EPS = 1e-6          # q_a_layernorm / kv_a_layernorm (transformers' RMSNorm default)
GROUP_SIZE = 32
BOS, EOS, PAD = 256, 257, 511

MODELS = {
    "tiny": dict(dir="golden_tiny", ini="config/tiny.ini", dims=TINY, seed0=1000),
    "group": dict(dir="golden_group", ini="config/tiny_group.ini",
                  dims=dict(TINY, n_routed_experts=32, n_group=4, topk_group=2), seed0=2000),
}

SMALL = 0.01              # scale of embeddings and of the q/kv latent projections
N_PROMPT = 24
N_GEN = 40
GAP_MIN = 2e-2            # smallest accepted top-2 logit gap on the greedy path
ROUTE_MARGIN_MIN = 3e-4   # smallest accepted gap between the last chosen and first rejected score
MAX_SEEDS = 200

# The K2.5 quantization_config (KIMI_K25.md §2.1, K2.5 dump ignore list).
QUANT_CONFIG = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None, "block_structure": None, "dynamic": False,
                "group_size": GROUP_SIZE, "num_bits": 4, "observer": "minmax",
                "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
SCHEME = QuantizationScheme(
    targets=["Linear"],
    weights=QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                             group_size=GROUP_SIZE))


def check_ini(ini_path, dims):
    """Asserts that the .ini model/rope keys agree with the dimensions used here."""
    path = os.path.join(REPO, ini_path)
    if not os.path.exists(path):
        print(f"note: {ini_path} not found; using the dimensions from common_formats")
        return
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    cp.read(path)
    want = dict(dims, latent_norm_eps=LATENT_NORM_EPS)
    for sec, keys in (("model", want), ("rope", ROPE)):
        for k, v in keys.items():
            if cp.has_option(sec, k):
                got = float(cp.get(sec, k))
                if not math.isclose(got, float(v), rel_tol=1e-6):
                    sys.exit(f"{ini_path}: [{sec}] {k} = {got}, expected {v}")


# ------------------------------------------------------------------------------------------------
# Random exact weights
# ------------------------------------------------------------------------------------------------

def bf16_exact(t):
    """Rounds a float32 tensor to the nearest bf16 value, kept as float32."""
    return t.to(torch.bfloat16).to(torch.float32)


def make_weights(d, gen):
    """Returns {checkpoint name (without language_model.): tensor} for one model.

    Dense tensors are float32 holding bf16 values; each routed-expert matrix is a tuple
    (q int8 [out,in], scale bf16 [out,in/32]); the correction bias is float32.
    """
    H, V = d["hidden_size"], d["vocab_size"]
    nh, dn, dr, dv = (d["num_attention_heads"], d["qk_nope_head_dim"], d["qk_rope_head_dim"],
                      d["v_head_dim"])
    ql, kl = d["q_lora_rank"], d["kv_lora_rank"]
    E, I, Id = d["n_routed_experts"], d["moe_intermediate_size"], d["intermediate_size"]

    def normal(shape, std):
        return bf16_exact(torch.randn(shape, generator=gen) * std)

    def linear(out, inp, gain=1.0):
        return normal((out, inp), gain / math.sqrt(inp))

    def norm_w(n):
        return bf16_exact(0.7 + 0.6 * torch.rand(n, generator=gen))

    def int4_matrix(out, inp):
        q = torch.randint(-8, 8, (out, inp), generator=gen, dtype=torch.int8)
        base = 1.0 / (4.6 * math.sqrt(inp))      # std of uniform q in [-8,7] is ~4.6
        scale = (base * (0.5 + torch.rand(out, inp // GROUP_SIZE, generator=gen)))
        return q, scale.to(torch.bfloat16)

    w = {}
    # Small embeddings and small latent projections (as in trained checkpoints) make the norms'
    # eps visible: mean(x^2) ~ 1e-4 there, so eps 1e-5 versus 1e-6 moves the output by ~4%.
    w["model.embed_tokens.weight"] = normal((V, H), SMALL)
    for L in range(d["num_hidden_layers"]):
        p = f"model.layers.{L}."
        w[p + "input_layernorm.weight"] = norm_w(H)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
        w[p + "self_attn.q_a_proj.weight"] = linear(ql, H, gain=SMALL)
        w[p + "self_attn.q_a_layernorm.weight"] = norm_w(ql)
        w[p + "self_attn.q_b_proj.weight"] = linear(nh * (dn + dr), ql)
        kv_a = linear(kl + dr, H)
        kv_a[:kl] = bf16_exact(kv_a[:kl] * SMALL)     # latent rows small, k_pe rows not
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = kv_a
        w[p + "self_attn.kv_a_layernorm.weight"] = norm_w(kl)
        w[p + "self_attn.kv_b_proj.weight"] = linear(nh * (dn + dv), kl)
        w[p + "self_attn.o_proj.weight"] = linear(H, nh * dv)
        if L < d["first_k_dense_replace"]:
            w[p + "mlp.gate_proj.weight"] = linear(Id, H)
            w[p + "mlp.up_proj.weight"] = linear(Id, H)
            w[p + "mlp.down_proj.weight"] = linear(H, Id)
            continue
        w[p + "mlp.gate.weight"] = linear(E, H)
        # Non-trivial float32 bias: large enough to change some selections.
        w[p + "mlp.gate.e_score_correction_bias"] = (torch.rand(E, generator=gen) - 0.5) * 0.2
        S = I * d["n_shared_experts"]
        w[p + "mlp.shared_experts.gate_proj.weight"] = linear(S, H)
        w[p + "mlp.shared_experts.up_proj.weight"] = linear(S, H)
        w[p + "mlp.shared_experts.down_proj.weight"] = linear(H, S)
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            w[q + "gate_proj"] = int4_matrix(I, H)
            w[q + "up_proj"] = int4_matrix(I, H)
            w[q + "down_proj"] = int4_matrix(H, I)
    w["model.norm.weight"] = norm_w(H)
    w["lm_head.weight"] = linear(V, H, gain=4.0)
    return w


def dequant(q, scale):
    """W = q * scale[:, k/32], exact in float32."""
    return q.to(torch.float32) * scale.to(torch.float32).repeat_interleave(GROUP_SIZE, dim=1)


# ------------------------------------------------------------------------------------------------
# transformers model
# ------------------------------------------------------------------------------------------------

def hf_config(d):
    cfg = DeepseekV3Config(
        **d,
        num_key_value_heads=d["num_attention_heads"],
        hidden_act="silu",
        norm_topk_prob=True,
        rope_interleave=True,
        rope_parameters=dict(rope_type="yarn", **ROPE),
        attention_bias=False,
        tie_word_embeddings=False,
        num_nextn_predict_layers=0,
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
    )
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


def build_hf(d, w):
    """Creates DeepseekV3ForCausalLM (float32, eval) holding the weights w."""
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(hf_config(d)).to(torch.float32).eval()
    sd = {}
    E, I = d["n_routed_experts"], d["moe_intermediate_size"]
    for k, v in w.items():
        if ".mlp.experts." in k:
            continue
        sd[k] = v
    for L in range(d["first_k_dense_replace"], d["num_hidden_layers"]):
        p = f"model.layers.{L}.mlp.experts."
        # transformers fuses [gate; up] per expert into gate_up_proj [E, 2I, H] (chunk(2) order).
        sd[p + "gate_up_proj"] = torch.stack([
            torch.cat([dequant(*w[f"{p}{e}.gate_proj"]), dequant(*w[f"{p}{e}.up_proj"])], 0)
            for e in range(E)])
        sd[p + "down_proj"] = torch.stack([dequant(*w[f"{p}{e}.down_proj"]) for e in range(E)])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        sys.exit(f"state dict mismatch: missing {missing} unexpected {unexpected}")
    for name, prm in model.named_parameters():
        assert prm.dtype == torch.float32, name
    return model


def check_hf_semantics(model, d):
    """Asserts the transformers behaviour this golden test relies on (KIMI_K25.md §4)."""
    cfg = model.config
    dr = d["qk_rope_head_dim"]
    # YaRN inverse frequencies per §4.3 (dim = qk_rope_head_dim).
    base = ROPE["rope_theta"]
    corr = lambda r: dr * math.log(ROPE["original_max_position_embeddings"] / (2 * math.pi * r)) \
        / (2 * math.log(base))
    low = max(math.floor(corr(ROPE["beta_fast"])), 0)
    high = min(math.ceil(corr(ROPE["beta_slow"])), dr - 1)
    if low == high:
        high += 0.001
    inv = []
    for i in range(dr // 2):
        b = 1.0 / base ** (2 * i / dr)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        inv.append(b * (1 - ramp) + b / ROPE["factor"] * ramp)
    got = model.model.rotary_emb.inv_freq.double().numpy()
    assert np.allclose(got, inv, rtol=1e-6, atol=0), (got, inv)
    assert model.model.rotary_emb.attention_scaling == 1.0
    # Softmax scale includes mscale^2 (mscale from mscale_all_dim).
    m = 0.1 * ROPE["mscale_all_dim"] * math.log(ROPE["factor"]) + 1.0
    want = (d["qk_nope_head_dim"] + dr) ** -0.5 * m * m
    attn = model.model.layers[0].self_attn
    assert math.isclose(attn.scaling, want, rel_tol=1e-12), (attn.scaling, want)
    assert attn.q_a_layernorm.variance_epsilon == LATENT_NORM_EPS
    assert attn.kv_a_layernorm.variance_epsilon == LATENT_NORM_EPS
    assert model.model.layers[0].input_layernorm.variance_epsilon == d["rms_norm_eps"]
    assert model.model.norm.variance_epsilon == d["rms_norm_eps"]
    assert cfg.rope_interleave is True
    moe = model.model.layers[d["first_k_dense_replace"]].mlp
    assert moe.shared_experts.gate_proj.weight.shape[0] == d["moe_intermediate_size"]
    assert moe.gate.norm_topk_prob and moe.gate.routed_scaling_factor == d["routed_scaling_factor"]
    assert moe.gate.num_group == d["n_group"] and moe.gate.topk_group == d["topk_group"]
    return dict(yarn_low=low, yarn_high=high, inv_freq=[float(x) for x in got],
                softmax_scale=attn.scaling)


@torch.no_grad()
def full_logits(model, ids):
    out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0]


@torch.no_grad()
def greedy(model, prompt, n):
    """Greedy continuation by full re-evaluation (no cache), no end-of-sequence stop."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(full_logits(model, ids)[-1].argmax()))
    return ids[len(prompt):]


# ------------------------------------------------------------------------------------------------
# Routing margins (recomputed from the router inputs captured in the teacher-forced pass)
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
def routing_stats(model, d, ids):
    inputs = {}
    hooks = []
    for L in range(d["first_k_dense_replace"], d["num_hidden_layers"]):
        gate = model.model.layers[L].mlp.gate
        hooks.append(gate.register_forward_hook(
            lambda mod, inp, out, L=L: inputs.__setitem__(L, (inp[0].reshape(-1, inp[0].shape[-1]),
                                                              out[2]))))
    full_logits(model, ids)
    for h in hooks:
        h.remove()
    E, K, G, TG = d["n_routed_experts"], d["num_experts_per_tok"], d["n_group"], d["topk_group"]
    st = dict(min_topk_margin=1e9, min_group_margin=1e9, bias_changes=0, group_changes=0,
              min_selected_score=1e9, experts_used=set(), decisions=0)
    for L, (x, hf_idx) in inputs.items():
        gate = model.model.layers[L].mlp.gate
        s = torch.sigmoid(x.double() @ gate.weight.double().T)
        b = gate.e_score_correction_bias.double()
        for t in range(s.shape[0]):
            sel = s[t] + b
            gsc = sel.view(G, E // G).topk(2, dim=-1)[0].sum(-1)
            if G > 1:
                gs = gsc.sort(descending=True)[0]
                st["min_group_margin"] = min(st["min_group_margin"], float(gs[TG - 1] - gs[TG]))
            keep = torch.zeros(G, dtype=torch.bool)
            keep[gsc.topk(TG)[1]] = True
            elig = keep.repeat_interleave(E // G)
            cand = sel.masked_fill(~elig, -math.inf)
            srt = cand.sort(descending=True)
            st["min_topk_margin"] = min(st["min_topk_margin"], float(srt[0][K - 1] - srt[0][K]))
            chosen = set(srt[1][:K].tolist())
            assert chosen == set(hf_idx[t].tolist()), "routing recomputation disagrees with HF"
            st["min_selected_score"] = min(st["min_selected_score"], float(srt[0][K - 1]))
            st["experts_used"] |= chosen
            st["decisions"] += 1
            if set(s[t].masked_fill(~elig, -math.inf).topk(K)[1].tolist()) != chosen:
                st["bias_changes"] += 1
            if G > 1 and set(sel.topk(K)[1].tolist()) != chosen:
                st["group_changes"] += 1
    st["experts_used"] = len(st["experts_used"])
    if G == 1:
        st["min_group_margin"] = None
    return st


# ------------------------------------------------------------------------------------------------
# Checkpoint writing (Kimi-K2.5 layout)
# ------------------------------------------------------------------------------------------------

def text_config(d):
    tc = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": BOS,
        "dtype": "bfloat16",
        "eos_token_id": EOS,
        "ep_size": 1,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "moe_layer_freq": 1,
        "norm_topk_prob": True,
        "num_key_value_heads": d["num_attention_heads"],
        "num_nextn_predict_layers": 0,
        "pad_token_id": PAD,
        "pretraining_tp": 1,
        "quantization_config": QUANT_CONFIG,
        "rope_scaling": dict(type="yarn", **{k: v for k, v in ROPE.items() if k != "rope_theta"}),
        "rope_theta": ROPE["rope_theta"],
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_method": "noaux_tc",
        "use_cache": True,
    }
    tc.update(d)
    return dict(sorted(tc.items()))


def wrapper_config(d):
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "bos_token_id": BOS,
        "dtype": "bfloat16",
        "eos_token_id": EOS,
        "media_placeholder_token_id": PAD,
        "model_type": "kimi_k25",
        "pad_token_id": PAD,
        "text_config": text_config(d),
        "tie_word_embeddings": False,
        "vision_config": {
            "merge_kernel_size": [2, 2], "mm_hidden_size": 32, "mm_projector_type": "patchmerger",
            "patch_size": 14, "text_hidden_size": d["hidden_size"], "vt_hidden_size": 32,
            "vt_intermediate_size": 64, "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1,
        },
    }


def checkpoint_tensors(w):
    """{full name: tensor} in the K2.5 dtypes; experts packed by compressed-tensors."""
    out = {}
    for k, v in w.items():
        name = "language_model." + k
        if isinstance(v, tuple):
            q, scale = v
            W = dequant(q, scale)
            # The library quantizes W with the given scale and packs it itself.
            c = PackedQuantizationCompressor.compress({"weight": W, "weight_scale": scale}, SCHEME)
            assert torch.equal(c["weight_packed"], pack_to_int32(q, 4))
            assert torch.equal(unpack_from_int32(c["weight_packed"], 4, W.shape), q)
            out[name + ".weight_packed"] = c["weight_packed"].to(torch.int32).contiguous()
            out[name + ".weight_scale"] = scale.contiguous()
            out[name + ".weight_shape"] = torch.tensor(list(W.shape), dtype=torch.int32)
        elif k.endswith("e_score_correction_bias"):
            out[name] = v.to(torch.float32).contiguous()
        else:
            out[name] = v.to(torch.bfloat16).contiguous()
    return out


def write_checkpoint(outdir, d, w):
    tensors = checkpoint_tensors(w)
    names = list(tensors)            # insertion order: embed, layers 0.., norm, lm_head
    nbytes = lambda t: t.numel() * t.element_size()
    total = sum(nbytes(t) for t in tensors.values())
    shards, acc = [[], []], 0
    for n in names:                  # split by size near the middle; a layer may straddle
        shards[0 if acc < total / 2 else 1].append(n)
        acc += nbytes(tensors[n])
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, os.path.join(outdir, fname),
                  metadata={"format": "pt"})
        os.chmod(os.path.join(outdir, fname), 0o644)
        for n in part:
            weight_map[n] = fname
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2)
        f.write("\n")
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(wrapper_config(d), f, indent=2)
        f.write("\n")
    return total


def reload_checkpoint(outdir, d):
    """Reads the shards back; decompresses the experts with compressed-tensors."""
    with open(os.path.join(outdir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    raw = {}
    for fname in sorted(set(index["weight_map"].values())):
        raw.update(load_file(os.path.join(outdir, fname)))
    assert set(raw) == set(index["weight_map"])
    w = {}
    for name, t in raw.items():
        assert name.startswith("language_model."), name
        k = name[len("language_model."):]
        if k.endswith(".weight_packed"):
            base = k[:-len(".weight_packed")]
            assert t.dtype == torch.int32
            scale = raw[name[:-7] + "_scale"]
            shape = raw[name[:-7] + "_shape"]
            assert scale.dtype == torch.bfloat16 and shape.dtype == torch.int32
            # dequantize() computes in the scale's dtype; bf16 would round q*scale, so the scale
            # is widened to float32 first (W = q*scale is exact there).
            sd = {"weight_packed": t, "weight_scale": scale.to(torch.float32), "weight_shape": shape}
            w[base] = PackedQuantizationCompressor.decompress(sd, SCHEME)["weight"]
            assert w[base].dtype == torch.float32
        elif k.endswith((".weight_scale", ".weight_shape")):
            continue
        elif k.endswith("e_score_correction_bias"):
            assert t.dtype == torch.float32
            w[k] = t
        else:
            assert t.dtype == torch.bfloat16, name
            w[k] = t.to(torch.float32)
    return w


def build_hf_dense(d, w):
    """Like build_hf, but from dense (already dequantized) expert weights."""
    wq = {}
    for k, v in w.items():
        if ".mlp.experts." in k:
            # Represent W as (q=W, scale=1) so build_hf's dequant is the identity.
            ones = torch.ones(v.shape[0], v.shape[1] // GROUP_SIZE, dtype=torch.bfloat16)
            wq[k] = (v, ones)
        else:
            wq[k] = v
    return build_hf(d, wq)


def check_transformers_loader(outdir, model, d):
    """Loads the checkpoint with transformers' own compressed-tensors loader and checks that it
    lands on exactly the parameters of the reference model.

    transformers has no kimi_k25 wrapper class, so an unwrapped copy is loaded (text_config as
    a deepseek_v3 config, "language_model." stripped). Its loader decompresses the experts in
    bf16 (dequantize() works in the scale's dtype), so expert weights are compared with the
    bf16-rounded q*scale; every other tensor must match bit for bit.
    """
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        cfg = json.load(open(os.path.join(outdir, "config.json")))["text_config"]
        cfg["model_type"] = "deepseek_v3"
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        index = json.load(open(os.path.join(outdir, "model.safetensors.index.json")))
        strip = lambda n: n[len("language_model."):]
        for fname in sorted(set(index["weight_map"].values())):
            t = load_file(os.path.join(outdir, fname))
            save_file({strip(k): v for k, v in t.items()}, os.path.join(tmp, fname),
                      metadata={"format": "pt"})
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": index["metadata"],
                       "weight_map": {strip(k): v for k, v in index["weight_map"].items()}}, f)
        loaded, info = DeepseekV3ForCausalLM.from_pretrained(
            tmp, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"transformers loader: {bad}"
    # The config.json (rope_scaling + rope_theta, as K2.5 ships it) must give the same rope,
    # softmax scale and routing settings as the rope_parameters used for the reference.
    assert torch.equal(loaded.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
    assert loaded.model.rotary_emb.attention_scaling == model.model.rotary_emb.attention_scaling
    la, ra = loaded.model.layers[0].self_attn, model.model.layers[0].self_attn
    assert la.scaling == ra.scaling
    assert la.kv_a_layernorm.variance_epsilon == ra.kv_a_layernorm.variance_epsilon
    for k in ("n_group", "topk_group", "num_experts_per_tok", "routed_scaling_factor",
              "norm_topk_prob", "rope_interleave", "rms_norm_eps", "first_k_dense_replace"):
        assert getattr(loaded.config, k) == getattr(model.config, k), k
    ref = model.state_dict()
    got = loaded.state_dict()
    assert set(ref) == set(got), set(ref) ^ set(got)
    for k, v in ref.items():
        if ".mlp.experts." in k:
            assert torch.equal(got[k].float(), bf16_exact(v)), k
        else:
            assert torch.equal(got[k].float(), v.float()), k
    return len(ref)


# ------------------------------------------------------------------------------------------------
# Reference files
# ------------------------------------------------------------------------------------------------

def write_logits(path, ids, logits):
    """common_formats item 1: rows for positions 0 .. len(ids)-1, token fed, float32 logits."""
    logits = logits.detach().to(torch.float32).numpy()
    n, vocab = logits.shape
    assert n == len(ids)
    with open(path + ".tmp", "wb") as f:
        f.write(b"K25LOGIT" + struct.pack("<IIII", 1, vocab, n, 0))
        for p in range(n):
            f.write(struct.pack("<ii", p, ids[p]))
            f.write(logits[p].astype("<f4").tobytes())
    os.replace(path + ".tmp", path)


def make_prompt(gen, vocab):
    ids = torch.randint(0, 256, (N_PROMPT,), generator=gen).tolist()
    ids[0] = BOS
    for pos in (5, 11, 17, 22):        # a few ids above the byte range (not special ids)
        ids[pos] = int(torch.randint(258, vocab - 1, (1,), generator=gen))
    return ids


def try_seed(d, seed):
    gen = torch.Generator().manual_seed(seed)
    w = make_weights(d, gen)
    prompt = make_prompt(gen, d["vocab_size"])
    model = build_hf(d, w)
    cont = greedy(model, prompt, N_GEN)
    seq = prompt + cont
    fed = seq[:-1]
    logits = full_logits(model, fed)
    top2 = logits[N_PROMPT - 1:].topk(2, dim=-1)[0]
    gap = float((top2[:, 0] - top2[:, 1]).min())
    ok = gap > GAP_MIN and not (set(cont) & {EOS, PAD})
    rs = routing_stats(model, d, fed)
    ok = ok and rs["min_topk_margin"] > ROUTE_MARGIN_MIN and rs["bias_changes"] > 0
    if d["n_group"] > 1:
        ok = ok and rs["min_group_margin"] > ROUTE_MARGIN_MIN and rs["group_changes"] > 0
    info = dict(seed=seed, min_greedy_top2_gap=gap, routing=rs)
    return ok, info, w, model, prompt, cont, logits


def make_one(key, outroot):
    spec = MODELS[key]
    d = spec["dims"]
    check_ini(spec["ini"], d)
    for seed in range(spec["seed0"], spec["seed0"] + MAX_SEEDS):
        ok, info, w, model, prompt, cont, logits = try_seed(d, seed)
        print(f"{key}: seed {seed}: gap {info['min_greedy_top2_gap']:.4g} "
              f"routing {info['routing']} -> {'ok' if ok else 'rejected'}")
        if ok:
            break
    else:
        sys.exit(f"{key}: no acceptable seed in {MAX_SEEDS} tries")
    semantics = check_hf_semantics(model, d)
    fed = (prompt + cont)[:-1]

    # Cached decoding with transformers' generate() must give the same greedy path.
    with torch.no_grad():
        g = model.generate(torch.tensor([prompt]), max_new_tokens=N_GEN, min_new_tokens=N_GEN,
                           do_sample=False, eos_token_id=None, pad_token_id=PAD,
                           output_scores=True, return_dict_in_generate=True)
    assert g.sequences[0, N_PROMPT:].tolist() == cont, "generate() disagrees with greedy loop"
    cached = torch.stack([s[0] for s in g.scores])
    cache_dev = float((cached - logits[N_PROMPT - 1:]).abs().max())

    # Float64 run of the same model: how far the float32 reference is from exact arithmetic.
    m64 = build_hf(d, w).to(torch.float64)
    l64 = full_logits(m64, fed)
    ref_max = float(logits.abs().max())
    fp32_dev = float((logits.double() - l64).abs().max())

    outdir = os.path.join(outroot, spec["dir"])
    os.makedirs(outdir, exist_ok=True)
    total = write_checkpoint(outdir, d, w)

    # Read the files back and rebuild the model from them: must reproduce the logits exactly.
    w2 = reload_checkpoint(outdir, d)
    relog = full_logits(build_hf_dense(d, w2), fed)
    assert torch.equal(relog, logits), "reloaded checkpoint does not reproduce the logits"

    n_loader = check_transformers_loader(outdir, model, d)
    print(f"{key}: transformers' compressed-tensors loader maps all {n_loader} tensors")

    write_logits(os.path.join(outdir, "reference.k25logits"), fed, logits)
    with open(os.path.join(outdir, "tokens.txt"), "w") as f:
        f.write("# Golden token ids (see metadata.json). prompt: fed to k25dec with --tokens;\n"
                "# continuation: transformers' greedy (argmax) tokens, no end-of-sequence stop.\n")
        f.write("prompt " + " ".join(map(str, prompt)) + "\n")
        f.write("continuation " + " ".join(map(str, cont)) + "\n")
    meta = dict(
        generator="scripts/golden/make_golden.py",
        reference="transformers DeepseekV3ForCausalLM, float32, eval, eager attention/experts",
        versions=dict(python=sys.version.split()[0], torch=torch.__version__,
                      transformers=transformers.__version__,
                      compressed_tensors=compressed_tensors.__version__,
                      safetensors=safetensors.__version__, numpy=np.__version__),
        ini=spec["ini"], dims=d, rope=ROPE, latent_norm_eps=LATENT_NORM_EPS,
        n_prompt=N_PROMPT, n_generated=N_GEN, rows=len(fed), checkpoint_bytes=total,
        max_abs_ref_logit=ref_max,
        fp32_vs_fp64_max_abs_diff=fp32_dev,
        cached_generate_vs_full_forward_max_abs_diff=cache_dev,
        transformers_semantics=semantics,
        **info,
    )
    with open(os.path.join(outdir, "metadata.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"{key}: wrote {outdir}: {len(fed)} rows, max|ref| {ref_max:.4g}, "
          f"fp32-vs-fp64 {fp32_dev:.3g}, cached-vs-full {cache_dev:.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=sorted(MODELS), help="build one model only")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data"), help="output root")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for key in ([args.only] if args.only else sorted(MODELS, reverse=True)):
        make_one(key, args.out)


if __name__ == "__main__":
    main()
