#!/usr/bin/env python3
"""Golden fixtures for gpt-oss's attention-side ops (issue 29): learned attention sinks and YaRN RoPE.

Run with a Python that has torch (CPU), transformers 5 and safetensors:
    /work/.venv-t5cfg/bin/python scripts/make_sinks_fixture.py [--out tests/data/gpt_oss]

sinks.safetensors: transformers' gpt_oss eager_attention_forward in float64 on float32-valued
inputs (q [B, S, nh, hd], k, v [B, S, nkv, hd], sinks [nh], dout like q, key mask [B, S] u8),
for each case c (window and mask in the metadata): out_c, lse_c [B, S, nh] (log Σ over the
visible scaled scores and the sink) and the autograd gradients of Σ out·dout: dq_c, dk_c, dv_c,
dsinks_c. Stored as F32.

yarn.safetensors: _compute_yarn_parameters' inv_freq [hd/2] (float32, bit for bit) and
attention_factor for each parameter set p (params_p in the metadata, JSON); and, for each set,
apply_rotary_pos_emb (gpt_oss's, with GptOssRotaryEmbedding's cos/sin) of rope_x_p [T, nh, hd]
at rope_pos_p [T] int32: rope_y_p.
"""
import argparse
import json
import os
import types

import torch
from safetensors.torch import save_file
from transformers import GptOssConfig, __version__ as tf_version
from transformers.modeling_rope_utils import _compute_yarn_parameters
from transformers.models.gpt_oss import modeling_gpt_oss as go

B, S, NH, NKV, HD = 2, 7, 4, 2, 24
# Sequence 1 left-padded by 2 (its first two queries see no key) with a hole at 5.
MASK = [[1] * 7, [0, 0, 1, 1, 1, 0, 1]]
CASES = [(0, False), (5, True), (0, True)]  # (window, padding mask)


def additive_mask(window, use_mask):
    """[B, 1, S, S] float64: 0 where key j is visible to query i, finfo.min elsewhere (as transformers)."""
    m = torch.full((B, 1, S, S), torch.finfo(torch.float64).min, dtype=torch.float64)
    for b in range(B):
        for i in range(S):
            for j in range(S):
                ok = j <= i and (window == 0 or i - j < window) and (not use_mask or MASK[b][j])
                if ok:
                    m[b, 0, i, j] = 0.0
    return m


def sinks_fixture():
    g = torch.Generator().manual_seed(29)
    f32 = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float32).double()
    q, k, v, dout = f32(B, S, NH, HD), f32(B, S, NKV, HD), f32(B, S, NKV, HD), f32(B, S, NH, HD)
    sinks = f32(NH)
    sinks[1] = 3.0  # one head whose sink dominates
    tensors = {"q": q, "k": k, "v": v, "dout": dout, "sinks": sinks,
               "mask": torch.tensor(MASK, dtype=torch.uint8)}
    for c, (window, use_mask) in enumerate(CASES):
        qq, kk, vv, ss = (t.clone().requires_grad_(True) for t in (q, k, v, sinks))
        module = types.SimpleNamespace(num_key_value_groups=NH // NKV, sinks=ss, training=False)
        am = additive_mask(window, use_mask)
        out, _ = go.eager_attention_forward(module, qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), am,
                                            scaling=HD ** -0.5)
        (out * dout).sum().backward()
        with torch.no_grad():  # lse over the visible scores and the sink
            kr = kk.repeat_interleave(NH // NKV, dim=2)
            s = torch.einsum("bihd,bjhd->bhij", qq, kr) * HD ** -0.5 + am
            s = torch.cat([s, ss.reshape(1, NH, 1, 1).expand(B, NH, S, 1)], dim=-1)
            lse = torch.logsumexp(s, dim=-1).transpose(1, 2)  # [B, S, nh]
        tensors.update({f"out_{c}": out.detach(), f"lse_{c}": lse, f"dq_{c}": qq.grad, f"dk_{c}": kk.grad,
                        f"dv_{c}": vv.grad, f"dsinks_{c}": ss.grad})
    tensors = {n: t.float().contiguous() if t.is_floating_point() else t.contiguous() for n, t in tensors.items()}
    meta = {"shape": json.dumps({"B": B, "S": S, "nh": NH, "nkv": NKV, "hd": HD}),
            "cases": json.dumps([{"window": w, "mask": int(m)} for w, m in CASES]),
            "made_by": f"scripts/make_sinks_fixture.py, transformers {tf_version}, torch {torch.__version__}"}
    return tensors, meta


# (head_dim, rope_parameters): gpt-oss's, a tiny truncated one, DeepSeek's mscale form, a given factor.
YARN_SETS = [
    (64, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
          "truncate": False, "original_max_position_embeddings": 4096}),
    (24, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
          "truncate": True, "original_max_position_embeddings": 64}),
    (24, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
          "mscale": 1.0, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096}),
    (16, {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0,
          "attention_factor": 1.25, "truncate": False, "original_max_position_embeddings": 256}),
]


def yarn_fixture():
    g = torch.Generator().manual_seed(30)
    tensors, params = {}, []
    for p, (hd, rp) in enumerate(YARN_SETS):
        nh = 2
        cfg = GptOssConfig(head_dim=hd, num_attention_heads=nh, num_key_value_heads=1, hidden_size=hd * nh,
                           max_position_embeddings=int(rp["original_max_position_embeddings"] * rp["factor"]),
                           rope_parameters=dict(rp))
        inv_freq, af = _compute_yarn_parameters(cfg)
        tensors[f"inv_freq_{p}"] = inv_freq.float().contiguous()
        tensors[f"attention_factor_{p}"] = torch.tensor([af], dtype=torch.float64)
        # The rotation as gpt_oss applies it: cos, sin of fp32 angles times attention_scaling.
        T = 9
        pos = torch.tensor([0, 1, 2, 5, 100, 1000, 4095, 9000, 131071], dtype=torch.int32)
        x = torch.randn(T, nh, hd, generator=g, dtype=torch.float32)
        freqs = pos[:, None].float() * inv_freq.float()
        cos, sin = freqs.cos() * af, freqs.sin() * af
        y, _ = go.apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], cos[None], sin[None])
        tensors[f"rope_x_{p}"] = x
        tensors[f"rope_pos_{p}"] = pos
        tensors[f"rope_y_{p}"] = y[0].transpose(0, 1).contiguous()
        params.append(dict(rp, head_dim=hd, max_position_embeddings=cfg.max_position_embeddings))
    meta = {"params": json.dumps(params),
            "made_by": f"scripts/make_sinks_fixture.py, transformers {tf_version}, torch {torch.__version__}"}
    return tensors, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/gpt_oss")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t, m = sinks_fixture()
    save_file(t, os.path.join(a.out, "sinks.safetensors"), metadata=m)
    t, m = yarn_fixture()
    save_file(t, os.path.join(a.out, "yarn.safetensors"), metadata=m)
    print(json.dumps(json.loads(m["params"]), indent=1))


if __name__ == "__main__":
    main()
