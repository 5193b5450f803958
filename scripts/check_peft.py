#!/usr/bin/env python3
"""check_peft.py — does PEFT load a moetrain adapter, every key of it, and get moetrain's loss?

    python scripts/check_peft.py --base DIR --adapter DIR --data FILE --loss X [--rtol 1e-4] [--seq 1024]

Works on both Hugging Face stacks: transformers 4.x (per-expert Linears; moetrain's v4 adapter
layout) and transformers 5.x (fused experts; the v5 layout, docs/formats.md "Layout v5"). Loads the base
checkpoint with transformers (fp32, eager attention) and the adapter with
PeftModel.from_pretrained, then checks:
  1. key coverage: PEFT's adapter state dict (get_peft_model_state_dict) holds exactly the keys
     of adapter_model.safetensors (none missing: a module PEFT adapted that the file has no
     weights for; none ignored: a key of the file PEFT did not use), every tensor loaded bit for
     bit, and PEFT warned of no missing or unexpected key. When PEFT converted the adapter to
     its model's layout (a v4 adapter on transformers 5) the keys cannot match one to one:
     then the number of LoRA parameters must, and no warning may be raised;
  2. the mean cross-entropy over the loss tokens of FILE equals X (the `loss=` that
     `moetrain eval --model DIR --adapter DIR --data FILE --quant none` prints) to --rtol.

FILE, read as `moetrain eval` reads it (without --packing; each sample one row, truncated to
--seq): JSONL of {"text": ...} lines, tokenized by the base's tokenizer (the byte-level one when
the folder has no tokenizer.model: ids = UTF-8 bytes, BOS/EOS from config.json), as
<s> text </s>, every token in the loss but the first; or a moetrain token file ("MTTOK1",
README "Token files"). Instruction and chat lines: `moetrain eval ... --save-tokens FILE` writes
the rows exactly as eval reads them (chat template, loss mask); pass that token file. The loss is sum of CE / count over all samples (no router aux loss).
Needs torch, transformers and peft; not part of `make test` (see `make interop`).
Exit 0 when both checks pass, 1 otherwise.
"""
import argparse
import json
import logging
import math
import os
import struct
import sys
import tempfile
import warnings


def read_token_file(data):
    flags, n = struct.unpack_from("<HQ", data, 6)
    pos, samples, masks = 16, [], []
    for _ in range(n):
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 4
        ids = list(struct.unpack_from("<%di" % length, data, pos))
        pos += 4 * length
        if flags & 1:
            mask = list(data[pos:pos + length])
            pos += length
        else:
            mask = [1] * length
        samples.append(ids)
        masks.append(mask)
    return samples, masks


def read_jsonl(path, base):
    with open(os.path.join(base, "config.json")) as f:
        cfg = json.load(f)
    bos, eos = cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2)
    sp = os.path.join(base, "tokenizer.model")
    tok = None
    if os.path.exists(sp):
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(base)
    samples = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            doc = json.loads(line)
            if set(doc) & {"instruction", "messages"} or "text" not in doc:
                sys.exit("%s:%d: an instruction or chat line: pass the token file of `moetrain eval --model BASE "
                         "--data %s --save-tokens FILE` (the rows exactly as eval reads them: its chat template "
                         "and loss mask) as --data FILE" % (path, lineno, path))
            text = doc["text"]
            ids = tok.encode(text, add_special_tokens=False) if tok else list(text.encode("utf-8"))
            samples.append([bos] + ids + [eos])
    return samples, [[1] * len(s) for s in samples]


