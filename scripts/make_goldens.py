#!/usr/bin/env python3
"""Golden fixtures for the Mixtral forward/backward (issue 4), made with PyTorch + transformers + PEFT.

For each tiny random Mixtral config it writes tests/data/golden/<name>/:
  config.json, model.safetensors         the base checkpoint (fp32), as transformers saves it
  adapter_config.json,
  adapter_model.safetensors              the PEFT LoRA adapter (B set non-zero, so every gradient
                                         carries information), as PEFT saves it
  golden.safetensors                     inputs and expected outputs (names below)
  meta.json                              magic, format version, library versions, settings

golden.safetensors:
  tokens I32 [B,S], attention_mask I32 [B,S] (1 = real), labels I32 [B,S] (-100 = ignored)
  lora.logits F32 [B,S,V], lora.ce F64 [], lora.aux F64 [], lora.loss F64 []
  lora.grad.<PEFT adapter key>           F32, every LoRA A/B gradient
  router.grad.<checkpoint name>          F32, router-only training: gate weights of every layer
  unfreeze.grad.<checkpoint name>        F32, layers x experts unfrozen (w1/w2/w3 + their gates)
  nf4.* (first config only)              the LoRA run again with attention and expert Linears
                                         replaced by their bitsandbytes NF4 (double-quant,
                                         blocksize 64) dequantization: PyTorch on dequantized weights

Run:  /work/venv/bin/python scripts/make_goldens.py   (needs torch, transformers<5, peft, bitsandbytes)
Only this script needs PyTorch; the C tests read the committed files.

--families writes only the other families' fixtures (docs/families.md), tests/data/golden/f_<name>/,
leaving the Mixtral ones as they are: the same files with lora.* (LoRA on attention, experts and
router), router.grad.* (router-only), unfreeze.grad.* (the first and last expert of the last MoE
layer and its router, meta.json's "unfreeze"), qknorm.grad.* (the q/k RMSNorm weights' gradients, the only
weights that train in that run), mlp.grad.* (the dense layers' MLP, the shared expert and its
gate: the only weights that train in that run), bias.grad.* (the attention biases: likewise) and
base.* (logits and losses without adapter).
"""
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded, ever

import torch
from safetensors.torch import save_file

import transformers
import peft
from transformers import MixtralConfig, MixtralForCausalLM
from peft import LoraConfig, get_peft_model

MAGIC = "moetrain-golden"
FORMAT_VERSION = 1
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "golden")

CONFIGS = {
    # top-2 of 8 experts, GQA (4 heads on 2 kv heads), a left-padded sequence, an expert with no tokens
    "g1_top2_gqa_pad": dict(
        cfg=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=96,
                 max_position_embeddings=64, rope_theta=10000.0, router_aux_loss_coef=0.02,
                 sliding_window=None),
        batch=2, seq=12, pad_left=[0, 4], silent_expert=(0, 7), nf4=True,
        unfreeze=dict(layers=[1], experts=[0, 2]),
    ),
    # top-1 of 4 experts, a sliding window of 4, multi-query attention (2 heads on 1 kv head)
    "g2_top1_window": dict(
        cfg=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=1, vocab_size=80,
                 max_position_embeddings=64, rope_theta=1000000.0, router_aux_loss_coef=0.01,
                 sliding_window=4),
        batch=2, seq=10, pad_left=[0, 0], silent_expert=None, nf4=False,
        unfreeze=dict(layers=[0], experts=[1]),
    ),
    # top-3 of 6 experts, no GQA, three layers
    "g3_top3": dict(
        cfg=dict(hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
                 num_key_value_heads=2, num_local_experts=6, num_experts_per_tok=3, vocab_size=64,
                 max_position_embeddings=64, rope_theta=10000.0, router_aux_loss_coef=0.02,
                 sliding_window=None),
        batch=1, seq=9, pad_left=[0], silent_expert=None, nf4=False,
        unfreeze=dict(layers=[0, 2], experts=[3]),
    ),
}
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "w1", "w2", "w3", "gate"])


def build_base(spec, seed):
    torch.manual_seed(seed)
    cfg = MixtralConfig(**spec["cfg"], torch_dtype="float32", attn_implementation="eager",
                        output_router_logits=True, tie_word_embeddings=False)
    model = MixtralForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # non-trivial norms catch a missed weight
        if spec["silent_expert"] is not None:
            # A near-zero gate row puts the expert's logit near 0: chosen only when at most k-1
            # others are positive. build_silent() then searches seeds until it gets no token at all.
            layer, expert = spec["silent_expert"]
            model.model.layers[layer].block_sparse_moe.gate.weight[expert] *= 0.01
    return model


