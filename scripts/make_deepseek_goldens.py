#!/usr/bin/env python3
"""Golden fixtures for glm4_moe, deepseek_v3 and deepseek_v2: transformers 5.24's Glm4MoeForCausalLM,
DeepseekV3ForCausalLM and DeepseekV2ForCausalLM on tiny random configs with odd sizes, every part of
each family switched on and doing something.

Common to the three (CFG_COMMON): 3 layers, hidden 40, vocab 97, 9 routed experts of size 14 in
n_group 3 groups of 3 (experts 0-2, 3-5, 6-8), topk_group 2, top-3, one shared expert (size 14),
first_k_dense_replace 1 (layer 0 is a dense MLP of intermediate_size 28; layers 1 and 2 are MoE),
initializer_range 0.2 (every Linear, embedding, router and expert drawn N(0, 0.2^2)), untied
lm_head, B = 2, S = 11. Every RMSNorm weight is drawn 1 + N(0, 0.2^2) (q_a_layernorm and
kv_a_layernorm of MLA, q_norm / k_norm of GLM included); GLM's q/k/v biases (the only biases of
the three) N(0, 0.3^2).
  deepseek_v3  MLA: q_lora_rank 24 (q_a_proj, q_a_layernorm, q_b_proj), kv_lora_rank 16,
               qk_nope_head_dim 12, qk_rope_head_dim 8, v_head_dim 10, 4 heads, rope_interleave true,
               YaRN (factor 4, original_max_position_embeddings 64, beta_fast 32, beta_slow 1,
               mscale 1, mscale_all_dim 1: the cos/sin factor is 1 and the softmax scale is
               qk_head_dim^-0.5 * (0.1 ln 4 + 1)^2; truncate absent, so true); sigmoid router with
               e_score_correction_bias drawn N(0, 0.1^2) (it changes some choices: meta.json
               "bias_changes"), group score = sum of the group's top-2 biased scores, norm_topk_prob
               true, routed_scaling_factor 2.5.
  glm4_moe     GQA: 4 heads on 2 KV heads, head_dim 12 (explicit, != hidden/heads), use_qk_norm,
               partial_rotary_factor 0.5 (RoPE on the first 6 of 12 dims, rotate_half pairing
               (i, i+3)), attention_bias (q/k/v biases; o_proj has none), default RoPE; router as
               V3's, routed_scaling_factor 1.0, norm_topk_prob true.
  deepseek_v2  MLA with q_lora_rank null (a plain q_proj), kv_lora_rank 16, nope 12, rope 8, v 10,
               default RoPE (interleaved pairs, as complex numbers); softmax router over all 9
               experts, topk_method group_limited_greedy (group score = the group's max
               probability, other groups' probabilities set to 0), top-3 probabilities times
               routed_scaling_factor 1.5, never renormalised (norm_topk_prob false, and
               transformers' DeepseekV2 ignores the field anyway).
transformers computes no auxiliary loss for any of the three (no router_aux_loss_coef): loss = ce.
Attention and experts run eager (config._attn_implementation, _experts_implementation).

Writes tests/data/golden/<family>/:
  config.json, model.safetensors  the base checkpoint (fp32) as transformers 5.24's save_pretrained
                                  writes it: the hub layout, experts per expert
                                  (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight), which
                                  transformers fuses into mlp.experts.gate_up_proj / down_proj on
                                  load (checked: reloads with no missing or unexpected key and the
                                  same logits bit for bit); V3 and GLM carry
                                  model.layers.L.mlp.gate.e_score_correction_bias [9]
  golden.safetensors
    tokens, attention_mask, labels  I32 [B, S]: row 1 right-padded from position 8 (mask 0,
                                  labels -100 there)
    base.logits F32 [B, S, V]; base.ce, base.loss F64 [] (equal: no aux loss)
    routing.ids.L I32 [B*S, 3]    L = 1, 2 (the MoE layers): the experts transformers chose for
                                  each token of the base model (row b*S + s, padding rows
                                  included: compare the rows whose attention_mask is 1), sorted
                                  ascending
    routing.weights.L F32 [B*S, 3]  the routing weight of each of those experts (same order), as
                                  the experts' outputs are scaled (normalised and
                                  routed_scaling_factor applied)
    router.grad.model.layers.L.mlp.gate.weight F32 [9, 40]  router-only training: the base
                                  loss's gradient of each MoE layer's router weight
                                  (e_score_correction_bias is a buffer: no gradient)
    lora.A.<module> F32 [r, in], lora.B.<module> F32 [out, r]  the LoRA moetrain attaches, r 4,
                                  alpha 8 (scale 2), on every Linear but the router (mlp.gate)
                                  and lm_head, by moetrain's module names = the checkpoint's
                                  Linear names without ".weight" (list: "Module names" below)
    lora.logits, lora.ce, lora.loss  with W + 2·B·A in every targeted weight
    lora.routing.ids.L, lora.routing.weights.L  the routing of that LoRA run (as routing.*)
    lora.dA.<module>, lora.dB.<module>  the LoRA loss's gradients of A and B: from autograd's
                                  gradient G of the effective weight, dA = s·Bᵀ·G, dB = s·G·Aᵀ
    peft.loss F64 []              PEFT 0.21.2's loss on the batch with the adapter in peft/ (which
                                  holds the same A and B): equals lora.loss to float rounding
                                  (checked < 1e-5 relative; PEFT's autograd gradients of its
                                  LoRA weights, unpacked, equal lora.dA / lora.dB to < 1e-4:
                                  meta.json "peft")
    ties.*                        near ties in routing, for the router alone (below)
  peft/adapter_config.json, peft/adapter_model.safetensors  get_peft_model's adapter on this
                                  model, saved by PEFT, weights set to lora.A / lora.B: attention
                                  in target_modules; the fused experts through target_parameters
                                  experts.gate_up_proj (rank 8 = 2r, alpha 16, A [8·9, H] with
                                  expert e's rows 8e.. = [A_gate; A_up], B [2·14, 8·9]
                                  block-diagonal: column k·9 + e) and experts.down_proj (rank 4,
                                  A [4·9, 14], B [40, 4·9], column k·9 + e); the dense MLP's and
                                  the shared experts' Linears through target_parameters
                                  gate_proj.weight / up_proj.weight / down_proj.weight (PEFT's
                                  transformers-5 conversion would turn target_modules gate_proj /
                                  up_proj / down_proj into the fused experts' parameters and drop
                                  those Linears). Reloaded with PeftModel.from_pretrained: every
                                  tensor equal, same loss bit for bit.
  meta.json                       versions, r / alpha, the routing margins, the checks' results

ties.* (router-level near ties, reproducible bit for bit by any fp32 implementation):
  ties.router.weight F32 [9, 40]  a crafted router weight standing in for layer 1's
                                  model.layers.1.mlp.gate.weight; every entry a multiple of 2^-10
  ties.router.e_score_correction_bias F32 [9]  (V3, GLM) its bias; multiples of 2^-20
  ties.hidden F32 [N, 40]         router inputs (what the router sees: the post-attention RMSNorm's
                                  output), every entry a multiple of 2^-10 in [-1, 1], with
                                  sum_i |x_i w_i| < 16 for every expert: every product and partial
                                  sum is a multiple of 2^-20 below 2^4, so the router logits are
                                  exact in fp32 whatever the summation order
  ties.router_logits F32 [N, 9]   those exact logits
  ties.ids.1 I32 [N, 3], ties.weights.1 F32 [N, 3]  transformers' router module (layer 1's, with
                                  the crafted weight and bias) on ties.hidden: the chosen experts
                                  sorted ascending, and their routing weights in that order
  ties.flips I32 [N]              bit p set when reversing near-tie pair p alone changes the
                                  chosen set (the tie decides the row); bit 4: reversing pairs 1
                                  and 2 together changes which groups are selected. Two rows for
                                  each bit, then two rows no near tie decides (N = 12)
  ties.negbias.router.e_score_correction_bias F32 [9]  (V3, GLM) ties.router's bias minus 0.5
  ties.negbias.hidden F32 [4, 40], ties.negbias.ids.1 I32 [4, 3], ties.negbias.weights.1 F32 [4, 3]
                                  rows (same grid) routed with that bias: the -inf masking of
                                  the groups not selected (transformers 5.24, DeepSeek's own
                                  code) chooses, with margins above 1e-3, otherwise than the 0.0
                                  masking of transformers 4.57's V3 / GLM routers would, since
                                  three or fewer of the allowed experts' biased scores are
                                  positive
  Pairs (expert a, expert b, column c): 0 (0, 1, 5), 1 (3, 6, 17), 2 (4, 7, 29), 3 (2, 8, 33).
  Rows a and b of the weight are equal except in column c.
  Sigmoid routers (V3, GLM): pairs 0-2 have x_c = 0, so their logits and scores are exactly
  equal and the bias decides: b_1 = b_0 + 2^-20 (1 wins), b_6 = b_3 - 2^-20 (3 wins),
  b_7 = b_4 + 2·2^-20 (7 wins); where groups 1 and 2 both have those pairs as their top two,
  group 2's score beats group 1's by 2^-20 (bit 4). Biased scores of a pair differ by 2^-20,
  about 1e-6 relative (8 to 16 ulps). Pair 3 has W[8, 33] = W[2, 33] + 4·2^-10, equal biases and
  x_33 = ±2^-10: its logits differ by 4·2^-20 (tens of ulps), its scores by about 2^-20 (16 ulps,
  far more than a libm sigmoid's error) and the score decides.
  Softmax router (V2): every pair has W[b, c] = W[a, c] + 2^-10 and x_c = ±2^-10, so the logits
  differ by exactly 2^-20 (8 ulps) and the probabilities by about 1e-6 relative; bit 4 flags a
  near tie between the group maxima of groups 1 and 2.
  Reversing a pair: swap its two biases (sigmoid pairs 0-2), or negate x_c. Every row's decision
  margins are non-zero (no exact tie anywhere: torch.topk's order among equals is not defined),
  and the same rule in float64 on the exact logits chooses the same experts.
  Why router-level: inside the model the router's input carries each implementation's rounding
  (~1e-6 relative), so a near tie there cannot be reproduced bit for bit; a C test sets layer 1's
  router weight (and bias) to ties.router.*, feeds ties.hidden to the router alone and compares
  the chosen ids (and weights, to 1e-6).

Module names (L = layer): every layer's attention (V3: self_attn.q_a_proj, q_b_proj,
kv_a_proj_with_mqa, kv_b_proj, o_proj; V2: self_attn.q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj;
GLM: self_attn.q_proj, k_proj, v_proj, o_proj), layer 0's mlp.gate_proj / up_proj / down_proj, and
in layers 1-2 mlp.experts.E.gate_proj / up_proj / down_proj (E = 0..8) and
mlp.shared_experts.gate_proj / up_proj / down_proj, each prefixed model.layers.L.

Run: /work/.venv-t5cfg/bin/python scripts/make_deepseek_goldens.py   (torch, transformers 5.24, peft)
     /work/.venv-t4cfg/bin/python scripts/make_deepseek_goldens.py --check-t4   (transformers 4.57:
     loads each checkpoint, compares logits and routing with the goldens; writes nothing)
"""
import copy
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import transformers  # noqa: E402

