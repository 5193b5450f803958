#!/usr/bin/env python3
"""Fixtures for MXFP4 (quant/mxfp4.c): transformers' dequantization and the quantization rule.

Run with a Python that has torch, transformers and safetensors:
    /work/.venv-t5cfg/bin/python scripts/make_mxfp4_fixtures.py [--out tests/data/quant]

mxfp4_dequant.safetensors
    Random blocks U8 [2, 5, 3, 16] and scales U8 [2, 5, 3] (gpt-oss's [E, out, in/32, 16] and
    [E, out, in/32]) with every e8m0 byte of interest among the scales: 0 (2^-127, an fp32
    subnormal), 1, 2, 100, 127, 128, 150, 252, 253, 254 (values past FLT_MAX) and 255, and every
    nibble value at both nibble positions. transformers' torch.ldexp(v, e - 127) rounds the exact
    v·2^(e-127) once: under 255 (2^128, itself no fp32), ±0 stays ±0, ±0.5 is ±2^127 and the rest
    ±inf; never NaN. Beside them,
    transformers' own convert_moe_packed_tensors of them with dtype float32 and bfloat16,
    transposed back from its [E, in, out] to moetrain's [E, out, in]: "deq_f32", "deq_bf16".

mxfp4_quant.safetensors
    A bf16 weight "w" [8, 128] (random normal rows plus rows of hand-made cases: exact ties at
    every e2m1 midpoint, an all-zero block, a block of -0.0 and tiny negatives, bf16 subnormals,
    values near bf16's largest, a block whose max is exactly 6·2^k and one just above) and its
    MXFP4 "blocks" U8 [8, 4, 16] and "scales" U8 [8, 4].

    transformers' quantize_to_mxfp4 calls triton_kernels' downcast_to_mxfp_torch (from the
    kernels-community/gpt-oss-triton-kernels hub package), which cannot be installed here
    (no network to the hub; the PyPI "triton-kernels" is an unrelated project). The rule is
    plain torch, so quantize_rule() below restates it, written from its published source
    (numerics_details/mxfp.py, DequantScaleRoundingMode.ROUND_UP):
      scale = max|x| / 6 rounded UP to a power of two (add 0x7FFFFF to the fp32 bits, keep the
              exponent field); its exponent field is the e8m0 byte; 1/scale (0 when max = 0)
      q     = x · (1/scale) in fp32
      code  = sign | min(7, ((E << 2 | M) + 1) >> 1), where E is q's exponent relative to 0.5
              (clamped at 0; values below 1 get their implicit bit shifted into the mantissa)
              and M q's top two mantissa bits: round to nearest, ties AWAY from zero; -0 kept.
    If triton_kernels is importable, its downcast_to_mxfp_torch is run too and must agree byte
    for byte. Independently of that, every code is checked against a brute-force nearest-value
    search (ties away from zero) on transformers' own dequantization of the result.

Each file's __metadata__ records the versions and how the quantization fixture was checked.
"""
import argparse
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

MAGIC = "moetrain-mxfp4-fixture"
VERSION = "1"


def deq(blocks, scales, dtype):
    """transformers' dequantization, [E, out, in/32, 16] -> moetrain's [E, out, in]."""
    return convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dtype).transpose(1, 2).contiguous()


def dequant_fixture(out_dir):
    g = torch.Generator().manual_seed(29)
    E, O, G = 2, 5, 3
    blocks = torch.randint(0, 256, (E, O, G, 16), generator=g, dtype=torch.uint8)
    blocks[0, 0, 0] = torch.arange(16, dtype=torch.uint8) * 17  # code k at both nibbles
    blocks[0, 0, 1] = torch.arange(16, dtype=torch.uint8) | (torch.arange(16, dtype=torch.uint8).flip(0) << 4)
    special = [0, 1, 2, 100, 127, 128, 150, 252, 253, 254, 255]
    scales = torch.randint(90, 165, (E, O, G), generator=g, dtype=torch.uint8)
    flat = scales.view(-1)
    for k, s in enumerate(special):
        flat[k * 2 + 1] = s
    flat[0] = 255  # blocks[0,0,0]: every code under 2^128 (inf, NaN for ±0)
    flat[1] = 0    # blocks[0,0,1]: every code under 2^-127
    t = {
        "blocks": blocks,
        "scales": scales,
        "deq_f32": deq(blocks, scales, torch.float32),
        "deq_bf16": deq(blocks, scales, torch.bfloat16),
    }
    meta = {"magic": MAGIC, "version": VERSION, "torch": torch.__version__, "transformers": transformers.__version__,
            "made_by": "transformers.integrations.mxfp4.convert_moe_packed_tensors (dtype float32 and bfloat16), "
                       "transposed to [E, out, in]"}
    save_file(t, os.path.join(out_dir, "mxfp4_dequant.safetensors"), metadata=meta)
    return t


