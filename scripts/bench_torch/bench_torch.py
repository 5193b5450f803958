#!/usr/bin/env python3
"""make bench-torch: LoRA training throughput and peak RSS of moetrain against PyTorch +
transformers + PEFT on the CPU, on the same checkpoint and the same token rows.

The checkpoint is written by `moetrain init` (an HF folder: config.json + model.safetensors, fp32);
both sides load that folder. The token rows are one MTTOK1 file (random ids, every token in the
loss); the PyTorch side reads the same file. Both train LoRA r=16 (alpha 16, no dropout) on every
expert's w1, w2 and w3 with AdamW, batch 1, the router's aux loss on, on the base in fp32 or in NF4
(double quant, block 64; bitsandbytes on the PyTorch side, router and lm_head kept in full
precision on both), with or without activation recomputation.

Each workload runs as interleaved pairs (the order alternates per round), each side in its own
process; tok/s is the mean over the steps after the first, peak RSS is the process's ru_maxrss
(os.wait4). The table gives per-workload medians of the per-pair ratios. Both sides run with
OMP_WAIT_POLICY=passive (moetrain's default; set for torch's own libgomp too) unless it is set.

usage: bench_torch.py --moetrain BUILD/moetrain [--rounds 3] [--seqs 128,512,2048]
                      [--bases fp32,nf4] [--ckpt full,none] [--layers 4] [--threads N]
"""
import argparse
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def write_tokens(path, rows, seq, vocab, seed=1):
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(b"MTTOK1" + struct.pack("<HQ", 0, rows))
        for _ in range(rows):
            f.write(struct.pack("<I", seq))
            f.write(struct.pack("<%di" % seq, *[rng.randrange(3, vocab) for _ in range(seq)]))


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"MTTOK1"
    flags, n = struct.unpack_from("<HQ", data, 6)
    off, rows = 16, []
    for _ in range(n):
        (L,) = struct.unpack_from("<I", data, off)
        off += 4
        rows.append(list(struct.unpack_from("<%di" % L, data, off)))
        off += 4 * L + (L if flags & 1 else 0)
    return rows


def steps_for(seq):
    return 1 + max(2, 1024 // seq)  # one warm-up step, then at least 2 timed


def run_child(cmd, env=None):
    """Runs cmd; returns (stdout+stderr text, peak RSS in MiB, seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.stderr.write(out[-4000:])
        raise SystemExit("bench-torch: %s exited %d" % (cmd[0], p.returncode))
    return out, ru.ru_maxrss / 1024.0, time.monotonic() - t0


def run_moetrain(a, model, data, seq, base, ckpt, out_dir):
    steps = steps_for(seq)
    cmd = [a.moetrain, "--model", model, "--data", data, "--mode", "lora", "--r", "16", "--alpha", "16",
           "--targets", "experts", "--seq", str(seq), "--batch", "1", "--steps", str(steps),
           "--checkpointing", ckpt, "--quant", "none" if base == "fp32" else "nf4", "--out", out_dir,
           "--lr", "2e-4", "--warmup", "0", "--schedule", "constant"]
    out, rss, _ = run_child(cmd)
    tps = [float(line.split("tok/s=")[1].split()[0]) for line in out.splitlines()
           if line.startswith("step=") and "tok/s=" in line]
    if len(tps) < steps:
        raise SystemExit("bench-torch: moetrain printed %d step lines, want %d" % (len(tps), steps))
    return statistics.mean(tps[1:]), rss


def run_torch(a, model, data, seq, base, ckpt):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--data", data,
           "--seq", str(seq), "--base", base, "--ckpt", ckpt, "--threads", str(a.threads)]
    # The same OpenMP wait policy moetrain runs with (core/threads.h): torch's bundled libgomp
    # would otherwise spin, which on a shared machine measures the policy, not the kernels.
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "passive")
    out, rss, _ = run_child(cmd, env)
    line = [l for l in out.splitlines() if l.startswith("torch tok_s=")]
    if not line:
        sys.stderr.write(out[-4000:])
        raise SystemExit("bench-torch: the PyTorch worker printed no result")
    return float(line[-1].split("=")[1]), rss


def worker(a):
    """The PyTorch side: one workload, prints `torch tok_s=X`."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    kw = dict(torch_dtype=torch.float32, attn_implementation="sdpa")
    if a.base == "nf4":
        kw["quantization_config"] = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32, llm_int8_skip_modules=["lm_head", "gate"])
        kw["device_map"] = {"": "cpu"}
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, **kw)
    model.config.use_cache = False
    model.config.output_router_logits = True  # the aux loss, as moetrain trains with it
    if a.ckpt == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0,
                                             target_modules=["w1", "w2", "w3"]))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    rows = read_tokens(a.data)
    steps, times = steps_for(a.seq), []
    for s in range(steps):
        ids = torch.tensor([rows[s % len(rows)][: a.seq]], dtype=torch.long)
        t0 = time.monotonic()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.monotonic() - t0)
        print("torch step=%d loss=%.4f s=%.3f" % (s + 1, loss.item(), times[-1]), flush=True)
    print("torch tok_s=%.3f" % (a.seq * (steps - 1) / sum(times[1:])), flush=True)