ROOT = os.environ.get("GOLDEN_OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                                                   "golden")
R, ALPHA = 4, 8.0
S_LORA = ALPHA / R
B, S = 2, 11
E, K, G = 9, 3, 3  # experts, top-k, groups

CFG_COMMON = dict(vocab_size=97, hidden_size=40, intermediate_size=28, moe_intermediate_size=14, num_hidden_layers=3,
                  num_attention_heads=4, n_routed_experts=E, num_experts_per_tok=K, n_group=G, topk_group=2,
                  n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=256, initializer_range=0.2,
                  tie_word_embeddings=False)

FAMILIES = {
    "glm4_moe": dict(
        cls=("Glm4MoeConfig", "Glm4MoeForCausalLM"), sigmoid=True,
        cfg=dict(num_key_value_heads=2, head_dim=12, use_qk_norm=True, attention_bias=True, routed_scaling_factor=1.0,
                 norm_topk_prob=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        attn=("q_proj", "k_proj", "v_proj", "o_proj")),
    "deepseek_v3": dict(
        cls=("DeepseekV3Config", "DeepseekV3ForCausalLM"), sigmoid=True,
        cfg=dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8,
                 v_head_dim=10, rope_interleave=True, routed_scaling_factor=2.5, norm_topk_prob=True,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                                  "mscale": 1.0, "mscale_all_dim": 1.0}),
        attn=("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
    "deepseek_v2": dict(
        cls=("DeepseekV2Config", "DeepseekV2ForCausalLM"), sigmoid=False,
        cfg=dict(num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8,
                 v_head_dim=10, topk_method="group_limited_greedy", routed_scaling_factor=1.5, norm_topk_prob=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        attn=("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
    "glm4_moe_lite": dict(
        cls=("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM"), sigmoid=True, mtp=True,
        cfg=dict(num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "dense", "sparse"], num_key_value_heads=4,
                 q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
                 rope_interleave=True, attention_bias=True, routed_scaling_factor=1.8, norm_topk_prob=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}),
        drop=("first_k_dense_replace",),  # transformers' glm4_moe_lite reads mlp_layer_types only
        attn=("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
}

# The near-tie pairs of the ties block: (a, b, column where their router rows differ).
PAIRS = ((0, 1, 5), (3, 6, 17), (4, 7, 29), (2, 8, 33))
Q_W, Q_B = 2.0 ** -10, 2.0 ** -20  # grid of the crafted weights and inputs; of the crafted biases


def moe_layers(cfg):
    types = getattr(cfg, "mlp_layer_types", None)
    if types is not None:
        return [L for L, t in enumerate(types) if t == "sparse"]
    return list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))


def build(fam):
    spec = FAMILIES[fam]
    cfg_cls, model_cls = (getattr(transformers, n) for n in spec["cls"])
    torch.manual_seed(1234)
    kw = {k: v for k, v in CFG_COMMON.items() if k not in spec.get("drop", ())}
    kw.update(spec["cfg"])
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    model = model_cls(cfg).float()
    g = torch.Generator().manual_seed(4242)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        if spec["sigmoid"]:
            for L in moe_layers(cfg):
                b = model.model.layers[L].mlp.gate.e_score_correction_bias
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    model.eval()  # no dropout anywhere (there is none configured either)
    return model


def batch():
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, CFG_COMMON["vocab_size"], (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 8:] = 0  # right padding
    labels = tokens.clone()
    labels[mask == 0] = -100
    return tokens, mask, labels


def modules(fam, model):
    """moetrain's LoRA targets: (name, out, in) of every Linear but the router and lm_head."""
    cfg = model.config
    out = []
    for L, layer in enumerate(model.model.layers):
        p = f"model.layers.{L}"
        for proj in FAMILIES[fam]["attn"]:
            lin = getattr(layer.self_attn, proj)
            out.append((f"{p}.self_attn.{proj}", lin.out_features, lin.in_features))
        if L in moe_layers(cfg):
            for e in range(E):
                for leaf, o, i in (("gate_proj", cfg.moe_intermediate_size, cfg.hidden_size),
                                   ("up_proj", cfg.moe_intermediate_size, cfg.hidden_size),
                                   ("down_proj", cfg.hidden_size, cfg.moe_intermediate_size)):
                    out.append((f"{p}.mlp.experts.{e}.{leaf}", o, i))
            mlp, pre = layer.mlp.shared_experts, f"{p}.mlp.shared_experts"
        else:
            mlp, pre = layer.mlp, f"{p}.mlp"
        for leaf in ("gate_proj", "up_proj", "down_proj"):
            lin = getattr(mlp, leaf)
            out.append((f"{pre}.{leaf}", lin.out_features, lin.in_features))
    return out


def weight_view(model, name):
    """The [out, in] effective weight of a moetrain module as a view into transformers' parameter (and
    that parameter), so a delta can be added and a gradient read. Fused experts: gate_up_proj [E, 2I, H]
    (gate rows 0..I-1, up rows I..2I-1), down_proj [E, H, I]."""
    parts = name.split(".")
    if parts[4] == "experts":
        ex = model.model.layers[int(parts[2])].mlp.experts
        e, leaf = int(parts[5]), parts[6]
        if leaf == "down_proj":
            return ex.down_proj, lambda t: t[e]
        inter = ex.gate_up_proj.shape[1] // 2
        lo = 0 if leaf == "gate_proj" else inter
        return ex.gate_up_proj, lambda t: t[e][lo:lo + inter]
    return model.get_submodule(name).weight, lambda t: t


class RoutingTap:
    """Records every MoE layer's router output (logits, weights, ids) on each forward."""

    def __init__(self, model):
        self.out, self.hooks = {}, []
        for L in moe_layers(model.config):
            gate = model.model.layers[L].mlp.gate
            self.hooks.append(gate.register_forward_hook(self._hook(L)))

    def _hook(self, L):
        def f(_mod, _inp, out):
            logits, w, ids = out
            self.out[L] = (logits.detach().clone(), w.detach().clone(), ids.detach().clone())
        return f

    def sorted(self, L):
        _, w, ids = self.out[L]
        ids_s, order = ids.sort(dim=-1)
        return ids_s.int().contiguous(), w.gather(1, order).float().contiguous()

    def close(self):
        for h in self.hooks:
            h.remove()


def route(logits, bias, sigmoid, topk_group=2):
    """moetrain's reading of the router (the rule the C side implements), on fp32 logits [T, E]: the
    chosen ids (sorted), the selected groups, and the decision margins (the k-th minus the (k+1)-th
    choice score among the allowed experts; the topk_group-th minus the next group score)."""
    if sigmoid:
        scores = logits.sigmoid()
        choice = scores + bias
        gs = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
    else:
        choice = logits.softmax(dim=-1, dtype=torch.float32)
        gs = choice.view(-1, G, E // G).max(dim=-1).values
    gsort = gs.sort(dim=-1, descending=True)
    groups = gsort.indices[:, :topk_group]
    allowed = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, groups, True)
    allowed = allowed.repeat_interleave(E // G, dim=1)
    masked = choice.masked_fill(~allowed, float("-inf"))
    csort = masked.sort(dim=-1, descending=True)
    ids = csort.indices[:, :K].sort(dim=-1).values
    expert_margin = csort.values[:, K - 1] - csort.values[:, K]
    group_margin = gsort.values[:, topk_group - 1] - gsort.values[:, topk_group]
    # what the zero-fill of transformers 4.57's V3/GLM router would choose (masked groups at 0.0, not -inf)
    zero = choice.masked_fill(~allowed, 0.0).topk(K, dim=-1).indices.sort(dim=-1).values
    return ids, groups.sort(dim=-1).values, expert_margin, group_margin, zero


def routing_report(model, tap, mask):
    """Checks the recorded routing against route() and returns the margins on the real tokens."""
    sig = hasattr(model.model.layers[moe_layers(model.config)[0]].mlp.gate, "e_score_correction_bias")
    real = mask.reshape(-1).bool()
    rep = {}
    for L in moe_layers(model.config):
        logits = tap.out[L][0]
        bias = model.model.layers[L].mlp.gate.e_score_correction_bias if sig else None
        ids, _, em, gm, zero = route(logits, bias, sig)
        assert torch.equal(ids.int(), tap.sorted(L)[0]), f"layer {L}: route() disagrees with transformers"
        rel = lambda m: float(m[real].min())  # noqa: E731
        rep[str(L)] = {"min_expert_margin": rel(em), "min_group_margin": rel(gm),
                       "zero_fill_rule_differs": int((zero != ids).any(dim=-1)[real].sum())}
        if sig:  # how many real tokens the bias moved
            nob, *_ = route(logits, torch.zeros_like(bias), sig)
            rep[str(L)]["bias_changes"] = int((nob != ids).any(dim=-1)[real].sum())
    return rep


def full_grads(model):
    """--mode full: the base loss's gradient of every parameter under moetrain's names, the fused experts'
    split per expert and projection as weight_view reads them (e_score_correction_bias is a buffer)."""
    out = {f"full.grad.{n}": p.grad.detach().clone().contiguous()
           for n, p in model.named_parameters() if ".mlp.experts." not in n}
    for L in moe_layers(model.config):
        for e in range(E):
            for leaf in ("gate_proj", "up_proj", "down_proj"):
                mod = f"model.layers.{L}.mlp.experts.{e}.{leaf}"
                p, view = weight_view(model, mod)
                out[f"full.grad.{mod}.weight"] = view(p.grad).detach().clone().contiguous()
    return out


def add_mtp_layer(model, out_dir):
    """A multi-token-prediction layer past the last one, as GLM-4.7-Flash and DeepSeek-V3 ship it
    (model.layers.{num_hidden_layers}.*: its own norms, eh_proj, attention and MoE; a few of its
    tensors stand for all), and num_nextn_predict_layers 1 in config.json. transformers' modeling
    never reads it; moetrain must skip it and say so."""
    cfg, L = model.config, model.config.num_hidden_layers
    path = os.path.join(out_dir, "model.safetensors")
    with safe_open(path, "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    H, g = cfg.hidden_size, torch.Generator().manual_seed(55)
    shapes = {"enorm.weight": (H,), "hnorm.weight": (H,), "eh_proj.weight": (H, 2 * H), "shared_head.norm.weight": (H,),
              "input_layernorm.weight": (H,), "mlp.gate.weight": (E, H), "mlp.gate.e_score_correction_bias": (E,),
              "self_attn.kv_a_proj_with_mqa.weight": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, H),
              "mlp.experts.0.gate_proj.weight": (cfg.moe_intermediate_size, H)}
    for k, shape in shapes.items():
        tensors[f"model.layers.{L}.{k}"] = 0.2 * torch.randn(shape, generator=g)
    save_file(tensors, path, metadata=meta)
    cpath = os.path.join(out_dir, "config.json")
    with open(cpath) as f:
        c = json.load(f)
    c["num_nextn_predict_layers"] = 1
    with open(cpath, "w") as f:
        f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")
    return {"layer": L, "tensors": len(shapes)}


def run(model, tokens, mask, labels):
    out = model(input_ids=tokens, attention_mask=mask, labels=labels)
    return out


def losses(prefix, loss):
    v = torch.tensor(loss.item(), dtype=torch.float64)
    return {f"{prefix}.ce": v.clone(), f"{prefix}.loss": v.clone()}


def check_saved(fam, model, out_dir, tokens, mask):
    """The checkpoint's names (per expert, the bias saved) and transformers' reload of it."""
    cfg = model.config
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    for L in moe_layers(cfg):
        p = f"model.layers.{L}.mlp"
        assert f"{p}.experts.gate_up_proj" not in keys and f"{p}.experts.down_proj" not in keys, "fused experts saved"
        for e in range(E):
            for leaf in ("gate_proj", "up_proj", "down_proj"):
                assert f"{p}.experts.{e}.{leaf}.weight" in keys, f"{p}.experts.{e}.{leaf}.weight missing"
        assert f"{p}.gate.weight" in keys
        assert (f"{p}.gate.e_score_correction_bias" in keys) == FAMILIES[fam]["sigmoid"]
    model_cls = getattr(transformers, FAMILIES[fam]["cls"][1])
    m2, info = model_cls.from_pretrained(out_dir, output_loading_info=True, attn_implementation="eager",
                                         experts_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    with torch.no_grad():
        a = model(input_ids=tokens, attention_mask=mask).logits
        b = m2(input_ids=tokens, attention_mask=mask).logits
    assert torch.equal(a, b), "reloaded checkpoint gives other logits"
    # the default experts implementation (grouped_mm where torch has it) against eager, for the record
    # (grouped_mm on torch 2.11's CPU refuses these odd sizes: 'strides should be multiple of 16 bytes')
    m3 = model_cls.from_pretrained(out_dir)
    try:
        with torch.no_grad():
            c = m3(input_ids=tokens, attention_mask=mask).logits
        default = f"max abs logit diff to eager {float((c - a).abs().max()):.3g}"
    except RuntimeError as err:
        default = f"fails: {err}"
    return {"n_tensors": len(keys), "reload": "no missing/unexpected/mismatched key, logits equal bit for bit",
            "default_experts_implementation": f"{m3.config._experts_implementation}: {default}"}


# ---------------------------------------------------------------------------------------------- PEFT

PEFT_PARAMS = ["experts.gate_up_proj", "experts.down_proj", "gate_proj.weight", "up_proj.weight", "down_proj.weight"]


def peft_case(fam, model, factors, out_dir, tokens, mask, labels):
    """get_peft_model on a copy of the base model, LoRA weights set to `factors`; saved, reloaded."""
    from peft import LoraConfig, PeftModel, get_peft_model
    cfg = model.config
    lc = LoraConfig(r=R, lora_alpha=int(ALPHA), lora_dropout=0.0, target_modules=list(FAMILIES[fam]["attn"]),
                    target_parameters=list(PEFT_PARAMS), rank_pattern={r".*\.gate_up_proj": 2 * R},
                    alpha_pattern={r".*\.gate_up_proj": int(2 * ALPHA)})
    pm = get_peft_model(copy.deepcopy(model), lc)
    inter = cfg.moe_intermediate_size
    with torch.no_grad():
        n_set = 0
        for L, layer in enumerate(pm.base_model.model.model.layers):
            p = f"model.layers.{L}"
            for proj in FAMILIES[fam]["attn"]:
                lin = getattr(layer.self_attn, proj)
                A, Bm = factors[f"{p}.self_attn.{proj}"]
                lin.lora_A["default"].weight.copy_(A), lin.lora_B["default"].weight.copy_(Bm)
                n_set += 1
            if L in moe_layers(cfg):
                pre, mlp = f"{p}.mlp.shared_experts", layer.mlp.shared_experts
                outer = layer.mlp.experts  # ParamWrapper(down_proj) around ParamWrapper(gate_up_proj)
                assert outer.parameter_name == "down_proj" and outer.base_layer.parameter_name == "gate_up_proj"
                gu = outer.base_layer
                a_gu = torch.zeros_like(gu.lora_A["default"].weight)  # [2r·E, H]
                b_gu = torch.zeros_like(gu.lora_B["default"].weight)  # [2I, 2r·E]
                a_dn = torch.zeros_like(outer.lora_A["default"].weight)  # [r·E, I]
                b_dn = torch.zeros_like(outer.lora_B["default"].weight)  # [H, r·E]
                for e in range(E):
                    Ag, Bg = factors[f"{p}.mlp.experts.{e}.gate_proj"]
                    Au, Bu = factors[f"{p}.mlp.experts.{e}.up_proj"]
                    Ad, Bd = factors[f"{p}.mlp.experts.{e}.down_proj"]
                    a_gu[2 * R * e:2 * R * e + R] = Ag
                    a_gu[2 * R * e + R:2 * R * (e + 1)] = Au
                    for k in range(R):
                        b_gu[:inter, k * E + e] = Bg[:, k]
                        b_gu[inter:, (R + k) * E + e] = Bu[:, k]
                        b_dn[:, k * E + e] = Bd[:, k]
                    a_dn[R * e:R * (e + 1)] = Ad
                    n_set += 3
                gu.lora_A["default"].weight.copy_(a_gu), gu.lora_B["default"].weight.copy_(b_gu)
                outer.lora_A["default"].weight.copy_(a_dn), outer.lora_B["default"].weight.copy_(b_dn)
            else:
                pre, mlp = f"{p}.mlp", layer.mlp
            for leaf in ("gate_proj", "up_proj", "down_proj"):
                w = getattr(mlp, leaf)
                assert type(w).__name__ == "ParamWrapper", f"{pre}.{leaf} is not adapted"
                A, Bm = factors[f"{pre}.{leaf}"]
                w.lora_A["default"].weight.copy_(A), w.lora_B["default"].weight.copy_(Bm)
                n_set += 1
    assert n_set == len(factors), (n_set, len(factors))
    pm.eval()
    loss = run(pm, tokens, mask, labels).loss
    loss.backward()
    grads = peft_grads(fam, pm, cfg)
    pm.zero_grad()
    loss = loss.detach()
    adir = os.path.join(out_dir, "peft")
    pm.peft_config["default"].base_model_name_or_path = None
    pm.save_pretrained(adir)
    os.remove(os.path.join(adir, "README.md"))  # PEFT's model-card template
    # sets are written in hash order: sort the lists so the file is the same on every run
    path = os.path.join(adir, "adapter_config.json")
    with open(path) as f:
        ac = json.load(f)
    for key in ("target_modules", "target_parameters"):
        ac[key] = sorted(ac[key])
    with open(path, "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)
        f.write("\n")
    # reload on transformers' own load of the checkpoint
    model_cls = getattr(transformers, FAMILIES[fam]["cls"][1])
    base2 = model_cls.from_pretrained(out_dir, attn_implementation="eager", experts_implementation="eager")
    pm2 = PeftModel.from_pretrained(base2, adir)
    pm2.eval()
    sd1 = {k: v for k, v in pm.state_dict().items() if "lora_" in k}
    sd2 = {k: v for k, v in pm2.state_dict().items() if "lora_" in k}
    assert sd1.keys() == sd2.keys(), (sd1.keys() ^ sd2.keys())
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    with torch.no_grad():
        loss2 = run(pm2, tokens, mask, labels).loss
    assert loss2.item() == loss.item(), (loss2.item(), loss.item())
    with safe_open(os.path.join(adir, "adapter_model.safetensors"), "pt") as f:
        akeys = sorted(f.keys())
    return loss, grads, {"adapter_tensors": len(akeys), "target_modules": ac["target_modules"],
                  "target_parameters": ac["target_parameters"], "reload": "every tensor equal, same loss"}


def peft_grads(fam, pm, cfg):
    """PEFT's autograd gradients of its LoRA weights, read back into (dA, dB) per moetrain module (the
    fused experts' blocks unpacked as peft_case packs them)."""
    out = {}
    inter = cfg.moe_intermediate_size
    for L, layer in enumerate(pm.base_model.model.model.layers):
        p = f"model.layers.{L}"
        lins = [(f"{p}.self_attn.{proj}", getattr(layer.self_attn, proj)) for proj in FAMILIES[fam]["attn"]]
        if L in moe_layers(cfg):
            mlp, pre = layer.mlp.shared_experts, f"{p}.mlp.shared_experts"
            outer = layer.mlp.experts
            gu = outer.base_layer
            ga, gb = gu.lora_A["default"].weight.grad, gu.lora_B["default"].weight.grad
            da, db = outer.lora_A["default"].weight.grad, outer.lora_B["default"].weight.grad
            for e in range(E):
                cols = [k * E + e for k in range(R)]
                out[f"{p}.mlp.experts.{e}.gate_proj"] = (ga[2 * R * e:2 * R * e + R], gb[:inter, cols])
                out[f"{p}.mlp.experts.{e}.up_proj"] = (ga[2 * R * e + R:2 * R * (e + 1)],
                                                       gb[inter:, [(R + k) * E + e for k in range(R)]])
                out[f"{p}.mlp.experts.{e}.down_proj"] = (da[R * e:R * (e + 1)], db[:, cols])
        else:
            mlp, pre = layer.mlp, f"{p}.mlp"
        lins += [(f"{pre}.{leaf}", getattr(mlp, leaf)) for leaf in ("gate_proj", "up_proj", "down_proj")]
        for name, lin in lins:
            out[name] = (lin.lora_A["default"].weight.grad, lin.lora_B["default"].weight.grad)
    return {k: (a.detach().clone(), b.detach().clone()) for k, (a, b) in out.items()}


# ---------------------------------------------------------------------------------------------- ties

def ties_case(fam, model):
    """The router-level near-tie block (docstring: ties.*)."""
    sig = FAMILIES[fam]["sigmoid"]
    H = model.config.hidden_size
    g = torch.Generator().manual_seed(4321)
    W = (torch.randn(E, H, generator=g) * 0.2 / Q_W).round().clamp(-1 / Q_W, 1 / Q_W) * Q_W
    steps = {0: 1, 1: 1, 2: 1, 3: 4 if sig else 1}  # W[b, c] - W[a, c] in units of 2^-10
    for p, (a, b, c) in enumerate(PAIRS):
        W[b] = W[a]
        W[b, c] = W[a, c] + steps[p] * Q_W
    bias = None
    if sig:
        bias = (torch.randn(E, generator=g) * 0.1 / Q_B).round() * Q_B
        bias[1] = bias[0] + Q_B
        bias[6] = bias[3] - Q_B
        bias[7] = bias[4] + 2 * Q_B
        bias[8] = bias[2]
    gate = copy.deepcopy(model.model.layers[1].mlp.gate)
    with torch.no_grad():
        gate.weight.copy_(W)
        if sig:
            gate.e_score_correction_bias.copy_(bias)

    def choose(x, b):
        with torch.no_grad():
            if sig:
                gate.e_score_correction_bias.copy_(b)
            logits, w, ids = gate(x)
        ids_s, order = ids.sort(dim=-1)
        return logits, ids_s, w.gather(1, order)

    # candidates: x on the 2^-10 grid; the pairs' columns 0 (sigmoid pairs 0-2) or ±2^-10
    n = 4000
    scale = 0.3 + 0.7 * torch.rand(n, 1, generator=g)
    X = ((torch.rand(n, H, generator=g) * 2 - 1) * scale / Q_W).round() * Q_W
    for p, (a, b, c) in enumerate(PAIRS):
        if sig and p < 3:
            X[:, c] = 0.0
        else:
            X[:, c] = torch.where(torch.rand(n, generator=g) < 0.5, -Q_W, Q_W)
    bound = (X.abs().double() @ W.abs().double().t()).max(dim=-1).values
    X = X[bound < 16.0]
    logits, ids, _ = choose(X, bias)
    exact = (X.double() @ W.double().t())
    assert torch.equal(logits.double(), exact), "crafted router logits are not exact"

    def flipped(pairs):
        x, b = X.clone(), None if bias is None else bias.clone()
        for p in pairs:
            a_, b_, c = PAIRS[p]
            if sig and p < 3:
                b[a_], b[b_] = bias[b_].clone(), bias[a_].clone()
            else:
                x[:, c] = -x[:, c]
        return x, b

    flips = torch.zeros(len(X), dtype=torch.int32)
    for p in range(4):
        x, b = flipped([p])
        _, ids_f, _ = choose(x, b)
        flips |= ((ids_f != ids).any(dim=-1).int() << p)
    x, b = flipped([1, 2])
    g0 = route(logits, bias, sig)[1]
    g1 = route(choose(x, b)[0], b, sig)[1]
    flips |= ((g0 != g1).any(dim=-1).int() << 4)
    # margins: no exact tie anywhere; the near ties are the crafted ones
    rids, _, em, gm, _ = route(logits, bias, sig)
    assert torch.equal(rids, ids), "route() disagrees with transformers on the ties inputs"
    ok = (em > 0) & (gm > 0)
    # pick rows: two for each bit, then two with none of them, in candidate order
    picked = []
    for bit in range(5):
        rows = [i for i in range(len(X)) if ok[i] and (flips[i] >> bit) & 1 and i not in picked]
        assert len(rows) >= 2, f"{fam}: no candidate where near tie {bit} decides"
        picked += rows[:2]
    plain = [i for i in range(len(X)) if ok[i] and flips[i] == 0 and em[i] > 1e-3 and gm[i] > 1e-3]
    picked += plain[:2]
    idx = torch.tensor(picked)
    x_sel = X[idx].contiguous()
    lg, ids_sel, w_sel = choose(x_sel, bias)
    # the same choices in float64 from the exact logits: any implementation at fp32 or better agrees
    ids64 = route(lg.double(), None if bias is None else bias.double(), sig)[0]
    assert torch.equal(ids64, ids_sel), f"{fam}: float64 routing of the ties rows differs"
    info = {"rows": len(picked), "flips": [int(v) for v in flips[idx]],
            "expert_margins": [float(v) for v in em[idx]], "group_margins": [float(v) for v in gm[idx]]}
    out = {"ties.router.weight": W.contiguous(), "ties.hidden": x_sel, "ties.router_logits": lg.contiguous(),
           "ties.ids.1": ids_sel.int().contiguous(), "ties.weights.1": w_sel.float().contiguous(),
           "ties.flips": flips[idx].contiguous()}
    if sig:
        out["ties.router.e_score_correction_bias"] = bias.contiguous()
        # every bias 0.5 lower: the same choices under the -inf rule, but a masked group's experts
        # (0.0 under transformers 4.57's zero fill) would beat the negative biased scores
        neg = bias - 0.5
        lg_n, ids_n, _ = choose(X, neg)
        _, _, em_n, gm_n, zero_n = route(lg_n, neg, sig)
        rows = [i for i in range(len(X)) if (zero_n[i] != ids_n[i]).any() and em_n[i] > 1e-3 and gm_n[i] > 1e-3][:4]
        assert len(rows) == 4, f"{fam}: too few rows where the zero fill differs"
        idx_n = torch.tensor(rows)
        lg_sel_n, ids_sel_n, w_sel_n = choose(X[idx_n].contiguous(), neg)
        assert torch.equal(route(lg_sel_n.double(), neg.double(), sig)[0], ids_sel_n)
        out.update({"ties.negbias.router.e_score_correction_bias": neg.contiguous(),
                    "ties.negbias.hidden": X[idx_n].contiguous(), "ties.negbias.ids.1": ids_sel_n.int().contiguous(),
                    "ties.negbias.weights.1": w_sel_n.float().contiguous()})
        info["negbias_zero_fill_differs_of_candidates"] = int((zero_n != ids_n).any(dim=-1).sum())
    return out, info


# ---------------------------------------------------------------------------------------------- main

def family(fam):
    out_dir = os.path.join(ROOT, fam)
    model = build(fam)
    tokens, mask, labels = batch()
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "r": R, "alpha": ALPHA}
    meta["checkpoint"] = check_saved(fam, model, out_dir, tokens, mask)
    rot = model.model.rotary_emb
    meta["rope"] = {"inv_freq": [float(v) for v in rot.inv_freq], "cos_sin_factor": float(rot.attention_scaling),
                    "softmax_scale": float(model.model.layers[0].self_attn.scaling)}

    g = {"tokens": tokens.int(), "attention_mask": mask.int(), "labels": labels.int()}
    # base run and router-only gradients
    tap = RoutingTap(model)
    model.zero_grad()
    out = run(model, tokens, mask, labels)
    out.loss.backward()
    g["base.logits"] = out.logits.detach().float()
    g.update(losses("base", out.loss))
    for L in moe_layers(model.config):
        g[f"routing.ids.{L}"], g[f"routing.weights.{L}"] = tap.sorted(L)
        g[f"router.grad.model.layers.{L}.mlp.gate.weight"] = model.model.layers[L].mlp.gate.weight.grad.clone()
    g.update(full_grads(model))
    meta["base_routing"] = routing_report(model, tap, mask)

    # LoRA factors (the same for the PEFT adapter)
    gen = torch.Generator().manual_seed(7)
    factors = {}
    for name, o, i in modules(fam, model):
        factors[name] = (torch.randn(R, i, generator=gen) * 0.2, torch.randn(o, R, generator=gen) * 0.2)
    meta["modules"] = len(factors)

    peft_loss, peft_g, meta["peft"] = peft_case(fam, model, factors, out_dir, tokens, mask, labels)
    g["peft.loss"] = torch.tensor(peft_loss.item(), dtype=torch.float64)

    with torch.no_grad():
        for name, (A, Bm) in factors.items():
            p, view = weight_view(model, name)
            view(p.data).add_(S_LORA * Bm @ A)
    model.zero_grad()
    out = run(model, tokens, mask, labels)
    out.loss.backward()
    g["lora.logits"] = out.logits.detach().float()
    g.update(losses("lora", out.loss))
    for L in moe_layers(model.config):
        g[f"lora.routing.ids.{L}"], g[f"lora.routing.weights.{L}"] = tap.sorted(L)
    meta["lora_routing"] = routing_report(model, tap, mask)
    tap.close()
    for name, (A, Bm) in factors.items():
        p, view = weight_view(model, name)
        Gr = view(p.grad).detach()
        g[f"lora.A.{name}"], g[f"lora.B.{name}"] = A.contiguous(), Bm.contiguous()
        g[f"lora.dA.{name}"] = (S_LORA * Bm.t() @ Gr).contiguous()
        g[f"lora.dB.{name}"] = (S_LORA * Gr @ A.t()).contiguous()
    worst = 0.0
    for name, (dA, dB) in peft_g.items():
        for mine, theirs in ((g[f"lora.dA.{name}"], dA), (g[f"lora.dB.{name}"], dB)):
            worst = max(worst, float((mine - theirs).abs().max() / theirs.abs().max()))
    assert worst < 1e-4, f"PEFT's LoRA gradients differ from lora.dA / lora.dB by {worst:.3g}"
    meta["peft"]["grads_vs_lora_dA_dB_max_relative"] = worst
    rel = abs(peft_loss.item() - out.loss.item()) / abs(out.loss.item())
    assert rel < 1e-5, f"PEFT's loss {peft_loss.item()} vs the effective weights' {out.loss.item()}"
    meta["peft"]["loss_vs_lora_loss_relative"] = rel

    ties, meta["ties"] = ties_case(fam, model)
    g.update(ties)

    if FAMILIES[fam].get("mtp"):  # last: transformers' own reloads above read the checkpoint as saved
        meta["mtp"] = add_mtp_layer(model, out_dir)
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(out_dir, "golden.safetensors"))
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {out_dir}: base loss {g['base.loss'].item():.6f}, lora loss {g['lora.loss'].item():.6f}, "
          f"peft loss {peft_loss.item():.6f}, {len(factors)} LoRA modules")


def check_t4():
    """transformers 4.x on the written checkpoints: logits and routing against the goldens."""
    from transformers import AutoConfig, AutoModelForCausalLM
    for fam in FAMILIES:
        if not hasattr(transformers, FAMILIES[fam]["cls"][1]):
            print(f"{fam}: not in transformers {transformers.__version__}")
            continue
        d = os.path.join(ROOT, fam)
        with open(os.path.join(d, "config.json")) as f:
            raw = json.load(f)
        cfg = AutoConfig.from_pretrained(d)
        rp = raw.get("rope_parameters") or {}
        # 4.x reads rope_theta / rope_scaling / partial_rotary_factor, not 5.x's rope_parameters
        cfg.rope_theta = rp.get("rope_theta", 10000.0)
        if rp.get("rope_type", "default") != "default":
            cfg.rope_scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
        if "partial_rotary_factor" in rp:
            cfg.partial_rotary_factor = rp["partial_rotary_factor"]
        model = AutoModelForCausalLM.from_pretrained(d, config=cfg, attn_implementation="eager").float().eval()
        with safe_open(os.path.join(d, "golden.safetensors"), "pt") as f:
            gd = {k: f.get_tensor(k) for k in f.keys() if not k.startswith(("lora.", "ties.", "router."))}
        ids = {}
        hooks = [model.model.layers[L].mlp.gate.register_forward_hook(
            lambda _m, _i, o, L=L: ids.__setitem__(L, o[0].sort(dim=-1).values.int()))
            for L in range(1, cfg.num_hidden_layers)]
        with torch.no_grad():
            out = model(input_ids=gd["tokens"].long(), attention_mask=gd["attention_mask"].long(),
                        labels=gd["labels"].long())
        for h in hooks:
            h.remove()
        real = gd["attention_mask"].bool()
        want = gd["base.logits"]
        d_real = float((out.logits - want)[real].abs().max() / want[real].abs().max())
        d_pad = float((out.logits - want)[~real].abs().max() / want.abs().max())
        diff_rows = {L: int((ids[L] != gd[f"routing.ids.{L}"]).any(dim=-1)[real.reshape(-1)].sum()) for L in ids}
        print(f"{fam}: transformers {transformers.__version__}: loss {out.loss.item():.6f} vs "
              f"{gd['base.loss'].item():.6f}; logits rel. diff real {d_real:.2e}, padding {d_pad:.2e}; "
              f"real tokens routed otherwise {diff_rows}")


def main():
    if "--check-t4" in sys.argv:
        check_t4()
        return
    assert transformers.__version__.startswith("5."), "run with transformers 5.x (/work/.venv-t5cfg)"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for fam in (sys.argv[1:] or FAMILIES):
        family(fam)


if __name__ == "__main__":
    main()
