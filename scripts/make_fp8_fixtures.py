#!/usr/bin/env python3
"""Fixtures for block-FP8 checkpoints (quant/fp8.c, core/dtype.c): DeepSeek-V3's and Kimi K2's layout.

Run with a Python that has torch, transformers and safetensors, after making the tiny checkpoint:
    build/moetrain init --config configs/tiny.json --out /tmp/tiny_bf16 --dtype bf16 --seed 5
    /work/.venv-t5cfg/bin/python scripts/make_fp8_fixtures.py --tiny /tmp/tiny_bf16 [--out tests/data/quant]

fp8.safetensors
    "bytes" U8 [256] (0..255) with torch's casts of them to float32 viewed as float8_e4m3fn
    ("e4m3_f32") and float8_e5m2 ("e5m2_f32"). Then two block-FP8 weights with ragged edge blocks,
    their scales and transformers' dequantization of them to float32 (_dequantize_fp8_weight, the
    one that handles blocks that do not divide the weight):
      "w" F8_E4M3 [200, 130], "w_scale_inv" F32 [2, 2], blocks 128 x 128, "deq" F32 [200, 130]
      "w2" F8_E4M3 [100, 90], "w2_scale_inv" F32 [3, 3], blocks 48 x 40, "deq2" F32 [100, 90]
    Every byte value appears in both weights (NaN 0x7f / 0xff included), and the scales include a
    subnormal one, so that products fall among the fp32 subnormals and round there.

fp8_tiny/ and fp8_tiny_f32/ (config.json, model.safetensors)
    The tiny checkpoint given by --tiny (configs/tiny.json, bf16) with every attention and expert
    Linear quantized to block FP8 (weight_block_size [32, 48]: several blocks and ragged edges on
    every shape of it) as transformers' Fp8Quantize does it (per block amax / 448, clamped, cast
    to e4m3fn; the edge blocks padded with zeros), beside "P.weight_scale_inv" F32; the router,
    embeddings, norms and lm_head stay bf16, as DeepSeek-V3 stores them. config.json gets
    quantization_config {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
    "weight_block_size": [32, 48]}. fp8_tiny_f32/ is the same checkpoint with those Linears replaced
    by transformers' dequantization to float32 and no quantization_config: loading either must
    give the same base weights.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from transformers.integrations.finegrained_fp8 import Fp8Dequantize, _dequantize_fp8_weight

MAGIC = "moetrain-fp8-fixture"
VERSION = "1"
TINY_BLOCK = [32, 48]
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def dequant(w, s, block):
    """transformers' dequantization of an FP8 weight and its scale_inv, in float32."""
    return _dequantize_fp8_weight(w.clone(), s.clone(), list(block), torch.float32)


def same(a, b):
    """Equal as fp32 bit patterns, any NaN matching any NaN."""
    n = a.isnan()
    return torch.equal(n, b.isnan()) and torch.equal(a[~n].view(torch.int32), b[~n].view(torch.int32))


def check_dequant(w, s, block, got):
    """The same values by two other routes: the plain formula, and the load-time op where blocks divide."""
    rows, cols = w.shape
    expand = s.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    assert same(w.to(torch.float32) * expand, got)
    if rows % block[0] == 0 and cols % block[1] == 0:
        assert same(Fp8Dequantize(None)._dequantize_one(w, s, output_dtype=torch.float32), got)


def quantize(w, block):
    """Fp8Quantize's rule (transformers/integrations/finegrained_fp8.py), edge blocks zero-padded."""
    rows, cols = w.shape
    br, bc = block
    R, C = -(-rows // br), -(-cols // bc)
    x = F.pad(w.to(torch.float32), (0, C * bc - cols, 0, R * br - rows)).reshape(R, br, C, bc)
    amax = x.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.ones_like(amax))
    inv = (1.0 / scale).to(torch.float32)
    q = torch.clamp(x * scale[:, None, :, None], min=-FP8_MAX, max=FP8_MAX).to(torch.float8_e4m3fn)
    q = q.reshape(R * br, C * bc)[:rows, :cols].contiguous()
    return q, inv


