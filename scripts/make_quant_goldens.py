#!/usr/bin/env python3
"""Golden fixtures for quant/ (issue 3): bitsandbytes' 4-bit quantization of fixed inputs.

Run with a Python that has torch, bitsandbytes and safetensors:
    /work/venv/bin/python scripts/make_quant_goldens.py [--out tests/data/quant]

Each fixture is a small safetensors file holding the input, what bitsandbytes made of it
(packed nibbles, absmax, nested constants, maps, the serialized quant_state) and its
dequantization. Its __metadata__ says which bitsandbytes version and backend made it.

Which rule is canonical. The Hub's bnb-4bit checkpoints were made by bitsandbytes' CUDA
kernels (docs/formats.md "Quantizing"). The machine that made these fixtures has no GPU, so bitsandbytes ran
its CPU backend, whose quantizers are different code:
  * 4-bit: the "default" torch implementation (bucketize on fp32 midpoints of the codebook);
  * nested 8-bit: libbitsandbytes_cpu's quantize_blockwise (division, BinSearch).
This script carries a transcription of the CUDA rules (cuda_* below), compares, and records in
each fixture's metadata how many codes differ and why. The C tests make the same comparison on
their own and fail on any difference outside these classes:
  zero_block   an all-zero block: CUDA computes 0*(1/0) = NaN, which its decision tree maps to
               code 0; the CPU clamps absmax to 1e-38 and gets code 7 (NF4). Both dequantize to 0.
  zero_sign    FP4 only: CPU argsort puts +0 (code 0) and -0 (code 8) in an arbitrary order, so
               tiny values get the zero of the wrong sign. Both dequantize to 0.
  fp4_literal  FP4 only: CUDA compares against literal thresholds (0.583333f, ...) that are not
               the fp32 midpoints the CPU uses; values between the two are coded differently.
  exact_tie    the scaled value equals a threshold exactly (CPU takes the other side).
  division     the CPU divides (x/absmax) where CUDA multiplies by 1/absmax, in the last partial
               block (4-bit) or in every block (nested 8-bit), and the 1-ulp difference crosses a
               threshold.
  not_nearest  nested 8-bit only: libbitsandbytes_cpu's BinSearch returns a code that is not the
               nearest map entry; CUDA's search returns the nearest (ties to the pivot).
Differences of dequantization: none. Given the same codes and constants, dequantization is the
same product on every backend, so the dequantized outputs must match exactly.

It also prints the 256-entry signed dynamic map (nested_quant_map) as C hex floats, for
quant/formats.h (docs/formats.md "Double quantization": a published constant, dumped once).
"""
import argparse
import copy
import json
import os
import sys

import numpy as np
import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from safetensors.torch import save_file

f32 = np.float32

# ---------------------------------------------------------------------------------------------
# The CUDA rules (bitsandbytes csrc: dQuantizeNF4, dQuantizeFP4, dQuantize<0>, kQuantizeBlockwise)

NF4_T = np.array([-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
                  -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
                  0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
                  0.5016634166240692, 0.6427869200706482, 0.8614784181118011], dtype=f32)
FP4_T = np.array([0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333], dtype=f32)
FP4_RANK_CODE = np.array([0, 1, 6, 7, 4, 5, 2, 3], dtype=np.uint8)  # codes by magnitude rank


def cuda_code4(s, kind):
    """4-bit code of scaled values s (fp32): count of thresholds strictly below (NaN -> 0)."""
    if kind == "nf4":
        return (s[..., None] > NF4_T).sum(-1).astype(np.uint8)
    a = np.abs(s)
    code = FP4_RANK_CODE[(a[..., None] > FP4_T).sum(-1)]
    return (code + np.where(s < 0, 8, 0)).astype(np.uint8)