def expert_counts(model, tokens, mask, layer, E, k):
    """Tokens routed to each expert of `layer`, over every row (padding included)."""
    with torch.no_grad():
        r = model(input_ids=tokens, attention_mask=mask, output_router_logits=True)
        ids = torch.topk(r.router_logits[layer].softmax(-1), k, -1).indices
        return torch.bincount(ids.reshape(-1), minlength=E).tolist()


def build_silent(spec, seed, tokens, mask):
    """The base model; with silent_expert, the first seed whose silent expert gets zero tokens."""
    if spec["silent_expert"] is None:
        return build_base(spec, seed), seed
    layer, expert = spec["silent_expert"]
    for s in range(seed, seed + 1000):
        model = build_base(spec, s)
        c = expert_counts(model, tokens, mask, layer, spec["cfg"]["num_local_experts"],
                          spec["cfg"]["num_experts_per_tok"])
        if c[expert] == 0:
            return model, s
    raise SystemExit("no seed gives the silent expert zero tokens")


def make_batch(spec, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    B, S = spec["batch"], spec["seq"]
    tokens = torch.randint(0, vocab, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    for b, p in enumerate(spec["pad_left"]):
        mask[b, :p] = 0
        tokens[b, :p] = 0
    labels = tokens.clone()
    labels[mask == 0] = -100
    # The first real token after left padding would be predicted from a padded position, whose
    # logits are meaningless (transformers' eager mask makes that query attend uniformly to
    # everything): it is not a training target. moetrain drops such targets itself.
    for b, p in enumerate(spec["pad_left"]):
        if p:
            labels[b, p] = -100
    return tokens, mask, labels


def losses(model, tokens, mask, labels, coef):
    out = model(input_ids=tokens, attention_mask=mask, labels=labels, output_router_logits=True)
    # transformers: loss = CE + coef * aux; recompute aux to report it alone
    aux = out.aux_loss
    ce = out.loss - coef * aux
    return out, ce, aux


def to_f64(x):
    return x.detach().double().reshape(())


def dequantize_nf4_(model):
    """Replaces every attention and expert Linear weight by its bitsandbytes NF4-DQ dequantization."""
    import bitsandbytes.functional as F
    with torch.no_grad():
        for name, mod in model.named_modules():
            leaf = name.split(".")[-1]
            if leaf in ("q_proj", "k_proj", "v_proj", "o_proj", "w1", "w2", "w3"):
                w = mod.weight
                # Flat: bitsandbytes 0.50.2's CPU dequantize_4bit indexes blocks per row on its
                # AVX-512 path, which is wrong when a row is not a multiple of the blocksize.
                flat = w.data.contiguous().reshape(-1)
                q, state = F.quantize_4bit(flat, blocksize=64, quant_type="nf4", compress_statistics=True)
                w.copy_(F.dequantize_4bit(q, state).reshape(w.shape).to(w.dtype))


def lora_run(base_dir, spec, tokens, mask, labels, coef, adapter_seed, nf4):
    model = MixtralForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32,
                                               attn_implementation="eager").eval()
    model.config.output_router_logits = True
    if nf4:
        dequantize_nf4_(model)
    torch.manual_seed(adapter_seed)  # A (PEFT's kaiming init) and B the same in every run
    pm = get_peft_model(model, LoraConfig(**LORA))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.2 * torch.randn_like(p))
    out, ce, aux = losses(pm, tokens, mask, labels, coef)
    out.loss.backward()
    grads = {}
    for n, p in pm.named_parameters():
        if p.requires_grad:
            key = n.replace(".default", "")  # the adapter-file key PEFT writes
            # an expert that got no token has no gradient at all: zero
            g = torch.zeros_like(p) if p.grad is None else p.grad
            grads[key] = g.detach().clone().float().contiguous()
    return pm, out, ce, aux, grads


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    for idx, (name, spec) in enumerate(CONFIGS.items()):
        d = os.path.join(ROOT, name)
        shutil.rmtree(d, ignore_errors=True)  # a stale adapter would be loaded with the base
        os.makedirs(d)
        tokens, mask, labels = make_batch(spec, spec["cfg"]["vocab_size"], seed=2000 + idx)
        base, model_seed = build_silent(spec, 1000 + idx, tokens, mask)
        base.save_pretrained(d, safe_serialization=True)
        coef = spec["cfg"]["router_aux_loss_coef"]
        t = {"tokens": tokens.int(), "attention_mask": mask.int(), "labels": labels.int()}

        pm, out, ce, aux, grads = lora_run(d, spec, tokens, mask, labels, coef, 3000 + idx, nf4=False)
        t["lora.logits"] = out.logits.detach().float().contiguous()
        t["lora.ce"], t["lora.aux"], t["lora.loss"] = to_f64(ce), to_f64(aux), to_f64(out.loss)
        for k, g in grads.items():
            t["lora.grad." + k] = g
        if spec["nf4"]:
            _, out4, ce4, aux4, grads4 = lora_run(d, spec, tokens, mask, labels, coef, 3000 + idx, nf4=True)
            t["nf4.logits"] = out4.logits.detach().float().contiguous()
            t["nf4.ce"], t["nf4.aux"], t["nf4.loss"] = to_f64(ce4), to_f64(aux4), to_f64(out4.loss)
            for k, g in grads4.items():
                t["nf4.grad." + k] = g

        # router-only: only the gates train
        m = MixtralForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
        m.config.output_router_logits = True
        for n, p in m.named_parameters():
            p.requires_grad_(n.endswith("block_sparse_moe.gate.weight"))
        o, _, _ = losses(m, tokens, mask, labels, coef)
        o.loss.backward()
        for n, p in m.named_parameters():
            if p.requires_grad:
                g = torch.zeros_like(p) if p.grad is None else p.grad
                t["router.grad." + n] = g.detach().float().contiguous()

        # unfreeze: chosen layers x experts (w1/w2/w3) and the gates of those layers
        m = MixtralForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
        m.config.output_router_logits = True
        L, E = spec["unfreeze"]["layers"], spec["unfreeze"]["experts"]
        want = {f"model.layers.{l}.block_sparse_moe.gate.weight" for l in L}
        want |= {f"model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight" for l in L for e in E
                 for w in ("w1", "w2", "w3")}
        for n, p in m.named_parameters():
            p.requires_grad_(n in want)
        o, _, _ = losses(m, tokens, mask, labels, coef)
        o.loss.backward()
        for n, p in m.named_parameters():
            if p.requires_grad:
                g = torch.zeros_like(p) if p.grad is None else p.grad
                t["unfreeze.grad." + n] = g.detach().float().contiguous()

        # The adapter last: transformers would load an adapter it finds beside the base model.
        pm.save_pretrained(d)  # adapter_config.json + adapter_model.safetensors (B non-zero)
        with open(os.path.join(d, "adapter_config.json")) as f:
            ac = json.load(f)
        ac["base_model_name_or_path"] = name  # not this machine's path
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(ac, f, indent=2, sort_keys=True)
        for extra in ("README.md", "generation_config.json"):
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(d, "golden.safetensors"),
                  metadata={"magic": MAGIC, "version": str(FORMAT_VERSION)})
        meta = dict(magic=MAGIC, version=FORMAT_VERSION, torch=torch.__version__,
                    transformers=transformers.__version__, peft=peft.__version__,
                    attn_implementation="eager", dtype="float32", lora=LORA,
                    unfreeze=spec["unfreeze"], pad_left=spec["pad_left"], nf4=spec["nf4"],
                    model_seed=model_seed, silent_expert=spec["silent_expert"],
                    nf4_settings=dict(blocksize=64, double_quant=True, targets="q,k,v,o,w1,w2,w3",
                                      backend="bitsandbytes CPU") if spec["nf4"] else None)
        if spec["nf4"]:
            import bitsandbytes
            meta["bitsandbytes"] = bitsandbytes.__version__
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2, sort_keys=True)
        counts = {l: expert_counts(base, tokens, mask, l, spec["cfg"]["num_local_experts"],
                                   spec["cfg"]["num_experts_per_tok"])
                  for l in range(spec["cfg"]["num_hidden_layers"])}
        print(f"{name}: loss {out.loss.item():.6f} ce {ce.item():.6f} aux {aux.item():.6f}; "
              f"{len(grads)} LoRA grads; expert load per layer {counts}")