def check_quantize_is_transformers(block):
    """Where the blocks divide the weight, quantize() is transformers' Fp8Quantize byte for byte."""
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    class Q:  # the little of an hf_quantizer that Fp8Quantize reads
        quantization_config = transformers.FineGrainedFP8Config(weight_block_size=list(block))

    w = torch.randn(block[0] * 2, block[1] * 3, generator=torch.Generator().manual_seed(3))
    ref = Fp8Quantize(Q())._quantize_one("x.weight", w)
    q, inv = quantize(w, block)
    assert torch.equal(ref["x.weight"].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(ref["x.weight_scale_inv"], inv)


def weight_with_every_byte(rows, cols, gen):
    b = torch.randint(0, 256, (rows * cols,), generator=gen, dtype=torch.uint8)
    b[:256] = torch.arange(256, dtype=torch.uint8)
    b[-256:] = torch.arange(256, dtype=torch.uint8).flip(0)  # the last (ragged) block too
    return b.reshape(rows, cols).view(torch.float8_e4m3fn)


def table_fixture(out_dir):
    g = torch.Generator().manual_seed(41)
    b = torch.arange(256, dtype=torch.uint8)
    t = {
        "bytes": b,
        "e4m3_f32": b.view(torch.float8_e4m3fn).to(torch.float32),
        "e5m2_f32": b.view(torch.float8_e5m2).to(torch.float32),
    }
    for name, shape, block, scales in [
        ("w", (200, 130), (128, 128), [[1.5e-3, 2.0], [3.0e-39, 7.25e-5]]),
        ("w2", (100, 90), (48, 40), None),
    ]:
        w = weight_with_every_byte(*shape, g)
        R, C = -(-shape[0] // block[0]), -(-shape[1] // block[1])
        s = torch.tensor(scales, dtype=torch.float32) if scales else torch.rand(R, C, generator=g) * 1e-2 + 1e-4
        assert s.shape == (R, C)
        d = dequant(w, s, block)
        check_dequant(w, s, block, d)
        sub = ((d != 0) & (d.abs() < torch.finfo(torch.float32).tiny)).sum().item()
        if name == "w":
            assert sub > 0, "the tiny scale gives fp32 subnormals"
        t[name] = w
        t[name + "_scale_inv"] = s
        t["deq" if name == "w" else "deq2"] = d
    meta = {"magic": MAGIC, "version": VERSION, "torch": torch.__version__, "transformers": transformers.__version__,
            "made_by": "torch .to(float32) of float8_e4m3fn / float8_e5m2; transformers' "
                       "integrations.finegrained_fp8._dequantize_fp8_weight(dtype=float32)"}
    save_file(t, os.path.join(out_dir, "fp8.safetensors"), metadata=meta)


def is_fp8_linear(name):
    """The Linears DeepSeek-V3 stores FP8: attention and MLP/expert projections, not the router."""
    leaves = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight", ".w1.weight", ".w2.weight",
              ".w3.weight", ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight")
    return name.endswith(leaves)


def tiny_fixture(tiny, out_dir):
    with open(os.path.join(tiny, "config.json")) as f:
        cfg = json.load(f)
    src = load_file(os.path.join(tiny, "model.safetensors"))
    fp8, f32 = {}, {}
    n = 0
    for name, w in src.items():  # file order does not matter: readers sort by offset
        if not is_fp8_linear(name):
            fp8[name] = f32[name] = w
            continue
        q, inv = quantize(w, TINY_BLOCK)
        d = dequant(q, inv, TINY_BLOCK)
        check_dequant(q, inv, TINY_BLOCK, d)
        assert not d.isnan().any()
        fp8[name], fp8[name + "_scale_inv"], f32[name] = q, inv, d
        n += 1
    assert n > 0
    meta = {"format": "pt", "made_by": "scripts/make_fp8_fixtures.py from moetrain init --config configs/tiny.json "
            "--dtype bf16 --seed 5", "torch": torch.__version__, "transformers": transformers.__version__}
    for sub, tensors, qc in [
        ("fp8_tiny", fp8, {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                           "weight_block_size": TINY_BLOCK}),
        ("fp8_tiny_f32", f32, None),
    ]:
        d = os.path.join(out_dir, sub)
        os.makedirs(d, exist_ok=True)
        c = dict(cfg)
        if qc:
            c["quantization_config"] = qc
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
            f.write("\n")
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata=meta)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", required=True,
                    help="a `moetrain init --config configs/tiny.json --dtype bf16 --seed 5` folder")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    check_quantize_is_transformers(TINY_BLOCK)
    check_quantize_is_transformers((128, 128))
    table_fixture(a.out)
    n = tiny_fixture(a.tiny, a.out)
    print(f"wrote fp8.safetensors, fp8_tiny/ and fp8_tiny_f32/ ({n} FP8 Linears) under {a.out}")


if __name__ == "__main__":
    main()