def cuda_scale(x, absmax, bs):
    """x * (1/absmax) per block, fp32, padded to whole blocks with 0 (as the kernel loads)."""
    n = x.size
    nb = -(-n // bs)
    pad = np.zeros(nb * bs, f32)
    pad[:n] = x
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (f32(1.0) / absmax).astype(f32)
        return (pad.reshape(nb, bs) * inv[:, None]).astype(f32).ravel()


def cuda_quantize4(x, bs, kind):
    x = x.astype(f32).ravel()
    n = x.size
    nb = -(-n // bs)
    pad = np.zeros(nb * bs, f32)
    pad[:n] = x
    absmax = np.abs(pad.reshape(nb, bs)).max(1).astype(f32)
    s = cuda_scale(x, absmax, bs)
    codes = cuda_code4(s, kind)[: 2 * ((n + 1) // 2)]
    return codes, absmax, s


def cuda_dquant8(code, x):
    """bitsandbytes' CUDA dQuantize<0>: binary search, then the nearer neighbour (ties -> pivot)."""
    pivot, up, lo = 127, 255, 0
    lower, upper = f32(-1.0), f32(1.0)
    val = code[pivot]
    i = 64
    while i > 0:
        if x > val:
            lo, lower, pivot = pivot, val, pivot + i
        else:
            up, upper, pivot = pivot, val, pivot - i
        val = code[pivot]
        i >>= 1
    if up == 255:
        upper = code[up]
    if lo == 0:
        lower = code[lo]
    if x > val:
        return up if x > f32((upper + val) * f32(0.5)) else pivot
    return lo if x < f32((lower + val) * f32(0.5)) else pivot


def cuda_quantize8(v, code, bs=256):
    v = v.astype(f32)
    n = v.size
    nb = -(-n // bs)
    absmax = np.zeros(nb, f32)
    out = np.zeros(n, np.uint8)
    for b in range(nb):
        blk = v[b * bs:(b + 1) * bs]
        a = f32(np.abs(blk).max())
        absmax[b] = a
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = f32(f32(1.0) / a)
            for j, xx in enumerate(blk):
                out[b * bs + j] = cuda_dquant8(code, f32(xx * inv))
    return out, absmax


# ---------------------------------------------------------------------------------------------
# Classifying CPU-vs-CUDA differences

def unpack(packed, n):
    p = packed.reshape(-1)
    return np.stack([p >> 4, p & 15], 1).ravel()[: 2 * ((n + 1) // 2)]


def classify4(x, bs, kind, cpu_codes, cuda_codes, absmax, s):
    n = x.size
    counts = {}
    qmap = F.get_4bit_type(kind, device="cpu").numpy()
    thr = NF4_T if kind == "nf4" else FP4_T
    full = (n // bs) * bs
    for i in np.nonzero(cpu_codes != cuda_codes)[0]:
        b = i // bs
        a, c, g = s[i], int(cpu_codes[i]), int(cuda_codes[i])
        if absmax[b] == 0:
            cls = "zero_block"
        elif qmap[c] == 0 and qmap[g] == 0:
            cls = "zero_sign"
        elif np.any((np.abs(a) if kind == "fp4" else a) == thr):
            cls = "exact_tie"
        elif i < n and i >= full and cuda_code4(np.array([f32(x[i] / absmax[b])]), kind)[0] == c:
            cls = "division"
        elif kind == "fp4" and (np.abs(a) > FP4_T).sum() != (np.abs(a) > fp4_midpoints()).sum():
            cls = "fp4_literal"
        else:
            raise SystemExit(f"unexplained 4-bit difference at {i}: s={a!r} cpu={c} cuda={g}")
        counts[cls] = counts.get(cls, 0) + 1
    return counts


def fp4_midpoints():
    code = F.get_4bit_type("fp4", device="cpu")
    pos = torch.sort(code[:8])[0]
    return ((pos[:-1] + pos[1:]) / 2).numpy()


def classify8(v, code, cpu_q, cuda_q, nested_absmax, bs=256):
    counts = {}
    for i in np.nonzero(cpu_q != cuda_q)[0]:
        b = i // bs
        s_mul = f32(v[i] * f32(f32(1.0) / nested_absmax[b]))
        s_div = f32(v[i] / nested_absmax[b])
        c, g = int(cpu_q[i]), int(cuda_q[i])
        dc, dg = abs(float(s_div) - float(code[c])), abs(float(s_mul) - float(code[g]))
        if s_mul != s_div and cuda_dquant8(code, s_div) == c:
            cls = "division"
        elif abs(float(s_mul) - float(code[c])) > dg:
            cls = "not_nearest"
        elif abs(float(s_mul) - float(code[c])) == dg:
            cls = "exact_tie"
        else:
            raise SystemExit(f"unexplained 8-bit difference at {i}: s={s_mul!r} cpu={c} cuda={g}")
        counts[cls] = counts.get(cls, 0) + 1
    return counts


# ---------------------------------------------------------------------------------------------
# Fixtures

TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def make_input(shape, dtype, seed, zero_block=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 0.02
    x[0, 0] = 0.05  # one outlier, so one block has a large absmax
    if zero_block is not None:
        lo, hi = zero_block
        x.view(-1)[lo:hi] = 0
    return x.to(TORCH_DTYPE[dtype])


def fixture(name, kind, bs, dq, shape, dtype, seed, zero_block=None):
    x = make_input(shape, dtype, seed, zero_block)
    n = x.numel()
    packed, st = F.quantize_4bit(x, blocksize=bs, compress_statistics=dq, quant_type=kind)
    packed0, st0 = F.quantize_4bit(x, blocksize=bs, compress_statistics=False, quant_type=kind)
    assert torch.equal(packed, packed0)
    absmax = st0.absmax.numpy()

    # Dequantize through bitsandbytes' own path (nested absmax rebuilt by it), to f32 and to
    # the input dtype.
    st32 = copy.copy(st)
    st32.dtype = torch.float32
    deq32 = F.dequantize_4bit(packed, st32)
    deq = F.dequantize_4bit(packed, st)

    # bitsandbytes 0.50.2's CPU dequantize_4bit has an AVX-512 path that indexes blocks per row
    # (absmax column = column / blocksize), wrong when the last dimension is not a multiple of
    # the blocksize (rows shorter than a block, or blocks spanning rows); its flat path is right.
    # These fixtures must hold the true dequantization, so check it against the formula:
    # map[code] · absmax (nested absmax rebuilt by bitsandbytes itself), element by element.
    code = F.get_4bit_type(kind, device="cpu")
    am = st0.absmax if not dq else (F.dequantize_blockwise(st.absmax, st.state2) + st.offset)
    p = packed.view(-1)
    c = torch.stack([p >> 4, p & 15], 1).view(-1)[:n].long()
    formula = code[c] * am.repeat_interleave(bs)[:n]
    assert torch.equal(deq32.view(-1), formula), f"{name}: bitsandbytes' dequantization is not map[code]·absmax"
    xf = x.float().numpy().ravel()
    cuda_codes, cuda_absmax, s = cuda_quantize4(xf, bs, kind)
    assert np.array_equal(cuda_absmax, absmax), "absmax differs from the CUDA rule"
    cpu_codes = unpack(packed.numpy(), n)
    diffs4 = classify4(xf, bs, kind, cpu_codes, cuda_codes, absmax, s)

    tensors = {
        "input": x.contiguous(),
        "weight": packed.contiguous(),
        "absmax_f32": torch.from_numpy(absmax.copy()),
        "dequant_f32": deq32.contiguous(),
    }
    if x.dtype != torch.float32 and n < 10000:  # the input dtype's rounding, on the small ones
        tensors["dequant"] = deq.contiguous()
    qs = st.as_dict(packed=True)
    for k, v in qs.items():  # absmax, quant_map, nested_*, quant_state.bitsandbytes__<type>
        tensors[k] = v.contiguous()
    meta = {
        "magic": "moetrain-quant-golden-1",
        "bitsandbytes": bnb.__version__,
        "torch": torch.__version__,
        "backend": "cpu (bitsandbytes 'default' quantize_4bit; libbitsandbytes_cpu quantize_blockwise "
                   "and dequantize); no GPU on the machine that made it",
        "quant_type": kind,
        "blocksize": str(bs),
        "double_quant": "1" if dq else "0",
        "input_dtype": dtype,
        "seed": str(seed),
        "diff4": json.dumps(diffs4, sort_keys=True),
    }
    if dq:
        code = st.state2.code.numpy()
        offset = st.offset.float().reshape(1)
        tensors["nested_offset"] = offset
        v = (st0.absmax - st.offset).numpy()
        cuda_q, cuda_nabs = cuda_quantize8(v, code)
        assert np.array_equal(cuda_nabs, st.state2.absmax.numpy()), "nested absmax differs"
        diffs8 = classify8(v, code, st.absmax.numpy(), cuda_q, cuda_nabs)
        exact = f32(absmax.astype(np.float64).mean())
        meta["diff8"] = json.dumps(diffs8, sort_keys=True)
        meta["offset_minus_exact_mean_ulps"] = str(int(np.float32(offset.item()).view(np.int32)) -
                                                   int(exact.view(np.int32)))
    else:
        meta["diff8"] = "{}"
    return tensors, meta


CASES = [
    # name, quant type, blocksize, double quant, shape, input dtype, seed, all-zero element range
    ("nf4_bs64_dq", "nf4", 64, True, (136, 121), "bf16", 1, None),        # 258 blocks: 2 nested blocks
    ("nf4_bs64", "nf4", 64, False, (37, 75), "f32", 2, (64, 128)),        # odd n, one all-zero block
    ("nf4_bs128_dq", "nf4", 128, True, (45, 91), "bf16", 3, None),        # odd n, partial nested block
    ("nf4_bs32_dq", "nf4", 32, True, (50, 50), "f16", 4, None),
    ("fp4_bs64", "fp4", 64, False, (64, 100), "bf16", 5, None),
    ("fp4_bs128_dq", "fp4", 128, True, (33, 99), "bf16", 6, (128, 256)),  # odd n, one all-zero block
]


def c_dynamic_map():
    dm = F.create_dynamic_map().numpy()
    lines = []
    def hexf(v):
        h = float(v).hex()  # e.g. -0x1.fc66660000000p-1
        mant, exp = h.split("p")
        mant = mant.rstrip("0").rstrip(".") if "." in mant else mant
        return f"{mant}p{exp}f"
    for i in range(0, 256, 4):
        lines.append("    " + ", ".join(hexf(v) for v in dm[i:i + 4]) + ", \\")
    return "\n".join(lines)


def hf_micro(out_dir):
    """A micro Mixtral through transformers: its bf16 checkpoint, and the bnb-4bit one that
    transformers + bitsandbytes make of it (NF4, double quant; the router gate quantized too, as
    transformers does). `moetrain quantize --quant-targets all` must reproduce the second from
    the first, byte for byte, and moetrain must load it."""
    import transformers
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=2,
                        num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(7)
    model = MixtralForCausalLM(cfg).to(torch.bfloat16)
    src, dst = os.path.join(out_dir, "hf_micro_bf16"), os.path.join(out_dir, "hf_micro_nf4")
    model.save_pretrained(src)
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.bfloat16)
    qm = AutoModelForCausalLM.from_pretrained(src, quantization_config=q, device_map="cpu", dtype=torch.bfloat16)
    qm.save_pretrained(dst)
    for d in (src, dst):
        gen = os.path.join(d, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
        with open(os.path.join(d, "MADE_BY"), "w") as f:
            f.write(f"scripts/make_quant_goldens.py: transformers {transformers.__version__}, bitsandbytes "
                    f"{bnb.__version__} (cpu backend), torch {torch.__version__}\n")
    return [src, dst]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant"))
    ap.add_argument("--print-dynamic-map", action="store_true", help="print the C table and exit")
    a = ap.parse_args()
    if a.print_dynamic_map:
        print(c_dynamic_map())
        return
    os.makedirs(a.out, exist_ok=True)
    total = 0
    for name, kind, bs, dq, shape, dtype, seed, zero in CASES:
        tensors, meta = fixture(name, kind, bs, dq, shape, dtype, seed, zero)
        path = os.path.join(a.out, name + ".safetensors")
        save_file(tensors, path, metadata=meta)
        size = os.path.getsize(path)
        total += size
        print(f"{path}: {size} bytes; differences from the CUDA rule: 4-bit {meta['diff4']}, "
              f"nested {meta['diff8']}")
    for d in hf_micro(a.out):
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        total += size
        print(f"{d}: {size} bytes")
    print(f"total {total} bytes; bitsandbytes {bnb.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    sys.exit(main())
