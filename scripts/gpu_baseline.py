#!/usr/bin/env python3
"""scripts/gpu_baseline.py — PyTorch on the GPU the GPU check runs on, in the same run: the figures
moetrain's step is judged against (scripts/gpu_check.sh's baseline step).

  1. matmul: a bf16 8192³ product, the card's practical tensor-core peak;
  2. sdpa: torch's scaled_dot_product_attention, causal with GQA (no repeated K/V), bf16, at
     Mixtral-8x7B's attention shapes (32 query heads, 8 KV heads, head_dim 128) and --seq,
     forward and forward + backward;
  3. train: transformers + PEFT training Mixtral-8x7B's shape cut to --layers, bf16, LoRA r=16
     (alpha 16 as case C, dropout 0) on every expert's gate_up_proj and down_proj and on each router
     (target_parameters: transformers 5 stores a layer's experts fused), gradient checkpointing
     on (moetrain's case C recomputes every layer), the router aux loss on at 0.02 as moetrain
     applies it, AdamW on the LoRA weights: tok/s and peak memory.

FLOPs: a matmul 2·M·N·K; causal attention counts the visible half of the S² pairs: forward
2 GEMMs × 2·(S²/2)·d per head, backward 5 such GEMMs (2.5× the forward).

    python3 scripts/gpu_baseline.py [--layers 4] [--seq 4096] [--steps 3] [--json FILE]
    python3 scripts/gpu_baseline.py --device cpu --tiny     # the same code paths, tiny, here
    python3 scripts/gpu_baseline.py --estimate              # the expected time on an H100

Each result is printed and appended to --json as one JSON line as soon as it is known; a part
that fails is recorded ("ok": false, the error) and the others still run; exit 1 if any failed.
Nothing is downloaded (the model is built from a config in code, with random weights).
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# Seconds on an H100 (imports ~15; the 4-layer model built on the GPU ~10; 1 + 3 steps at 4k of a
# ~6 B-parameter model with recomputation, ~1.5 s each by 6·N·T FLOPs at ~40% of the peak).
ESTIMATE = {"imports": 15, "matmul": 3, "sdpa": 3, "train (build)": 10, "train (4 steps)": 8}


def record(args, part, **kv):
    line = {"part": "baseline_" + part, **kv}
    print("baseline: " + part + ": " + ", ".join(f"{k}={v}" for k, v in kv.items()), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())


def timer(torch, device):
    """(start, stop) → seconds, with CUDA events on a GPU."""
    if device == "cuda":
        def run(fn, warm, reps):
            for _ in range(warm):
                fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            return statistics.median(times)
    else:
        def run(fn, warm, reps):
            for _ in range(warm):
                fn()
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return statistics.median(times)
    return run


def part_matmul(args, torch, run):
    n = 256 if args.tiny else 8192
    a = torch.randn(n, n, device=args.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=args.device, dtype=torch.bfloat16)
    s = run(lambda: a @ b, 3, 10)
    record(args, "matmul", ok=True, n=n, ms=round(s * 1e3, 4), tflops=round(2 * n ** 3 / s / 1e12, 2),
           timing="median of 10 after 3 warm-ups")


def part_sdpa(args, torch, run):
    F = torch.nn.functional
    hq, hkv, d, s_len = (4, 2, 16, 64) if args.tiny else (32, 8, 128, args.seq)
    shape = lambda h: (1, h, s_len, d)  # noqa: E731
    q = torch.randn(shape(hq), device=args.device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(shape(hkv), device=args.device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(shape(hkv), device=args.device, dtype=torch.bfloat16, requires_grad=True)
    go = torch.randn(shape(hq), device=args.device, dtype=torch.bfloat16)
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731

    def fwd_bwd():
        fwd().backward(go)

    with torch.no_grad():
        t_f = run(fwd, 3, 10)
    t_fb = run(fwd_bwd, 3, 10)
    flops_f = 2 * 2 * (s_len * s_len / 2) * d * hq
    record(args, "sdpa", ok=True, seq=s_len, heads=hq, kv_heads=hkv, head_dim=d, fwd_ms=round(t_f * 1e3, 4),
           fwd_tflops=round(flops_f / t_f / 1e12, 2), fwd_bwd_ms=round(t_fb * 1e3, 4),
           fwd_bwd_tflops=round(3.5 * flops_f / t_fb / 1e12, 2), gqa="enable_gqa (K/V not repeated)")


def mixtral_config(args, transformers):
    if args.tiny:
        c = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 num_local_experts=4, num_experts_per_tok=2, vocab_size=256, max_position_embeddings=512)
    else:
        with open(os.path.join(ROOT, "configs", "mixtral-8x7b.json")) as f:
            c = {k: v for k, v in json.load(f).items() if k not in ("architectures", "model_type", "torch_dtype",
                                                                    "transformers_version")}
    c.update(num_hidden_layers=args.layers, output_router_logits=True, router_aux_loss_coef=0.02, use_cache=False)
    return transformers.MixtralConfig(**c)


def part_train(args, torch):
    import peft
    import transformers
    cfg = mixtral_config(args, transformers)
    t0 = time.perf_counter()
    with torch.device(args.device):  # weights drawn where they live: a CPU init of 6 B takes minutes
        model = transformers.MixtralForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    lcfg = peft.LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=[],
                           target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"])
    model = peft.get_peft_model(model, lcfg)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    n_train = sum(p.numel() for _, p in trainable)
    n_all = sum(p.numel() for p in model.parameters())
    # What carries LoRA, layer numbers dropped: "model.layers.*.mlp.experts" and the like.
    kinds = sorted({".".join("*" if x.isdigit() else x for x in n.split(".lora_")[0].split(".")
                             if x not in ("base_model", "model", "base_layer")) for n, _ in trainable})
    build_s = time.perf_counter() - t0
    opt = torch.optim.AdamW([p for _, p in trainable], lr=1e-4, fused=args.device == "cuda")
    s_len = 64 if args.tiny else args.seq
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, s_len), generator=g).to(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        if args.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
        losses.append(round(out.loss.item(), 4))
    # One more pass: the experts' LoRA must get a gradient (a target that PEFT left out would not).
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    expert_lora = [p for n, p in trainable if "experts" in n]
    grads_reach = bool(expert_lora) and all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in expert_lora)
    opt.zero_grad(set_to_none=True)
    step_s = statistics.median(times)
    mem = {}
    if args.device == "cuda":
        mem = dict(peak_allocated_gb=round(torch.cuda.max_memory_allocated() / 1e9, 3),
                   peak_reserved_gb=round(torch.cuda.max_memory_reserved() / 1e9, 3))
    record(args, "train", ok=grads_reach, layers=args.layers, seq=s_len, batch=1, step_s=round(step_s, 4),
           tokens_per_s=round(s_len / step_s, 1), losses=losses, build_s=round(build_s, 2), params=n_all,
           trainable=n_train, lora_on=kinds, expert_lora_grads_nonzero=grads_reach, **mem,
           gradient_checkpointing=True, aux_loss_coef=0.02, torch=torch.__version__,
           transformers=transformers.__version__, peft=peft.__version__,
           timing=f"median of {args.steps} steps after {args.warmup} warm-up(s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (a check of the code paths, not a figure)")
    ap.add_argument("--json", help="append each result as a JSON line to this file")
    ap.add_argument("--estimate", action="store_true", help="print the expected seconds on an H100 and exit")
    args = ap.parse_args()
    if args.estimate:
        for k, v in ESTIMATE.items():
            print(f"baseline estimate: {k}: {v} s")
        print(f"baseline estimate: {sum(ESTIMATE.values())} s in all on an H100")
        return 0
    if args.tiny:
        args.layers = min(args.layers, 2)
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        record(args, "device", ok=False, error="no CUDA device visible to torch")
        return 1
    record(args, "device", ok=True, name=torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
           tiny=args.tiny, torch=torch.__version__)
    run = timer(torch, args.device)
    failed = 0
    for name, fn in (("matmul", lambda: part_matmul(args, torch, run)), ("sdpa", lambda: part_sdpa(args, torch, run)),
                     ("train", lambda: part_train(args, torch))):
        try:
            fn()
        except Exception as e:  # one part's failure is recorded; the others still run
            traceback.print_exc()
            record(args, name, ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            failed += 1
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