def quantize_rule(w):
    """downcast_to_mxfp_torch's MXFP4 rule along the last axis (length a multiple of 32)."""
    x = w.to(torch.float32)
    *lead, L = x.shape
    xb = x.reshape(*lead, L // 32, 32)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    d = (amax / 6.0).view(torch.int32)
    d = (d + 0x007FFFFF) & 0x7F800000
    scale_f = d.view(torch.float32)
    inv = torch.where(scale_f == 0, torch.zeros_like(scale_f), 1.0 / scale_f)
    q = (xb * inv).reshape(*lead, L).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign = (q >> 31) & 1
    ex = (q >> 23) & 0xFF
    man = q & 0x7FFFFF
    shift = (126 - ex).clamp(min=0)
    sub = torch.where(shift > 23, torch.zeros_like(man), (0x400000 | (man >> 1)) >> shift.clamp(max=23))
    man = torch.where(ex < 127, sub, man)
    ex = ex.clamp(min=126) - 126
    code = (((ex << 2) | (man >> 21)) + 1) >> 1
    code = code.clamp(max=7) | (sign << 3)
    code = code.to(torch.uint8).reshape(*lead, L // 2, 2)
    packed = code[..., 0] | (code[..., 1] << 4)
    return packed.reshape(*lead, L // 32, 16), (d >> 23).to(torch.uint8).squeeze(-1)


def quant_input():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(8, 128, generator=g) * 0.02
    lut = torch.tensor(FP4_VALUES[:8])
    mids = (lut[:-1] + lut[1:]) / 2  # 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5
    row = torch.zeros(128)
    # block 0: max 6 exactly (scale 2^0) and every midpoint, both signs, plus near-midpoints
    row[0] = 6.0
    row[1:8] = mids
    row[8:15] = -mids
    row[15:22] = mids * (1 + 2 ** -7)
    row[22:29] = mids * (1 - 2 ** -7)
    row[29] = 7.0 / 8.0
    # block 1: all zero. block 2: -0.0 and tiny negatives against a max of 1
    row[64] = 1.0
    row[65:80] = -0.0
    row[80:96] = -torch.logspace(-8, -2, 16)
    # block 3: max just above 6·2^3 (scale rounds up to 2^4)
    row[96:128] = torch.linspace(-48.5, 30, 32)
    w[1] = row
    w[2, :32] = torch.linspace(-2 ** -130, 2 ** -128, 32)     # bf16 subnormals (scale 2^-126)
    w[2, 32:64] = torch.linspace(-3.0e38, 3.3e38, 32, dtype=torch.float64).float()  # near bf16's max
    w[2, 64:96] = torch.tensor([6.0 * 2.0 ** 20] + [1.0] * 31)  # max exactly 6·2^20
    w[2, 96:128] = torch.tensor([6.0 * 2.0 ** 20 * 1.01] + [2.0 ** 19 * 3] * 31)
    w[3] = torch.randn(128, generator=g) * 100
    return w.to(torch.bfloat16)


def nearest_codes_ok(w, blocks, scales):
    """Each code is the nearest e2m1 value to x / scale (ties away from zero, the sign kept), and
    transformers' dequantization of it is that value times the scale rounded once to fp32 (which
    overflows to ±inf for codes 4 and 6 under e8m0 253: the rule does produce those)."""
    x = w.to(torch.float64)
    sc = torch.ldexp(torch.ones(scales.shape, dtype=torch.float64), scales.to(torch.int32) - 127)
    sc = sc.repeat_interleave(32, dim=-1)
    nib = torch.stack([blocks & 15, blocks >> 4], dim=-1).reshape(x.shape).to(torch.long)
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float64)
    q = x.abs() / sc
    dist = (q.unsqueeze(-1) - mags).abs()
    best = dist.min(dim=-1, keepdim=True).values
    idx = torch.where(dist == best, torch.arange(8), torch.zeros_like(dist, dtype=torch.long)).amax(-1)
    zero_block = scales.repeat_interleave(32, dim=-1) == 0  # max 0: every x is ±0, codes 0 or 8
    ok = ((nib & 7) == idx) & (((nib >> 3) == 1) == (x.to(torch.float32).signbit())) | zero_block
    got = deq(blocks.unsqueeze(0), scales.unsqueeze(0), torch.float32)[0]
    want = (torch.tensor(FP4_VALUES, dtype=torch.float64)[nib] * sc).to(torch.float32)
    ok &= (got == want) | (got.isnan() & want.isnan())
    return bool(ok.all()), int((~ok).sum())


def quant_fixture(out_dir):
    w = quant_input()
    blocks, scales = quantize_rule(w)
    how = "quantize_rule (this script's restatement of downcast_to_mxfp_torch, ROUND_UP)"
    try:
        from triton_kernels.numerics_details.mxfp import downcast_to_mxfp_torch  # noqa
        ref_b, ref_s = downcast_to_mxfp_torch(w, torch.uint8, axis=1)
        assert torch.equal(ref_b.reshape(blocks.shape), blocks) and torch.equal(ref_s, scales), "rule != triton_kernels"
        how += "; equal to triton_kernels' downcast_to_mxfp_torch"
    except ImportError:
        how += "; triton_kernels not importable here, not compared with it"
    ok, bad = nearest_codes_ok(w, blocks, scales)
    assert not (w.isnan().any() or w.isinf().any()), "the input must be finite"
    assert ok, f"{bad} codes are not the nearest value (ties away)"
    how += "; every code the nearest e2m1·scale (ties away) on transformers' dequantization"
    meta = {"magic": MAGIC, "version": VERSION, "torch": torch.__version__, "transformers": transformers.__version__,
            "made_by": how}
    save_file({"w": w, "blocks": blocks, "scales": scales}, os.path.join(out_dir, "mxfp4_quant.safetensors"),
              metadata=meta)
    print(how)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t = dequant_fixture(a.out)
    f = t["deq_f32"]
    print("dequant: %d NaN, %d inf, %d subnormal of %d" % (int(f.isnan().sum()), int(f.isinf().sum()),
          int(((f != 0) & (f.abs() < 2 ** -126)).sum()), f.numel()))
    quant_fixture(a.out)


if __name__ == "__main__":
    main()