# Other families (docs/families.md): odd sizes, non-trivial norms (q/k norms included), padding.
FAMILY_CONFIGS = {
    # Qwen3-MoE: explicit head_dim (5 heads x 10 != 44), q/k RMSNorm per head, GQA 5 on 1,
    # top-3 of 9 with norm_topk_prob
    "f_qwen3_moe": dict(
        kind="qwen3_moe",
        cfg=dict(hidden_size=44, head_dim=10, moe_intermediate_size=21, intermediate_size=39,
                 num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1, num_experts=9,
                 num_experts_per_tok=3, norm_topk_prob=True, vocab_size=97, max_position_embeddings=64,
                 rope_theta=10000.0, router_aux_loss_coef=0.02, rms_norm_eps=1e-6, mlp_only_layers=[],
                 decoder_sparse_step=1, use_sliding_window=False),
        batch=2, seq=11, pad_left=[0, 3],
    ),
    # OLMoE: q/k RMSNorm over the whole projections (k_norm over kv_heads x head_dim = 6),
    # top-3 of 7 without renormalising (norm_topk_prob false)
    "f_olmoe": dict(
        kind="olmoe",
        cfg=dict(hidden_size=30, intermediate_size=17, num_hidden_layers=2, num_attention_heads=5,
                 num_key_value_heads=1, num_experts=7, num_experts_per_tok=3, norm_topk_prob=False,
                 vocab_size=97, max_position_embeddings=64, rope_theta=10000.0, router_aux_loss_coef=0.01,
                 rms_norm_eps=1e-5, clip_qkv=None, bos_token_id=None, eos_token_id=2, pad_token_id=1),
        batch=2, seq=10, pad_left=[2, 0],
    ),
}
FAMILY_CONFIGS.update({
    # Qwen3-MoE with a dense MLP layer between MoE layers (mlp_only_layers=[1] of 3)
    "f_qwen3_dense": dict(
        kind="qwen3_moe",
        cfg=dict(hidden_size=36, head_dim=8, moe_intermediate_size=13, intermediate_size=27,
                 num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3, num_experts=5,
                 num_experts_per_tok=2, norm_topk_prob=False, vocab_size=97, max_position_embeddings=64,
                 rope_theta=10000.0, router_aux_loss_coef=0.02, rms_norm_eps=1e-6, mlp_only_layers=[1],
                 decoder_sparse_step=1, use_sliding_window=False),
        batch=2, seq=9, pad_left=[0, 2],
    ),
    # Qwen2-MoE without q/k/v biases: the shared expert with its sigmoid gate; decoder_sparse_step 2
    # (layers 0 and 2 dense, layer 1 MoE)
    "f_qwen2_shared": dict(
        kind="qwen2_moe",
        cfg=dict(hidden_size=30, moe_intermediate_size=11, intermediate_size=25, shared_expert_intermediate_size=19,
                 num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1, num_experts=7,
                 num_experts_per_tok=3, norm_topk_prob=False, vocab_size=97, max_position_embeddings=64,
                 rope_theta=10000.0, router_aux_loss_coef=0.001, rms_norm_eps=1e-6, mlp_only_layers=[],
                 decoder_sparse_step=2, qkv_bias=False, use_sliding_window=False),
        batch=2, seq=10, pad_left=[3, 0],
    ),
})
FAMILY_CONFIGS.update({
    # Qwen2-MoE as its checkpoints are: q/k/v biases (qkv_bias true), shared expert, a dense layer
    "f_qwen2_bias": dict(
        kind="qwen2_moe",
        cfg=dict(hidden_size=28, moe_intermediate_size=9, intermediate_size=23, shared_expert_intermediate_size=15,
                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, num_experts=5,
                 num_experts_per_tok=2, norm_topk_prob=True, vocab_size=97, max_position_embeddings=64,
                 rope_theta=10000.0, router_aux_loss_coef=0.001, rms_norm_eps=1e-6, mlp_only_layers=[0],
                 decoder_sparse_step=1, qkv_bias=True, use_sliding_window=False),
        batch=2, seq=9, pad_left=[0, 2],
    ),
    # OLMoE with clip_qkv small enough to cut (after the q/k norms, and v) and attention_bias
    # (q/k/v/o biases)
    "f_olmoe_clip": dict(
        kind="olmoe",
        cfg=dict(hidden_size=24, intermediate_size=13, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, num_experts=5, num_experts_per_tok=2, norm_topk_prob=False,
                 vocab_size=97, max_position_embeddings=64, rope_theta=10000.0, router_aux_loss_coef=0.01,
                 rms_norm_eps=1e-5, clip_qkv=0.9, attention_bias=True, bos_token_id=None, eos_token_id=2,
                 pad_token_id=1),
        batch=2, seq=10, pad_left=[0, 3],
    ),
})
FAMILY_LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                   "gate"])