def load_avg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--moetrain")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seqs", default="128,512,2048")
    p.add_argument("--bases", default="fp32,nf4")
    p.add_argument("--ckpt", default="full,none")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--keep", help="work folder to reuse (default: a temporary one)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    p.add_argument("--base", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if not a.moetrain:
        p.error("--moetrain BUILD/moetrain is required")
    a.moetrain = os.path.abspath(a.moetrain)
    work = a.keep or tempfile.mkdtemp(prefix="moetrain-bench-torch-")
    os.makedirs(work, exist_ok=True)
    cfg = json.load(open(os.path.join(REPO, "configs", "mid.json")))
    cfg["num_hidden_layers"] = a.layers
    cfg_path, model = os.path.join(work, "config.json"), os.path.join(work, "model")
    json.dump(cfg, open(cfg_path, "w"), indent=1)
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        run_child([a.moetrain, "init", "--config", cfg_path, "--out", model, "--dtype", "f32"])
    seqs = [int(s) for s in a.seqs.split(",")]
    workloads = [(s, b, c) for s in seqs for b in a.bases.split(",") for c in a.ckpt.split(",")]
    data = {}
    for s in seqs:
        data[s] = os.path.join(work, "tokens%d.bin" % s)
        write_tokens(data[s], 16, s, cfg["vocab_size"])
    print("bench-torch: model=configs/mid.json cut to %d layers, LoRA r=16 on experts' w1/w2/w3, batch 1, "
          "threads=%d, %d rounds; load at start %s" % (a.layers, a.threads, a.rounds, load_avg()), flush=True)
    res = {w: [] for w in workloads}
    for seq in seqs:  # shorter sequences first: an interrupted run still has whole tables for them
        for r in range(a.rounds):
            for w in [w for w in workloads if w[0] == seq]:
                _, base, ckpt = w
                sides = ["moetrain", "torch"] if r % 2 == 0 else ["torch", "moetrain"]
                got = {}
                for side in sides:
                    if side == "moetrain":
                        got[side] = run_moetrain(a, model, data[seq], seq, base, ckpt, os.path.join(work, "out"))
                    else:
                        got[side] = run_torch(a, model, data[seq], seq, base, ckpt)
                res[w].append((got["moetrain"], got["torch"], load_avg()))
                print("round=%d seq=%d base=%s ckpt=%s moetrain_tok_s=%.1f torch_tok_s=%.1f ratio=%.2f "
                      "moetrain_rss_mib=%.0f torch_rss_mib=%.0f rss_ratio=%.2f load=%s" % (
                          r + 1, seq, base, ckpt, got["moetrain"][0], got["torch"][0],
                          got["moetrain"][0] / got["torch"][0], got["moetrain"][1], got["torch"][1],
                          got["moetrain"][1] / got["torch"][1], load_avg()), flush=True)
        print_table([w for w in workloads if res[w]], res)


def print_table(workloads, res):
    print("\n| seq | base | recompute | moetrain tok/s | PyTorch+PEFT tok/s | ratio (median) | "
          "moetrain RSS MiB | PyTorch RSS MiB | RSS ratio | goal (>=1.5x, RSS <=0.5x) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w in workloads:
        seq, base, ckpt = w
        m = [x[0][0] for x in res[w]]
        t = [x[1][0] for x in res[w]]
        ratio = statistics.median([x[0][0] / x[1][0] for x in res[w]])
        rm = max(x[0][1] for x in res[w])
        rt = max(x[1][1] for x in res[w])
        print("| %d | %s | %s | %.1f | %.1f | %.2fx | %.0f | %.0f | %.2f | %s |" % (
            seq, base, "yes" if ckpt == "full" else "no", statistics.median(m), statistics.median(t), ratio,
            rm, rt, rm / rt, "met" if ratio >= 1.5 and rm / rt <= 0.5 else "NOT MET"))
    print("load now: %s\n" % load_avg(), flush=True)


if __name__ == "__main__":
    main()
