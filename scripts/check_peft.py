#!/usr/bin/env python3
"""check_peft.py — does PEFT load a moetrain adapter and get moetrain's loss?

    python scripts/check_peft.py --base DIR --adapter DIR --data FILE --loss X [--rtol 1e-4]

Loads the base checkpoint with transformers (fp32, eager attention) and the adapter with
PeftModel.from_pretrained, then checks:
  1. PEFT attached LoRA to exactly the modules the adapter file holds (so target_modules, a
     list or a regex, selects what moetrain trained) and loaded every A/B bit for bit;
  2. the mean cross-entropy over the loss tokens of FILE equals X (the `loss=` that
     `moetrain eval --model DIR --adapter DIR --data FILE --quant none` prints) to --rtol.

FILE: a moetrain token file ("MTTOK1", data/data.h) or JSON {"samples": [[ids...], ...],
"masks": [[0/1...], ...] (optional)}. Each sample is one row, as `moetrain eval` without
--packing: label = the token where the mask is 1, the first token never a target; the loss is
sum of CE / count over all samples (the router aux loss is not included, as in moetrain eval).
Needs torch, transformers and peft (e.g. /work/venv/bin/python); not part of `make test`.
Exit 0 when both checks pass, 1 otherwise.
"""
import argparse
import json
import math
import os
import struct
import sys
import tempfile


def read_samples(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] == b"MTTOK1":
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
    doc = json.loads(data)
    samples = doc["samples"]
    masks = doc.get("masks") or [[1] * len(s) for s in samples]
    return samples, masks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--loss", required=True, type=float, help="moetrain eval's loss= on the same data")
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never reach for the Hub
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base_dir = a.base
    if os.path.exists(os.path.join(base_dir, "adapter_config.json")):
        # transformers would take the folder for an adapter and fetch its base from the Hub:
        # present the checkpoint's own files alone (the golden fixtures hold both).
        base_dir = tempfile.mkdtemp(prefix="check_peft_")
        for name in os.listdir(a.base):
            if name == "config.json" or name.startswith("model"):
                os.symlink(os.path.abspath(os.path.join(a.base, name)), os.path.join(base_dir, name))
    base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, a.adapter)
    model.eval()

    ok = True
    # 1. the modules PEFT adapted, and the weights it loaded
    saved = load_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    want = sorted({k[len("base_model.model."):-len(".lora_A.weight")] for k in saved if k.endswith(".lora_A.weight")})
    got = sorted(name[len("base_model.model."):] for name, mod in model.named_modules()
                 if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}))
    with open(os.path.join(a.adapter, "adapter_config.json")) as f:
        targets = json.load(f)["target_modules"]
    print("target_modules: %s" % (targets if isinstance(targets, list) else repr(targets)))
    if got != want:
        ok = False
        print("MISMATCH: PEFT adapted %d modules, the adapter holds %d" % (len(got), len(want)))
        for m in sorted(set(got) - set(want))[:10]:
            print("  adapted by PEFT, not in the file: %s" % m)
        for m in sorted(set(want) - set(got))[:10]:
            print("  in the file, not adapted by PEFT: %s" % m)
    else:
        print("modules: PEFT adapted exactly the %d modules of the adapter file" % len(got))
    modules = dict(model.named_modules())
    bad = 0
    for key, value in saved.items():
        module = key[len("base_model.model."):].rsplit(".lora_", 1)[0]
        which = "lora_A" if ".lora_A." in key else "lora_B"
        mod = modules.get("base_model.model." + module)
        if mod is None or not hasattr(mod, which) or not torch.equal(getattr(mod, which)["default"].weight, value):
            bad += 1
    if bad:
        ok = False
        print("MISMATCH: %d of %d adapter tensors were not loaded as saved" % (bad, len(saved)))
    else:
        print("weights: all %d adapter tensors loaded bit for bit" % len(saved))

    # 2. the loss
    samples, masks = read_samples(a.data)
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in zip(samples, masks):
            labels = [t if m else -100 for t, m in zip(ids, mask)]
            labels[0] = -100
            x = torch.tensor([ids])
            logits = model(input_ids=x).logits[0].double()
            target = torch.tensor(labels[1:])
            keep = target != -100
            if keep.any():
                lp = torch.log_softmax(logits[:-1][keep], dim=-1)
                total += -lp.gather(1, target[keep].unsqueeze(1)).sum().item()
                count += int(keep.sum())
    loss = total / count
    rel = abs(loss - a.loss) / abs(a.loss)
    print("loss: peft=%.8f moetrain=%.8f tokens=%d relative difference %.3g (tolerance %.1g)" % (loss, a.loss, count, rel, a.rtol))
    if not (rel <= a.rtol) or not math.isfinite(loss):
        ok = False
        print("MISMATCH: the losses differ")
    print("check_peft: %s" % ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