def family_classes(kind):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM, OlmoeConfig, OlmoeForCausalLM
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    return {"qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM), "olmoe": (OlmoeConfig, OlmoeForCausalLM),
            "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM)}[kind]


def family_model(kind, d):
    _, cls = family_classes(kind)
    m = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    m.config.output_router_logits = True
    return m


def family_main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    for idx, (name, spec) in enumerate(FAMILY_CONFIGS.items()):
        d = os.path.join(ROOT, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        cfg_cls, cls = family_classes(spec["kind"])
        torch.manual_seed(4000 + idx)
        base = cls(cfg_cls(**spec["cfg"], torch_dtype="float32", attn_implementation="eager",
                           output_router_logits=True, tie_word_embeddings=False)).float().eval()
        with torch.no_grad():
            for n, p in base.named_parameters():
                if n.endswith("norm.weight"):  # layernorms, q/k norms, the final norm
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                if n.endswith(".bias"):  # zero at init: a missed bias would go unseen
                    p.copy_(0.3 * torch.randn_like(p))
        base.save_pretrained(d, safe_serialization=True)
        tokens, mask, labels = make_batch(spec, spec["cfg"]["vocab_size"], seed=5000 + idx)
        coef = spec["cfg"]["router_aux_loss_coef"]
        t = {"tokens": tokens.int(), "attention_mask": mask.int(), "labels": labels.int()}

        torch.manual_seed(6000 + idx)
        pm = get_peft_model(family_model(spec["kind"], d), LoraConfig(**FAMILY_LORA))
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.2 * torch.randn_like(p))
        out, ce, aux = losses(pm, tokens, mask, labels, coef)
        out.loss.backward()
        t["lora.logits"] = out.logits.detach().float().contiguous()
        t["lora.ce"], t["lora.aux"], t["lora.loss"] = to_f64(ce), to_f64(aux), to_f64(out.loss)
        for n, p in pm.named_parameters():
            if p.requires_grad:
                g = torch.zeros_like(p) if p.grad is None else p.grad
                t["lora.grad." + n.replace(".default", "")] = g.detach().clone().float().contiguous()

        c = spec["cfg"]
        moe_layers = [l for l in range(c["num_hidden_layers"])
                      if l not in c.get("mlp_only_layers", []) and (l + 1) % c.get("decoder_sparse_step", 1) == 0]
        unfreeze = dict(layers=[moe_layers[-1]], experts=[0, c["num_experts"] - 1])
        unfrozen = {f"model.layers.{l}.mlp.gate.weight" for l in unfreeze["layers"]}
        unfrozen |= {f"model.layers.{l}.mlp.experts.{e}.{w}.weight" for l in unfreeze["layers"]
                     for e in unfreeze["experts"] for w in ("gate_proj", "up_proj", "down_proj")}
        for prefix, wanted in (("router", lambda n: n.endswith("mlp.gate.weight")),
                               ("unfreeze", lambda n: n in unfrozen),
                               ("qknorm", lambda n: n.endswith("q_norm.weight") or n.endswith("k_norm.weight")),
                               ("mlp", lambda n: ".shared_expert" in n or (".mlp." in n and "_proj" in n
                                                                          and ".experts." not in n)),
                               ("bias", lambda n: n.endswith(".bias"))):
            m = family_model(spec["kind"], d)
            for n, p in m.named_parameters():
                p.requires_grad_(wanted(n))
            if not any(p.requires_grad for p in m.parameters()):
                continue  # the family has no such part
            o, ce0, aux0 = losses(m, tokens, mask, labels, coef)
            o.loss.backward()
            for n, p in m.named_parameters():
                if p.requires_grad:
                    g = torch.zeros_like(p) if p.grad is None else p.grad
                    t[prefix + ".grad." + n] = g.detach().float().contiguous()
        t["base.logits"] = o.logits.detach().float().contiguous()  # the base model, no adapter
        t["base.ce"], t["base.aux"], t["base.loss"] = to_f64(ce0), to_f64(aux0), to_f64(o.loss)

        pm.save_pretrained(d)
        with open(os.path.join(d, "adapter_config.json")) as f:
            ac = json.load(f)
        ac["base_model_name_or_path"] = name
        ac["target_modules"] = sorted(ac["target_modules"])  # a set in PEFT: its order is the hash's
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(ac, f, indent=2, sort_keys=True)
        for extra in ("README.md", "generation_config.json"):
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(d, "golden.safetensors"),
                  metadata={"magic": MAGIC, "version": str(FORMAT_VERSION)})
        meta = dict(magic=MAGIC, version=FORMAT_VERSION, torch=torch.__version__,
                    transformers=transformers.__version__, peft=peft.__version__, family=spec["kind"],
                    attn_implementation="eager", dtype="float32", lora=FAMILY_LORA, pad_left=spec["pad_left"],
                    unfreeze=unfreeze)
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2, sort_keys=True)
        print(f"{name}: loss {out.loss.item():.6f} ce {ce.item():.6f} aux {aux.item():.6f}")


if __name__ == "__main__":
    sys.exit(family_main() if "--families" in sys.argv[1:] else main())
