#!/usr/bin/env python3
"""Golden fixtures for gpt-oss (issue 29): transformers' GptOssForCausalLM on a tiny random config
with odd sizes, every gpt-oss part switched on and doing something.

Writes tests/data/golden/gpt_oss/:
  config.json, model.safetensors   the base checkpoint (fp32) as transformers saves it: fused
                                   experts, router bias, sinks, all biases non-zero
  golden.safetensors               inputs, LoRA factors and expected outputs:
    tokens, attention_mask, labels  I32 [B, S] (a right-padded row; -100 on padding)
    base.logits F32 [B, S, V], base.ce / base.aux / base.loss F64 []
    lora.A.<module> [r, in], lora.B.<module> [out, r]   the LoRA moetrain attaches, by moetrain's
                                   module names (experts split: mlp.experts.e.gate_proj / up_proj /
                                   down_proj), scale alpha / r = 2
    lora.logits, lora.ce, lora.aux, lora.loss   with W + 2·B·A in every targeted weight
    lora.dA.<module>, lora.dB.<module>  the loss's gradients of A and B: from autograd's gradient G
                                   of the effective weight, dA = s·Bᵀ·G, dB = s·G·Aᵀ
    router.grad.<name>             router-only: the loss's gradient of every layer's
                                   mlp.router.weight and mlp.router.bias
    full.grad.<name>               --mode full: the base loss's gradient of every parameter, by
                                   transformers' names (the fused experts and their biases whole)

And tests/data/golden/gpt_oss_mxfp4/: the same kind of model (hidden 64, expert size 32: MXFP4 wants
multiples of 32) with its experts stored as gpt-oss ships them, gate_up_proj_blocks / _scales and
down_proj_blocks / _scales (quantized by scripts/make_mxfp4_fixtures.py's quantize_rule), the config
carrying quantization_config {quant_method: mxfp4}; its golden.safetensors holds base.* and
router.grad.* of the model whose experts are transformers' dequantization of those bytes
(convert_moe_packed_tensors).

No PEFT here: the LoRA is added to the weights directly, so the fixture checks moetrain's
arithmetic whatever PEFT's layout for fused experts is.

Run: /work/.venv-t5cfg/bin/python scripts/make_gpt_oss_goldens.py   (torch + transformers 5.x)
"""
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402

OUT = os.environ.get("GOLDEN_OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                                                  "golden", "gpt_oss")
# PLAIN=1 (a debugging aid, never committed): sinks at -30 (no effect) and the default RoPE.
PLAIN = os.environ.get("PLAIN") == "1"
R, ALPHA = 4, 8.0
S_LORA = ALPHA / R

CFG = dict(hidden_size=40, intermediate_size=20, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
           head_dim=24, num_local_experts=6, num_experts_per_tok=3, vocab_size=97, max_position_embeddings=256,
           sliding_window=5, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
           rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64},
           swiglu_limit=1.4, swiglu_alpha=1.702, router_aux_loss_coef=0.02, initializer_range=0.2,
           attention_bias=True, tie_word_embeddings=False, torch_dtype="float32")
B, S = 2, 11


def build():
    torch.manual_seed(1234)
    cfg = GptOssConfig(**dict(CFG, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}) if PLAIN else CFG)
    cfg._attn_implementation = "eager"
    model = GptOssForCausalLM(cfg).float()
    with torch.no_grad():  # every bias and sink non-zero, so each one matters
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("sinks"):
                p.normal_(0.0, 0.5)
                if PLAIN and name.endswith("sinks"):
                    p.fill_(-30.0)
    return model


def batch():
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, CFG["vocab_size"], (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 8:] = 0  # right padding
    labels = tokens.clone()
    labels[mask == 0] = -100
    return tokens, mask, labels


def modules(model):
    """moetrain's LoRA targets: q/k/v/o, the router, every expert's gate/up/down (split)."""
    cfg = model.config
    out = []
    for L in range(cfg.num_hidden_layers):
        p = f"model.layers.{L}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            lin = getattr(model.model.layers[L].self_attn, proj)
            out.append((f"{p}.self_attn.{proj}", lin.out_features, lin.in_features))
        out.append((f"{p}.mlp.router", cfg.num_local_experts, cfg.hidden_size))
        for e in range(cfg.num_local_experts):
            for leaf, o, i in (("gate_proj", cfg.intermediate_size, cfg.hidden_size),
                               ("up_proj", cfg.intermediate_size, cfg.hidden_size),
                               ("down_proj", cfg.hidden_size, cfg.intermediate_size)):
                out.append((f"{p}.mlp.experts.{e}.{leaf}", o, i))
    return out


def weight_view(model, name):
    """The [out, in] effective weight of a moetrain module, as a view into transformers' parameter
    (and that parameter), so a delta can be added and a gradient read."""
    parts = name.split(".")
    L = int(parts[2])
    layer = model.model.layers[L]
    if parts[3] == "self_attn":
        p = getattr(layer.self_attn, parts[4]).weight
        return p, lambda t: t
    if parts[4] == "router":
        return layer.mlp.router.weight, lambda t: t
    e, leaf = int(parts[5]), parts[6]
    ex = layer.mlp.experts
    if leaf == "down_proj":  # down_proj [E, f, H]: w2 [H, f] = down[e]ᵀ
        return ex.down_proj, lambda t: t[e].t()
    k = 0 if leaf == "gate_proj" else 1  # gate_up [E, H, 2f]: w1 = even columns ᵀ, w3 = odd ᵀ
    return ex.gate_up_proj, lambda t: t[e][:, k::2].t()