def read_samples(path, base, seq):
    with open(path, "rb") as f:
        data = f.read()
    samples, masks = read_token_file(data) if data[:6] == b"MTTOK1" else read_jsonl(path, base)
    out = [(s[:seq], m[:seq]) for s, m in zip(samples, masks)]
    return [(s, m) for s, m in out if len(s) > 1 and any(m[1:])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--loss", required=True, type=float, help="moetrain eval's loss= on the same data")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--seq", type=int, default=1024, help="moetrain eval's --seq (default 1024)")
    a = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never reach for the Hub
    import torch
    import transformers
    import peft
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    print("stack: transformers %s, peft %s, torch %s" % (transformers.__version__, peft.__version__, torch.__version__))
    torch.manual_seed(0)
    base_dir = a.base
    if os.path.exists(os.path.join(base_dir, "adapter_config.json")):
        # transformers would take the folder for an adapter and fetch its base from the Hub:
        # present the checkpoint's own files alone (the golden fixtures hold both).
        base_dir = tempfile.mkdtemp(prefix="check_peft_")
        for name in os.listdir(a.base):
            if name == "config.json" or name.startswith("model") or name.startswith("tokenizer"):
                os.symlink(os.path.abspath(os.path.join(a.base, name)), os.path.join(base_dir, name))
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    kw = {"dtype" if v5 else "torch_dtype": torch.float32}
    if v5:  # the per-expert loop: grouped_mm needs 16-byte aligned strides, which odd tiny sizes lack
        kw["experts_implementation"] = "eager"
    base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager", **kw)

    # PEFT reports missing/unexpected keys as warnings (and some releases through logging)
    logs = []

    class Grab(logging.Handler):
        def emit(self, record):
            logs.append(record.getMessage())

    grab = Grab(level=logging.WARNING)
    for name in ("peft", "transformers"):
        logging.getLogger(name).addHandler(grab)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, a.adapter)
    for name in ("peft", "transformers"):
        logging.getLogger(name).removeHandler(grab)
    model.eval()
    messages = [str(w.message) for w in caught] + logs

    ok = True
    with open(os.path.join(a.adapter, "adapter_config.json")) as f:
        conf = json.load(f)
    saved = load_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    # v5: fused experts or target_parameters (Qwen's and OLMoE's v4 keys also hold ".mlp.experts.")
    layout = "v5" if conf.get("target_parameters") or any(
        ".mlp.experts.lora_" in k or ".mlp.experts.base_layer.lora_" in k for k in saved) else "v4"
    print("adapter: %s layout, %d tensors; target_modules=%s target_parameters=%s" % (
        layout, len(saved), conf.get("target_modules"), conf.get("target_parameters")))
    loaded = get_peft_model_state_dict(model)
    peft_conf = model.peft_config["default"]
    converted = (set(loaded) != set(saved)) and bool(getattr(peft_conf, "target_parameters", None)) and layout == "v4"

    # 1. key coverage
    peft_conf = model.peft_config["default"]
    bad_msgs = [m for m in messages if any(w in m.lower() for w in ("missing", "unexpected", "ignored", "not found"))]
    # PEFT 0.21 checks rank_pattern / alpha_pattern against target_modules only and so calls a
    # pattern for a target_parameters entry (gate_up_proj) "ignored" although it applies it: the
    # tensors below then load at that rank, which they could not otherwise (shapes differ).
    spurious = [m for m in bad_msgs if "_pattern keys did not match any targeted module" in m
                and getattr(peft_conf, "target_parameters", None)]
    bad_msgs = [m for m in bad_msgs if m not in spurious]
    for m in spurious:
        print("NOTE (PEFT's check skips target_parameters; the tensor shapes below prove the rank): %s" % m.strip()[:200])
    for m in bad_msgs:
        print("PEFT WARNING: %s" % m.strip().splitlines()[0][:300])
    if bad_msgs:
        ok = False
    if converted:
        n_saved = sum(v.numel() for v in saved.values())
        n_loaded = sum(v.numel() for v in loaded.values())
        print("keys: PEFT converted the v4 adapter to its model's layout: %d tensors -> %d (rank_pattern %s)" % (
            len(saved), len(loaded), dict(peft_conf.rank_pattern)))
        # w1+w3 fused at rank 2r: the block-diagonal B holds zeros besides the saved values
        if n_loaded < n_saved:
            ok = False
            print("MISMATCH: PEFT holds %d LoRA values, the file %d" % (n_loaded, n_saved))
    else:
        missing = sorted(set(loaded) - set(saved))
        ignored = sorted(set(saved) - set(loaded))
        for k in missing[:10]:
            print("  missing (adapted by PEFT, not in the file): %s" % k)
        for k in ignored[:10]:
            print("  ignored (in the file, not used by PEFT): %s" % k)
        diff = [k for k in set(saved) & set(loaded) if not torch.equal(loaded[k].float().cpu(), saved[k].float())]
        for k in diff[:10]:
            print("  not loaded as saved: %s" % k)
        if missing or ignored or diff:
            ok = False
            print("MISMATCH: %d missing, %d ignored, %d altered keys" % (len(missing), len(ignored), len(diff)))
        else:
            print("keys: all %d adapter tensors loaded bit for bit; 0 missing, 0 unexpected, 0 ignored" % len(saved))

    # 2. the loss
    rows = read_samples(a.data, a.base, a.seq)
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in rows:
            labels = [t if m else -100 for t, m in zip(ids, mask)]
            labels[0] = -100
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
            target = torch.tensor(labels[1:])
            keep = target != -100
            if keep.any():
                lp = torch.log_softmax(logits[:-1][keep], dim=-1)
                total += -lp.gather(1, target[keep].unsqueeze(1)).sum().item()
                count += int(keep.sum())
    loss = total / count
    rel = abs(loss - a.loss) / abs(a.loss)
    print("loss: peft=%.8f moetrain=%.8f tokens=%d |diff| %.3g relative %.3g (tolerance %.1g)" % (
        loss, a.loss, count, abs(loss - a.loss), rel, a.rtol))
    if not (rel <= a.rtol) or not math.isfinite(loss):
        ok = False
        print("MISMATCH: the losses differ")
    print("check_peft: %s" % ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