def run(model, tokens, mask, labels):
    out = model(input_ids=tokens, attention_mask=mask, labels=labels, output_router_logits=True)
    ce = out.loss - model.config.router_aux_loss_coef * out.aux_loss
    return out, ce


def losses(prefix, out, ce):
    """prefix.ce / .aux / .loss as F64 scalars."""
    return {f"{prefix}.{k}": torch.tensor(v.item(), dtype=torch.float64)
            for k, v in (("ce", ce), ("aux", out.aux_loss), ("loss", out.loss))}


def base_and_router(model, tokens, mask, labels, full=False):
    """The inputs, the base model's logits and losses, and every router's weight and bias gradient
    (router-only training)."""
    g = {"tokens": tokens.int(), "attention_mask": mask.int(), "labels": labels.int()}
    model.zero_grad()
    out, ce = run(model, tokens, mask, labels)
    out.loss.backward()
    g["base.logits"] = out.logits.detach().float()
    g.update(losses("base", out, ce))
    for L in range(model.config.num_hidden_layers):
        r = model.model.layers[L].mlp.router
        g[f"router.grad.model.layers.{L}.mlp.router.weight"] = r.weight.grad.detach().clone()
        g[f"router.grad.model.layers.{L}.mlp.router.bias"] = r.bias.grad.detach().clone()
    if full:  # --mode full: every parameter's gradient, the fused experts' as transformers holds them
        for name, p in model.named_parameters():
            g[f"full.grad.{name}"] = p.grad.detach().clone()
    return g


def mxfp4_case():
    """The MXFP4 checkpoint and the goldens of its dequantized model."""
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_mxfp4_fixtures import quantize_rule
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    global CFG
    saved = CFG
    CFG = dict(CFG, hidden_size=64, intermediate_size=32)
    out_dir = OUT + "_mxfp4"
    try:
        model = build()
    finally:
        CFG = saved
    tokens, mask, labels = batch()
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for L, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            p = f"model.layers.{L}.mlp.experts"
            for name in ("gate_up_proj", "down_proj"):
                w = getattr(ex, name)  # [E, in, out]: blocks run along in, rows are out
                blocks, scales = quantize_rule(w.transpose(1, 2).contiguous())
                del sd[f"{p}.{name}"]
                sd[f"{p}.{name}_blocks"], sd[f"{p}.{name}_scales"] = blocks.contiguous(), scales.contiguous()
                w.copy_(convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.float32))
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    model.config.quantization_config = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                   "model.embed_tokens", "lm_head"],
                                        "quant_method": "mxfp4"}
    model.config.save_pretrained(out_dir)
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    g = base_and_router(model, tokens, mask, labels)
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(out_dir, "golden.safetensors"))
    print(f"wrote {out_dir}: base loss {g['base.loss'].item():.6f}")


def main():
    mxfp4_case()
    model = build()
    tokens, mask, labels = batch()
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    model.save_pretrained(OUT, safe_serialization=True)
    g = base_and_router(model, tokens, mask, labels, full=True)
    # LoRA: W + s·B·A in every target, gradients through autograd of the effective weights.
    gen = torch.Generator().manual_seed(7)
    factors = {}
    with torch.no_grad():
        for name, o, i in modules(model):
            A = torch.randn(R, i, generator=gen) * 0.2
            Bm = torch.randn(o, R, generator=gen) * 0.2
            factors[name] = (A, Bm)
            p, view = weight_view(model, name)
            view(p.data).add_(S_LORA * Bm @ A)
    model.zero_grad()
    out, ce = run(model, tokens, mask, labels)
    out.loss.backward()
    g["lora.logits"] = out.logits.detach().float()
    g.update(losses("lora", out, ce))
    for name, (A, Bm) in factors.items():
        p, view = weight_view(model, name)
        G = view(p.grad).detach()
        g[f"lora.A.{name}"], g[f"lora.B.{name}"] = A.contiguous(), Bm.contiguous()
        g[f"lora.dA.{name}"] = (S_LORA * Bm.t() @ G).contiguous()
        g[f"lora.dB.{name}"] = (S_LORA * G @ A.t()).contiguous()
    # The clamps cut: the share of gate/up values beyond the limit in the LoRA run's first layer.
    with torch.no_grad():
        lim = model.config.swiglu_limit
        h = model.model.layers[0].post_attention_layernorm(model.model.embed_tokens(tokens))
        gu = torch.einsum("th,ehf->etf", h.reshape(-1, h.shape[-1]), model.model.layers[0].mlp.experts.gate_up_proj)
        share = float(((gu[..., ::2] > lim) | (gu[..., 1::2].abs() > lim)).float().mean())
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(OUT, "golden.safetensors"))
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "r": R, "alpha": ALPHA,
            "clamped_share_layer0": share}
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {OUT}: base loss {g['base.loss'].item():.6f}, lora loss {g['lora.loss'].item():.6f}, "
          f"clamped share (layer 0, approx.) {share:.2f}")


if __name__ == "__main__":
    main()
