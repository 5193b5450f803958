#!/usr/bin/env python3
"""scripts/check_family_init.py — `moetrain init` output of each family loads in transformers.

Usage: check_family_init.py DIR [DIR ...]   (each DIR written by `moetrain init --config ...`)
For each checkpoint folder: AutoModelForCausalLM.from_pretrained with output_loading_info must
report no missing, unexpected or mismatched key; the parameter count must equal the sum of the
checkpoint's tensors (so no module is left at transformers' own random init); every norm weight
is 1 and every bias 0 (transformers' _init_weights); and a forward pass gives finite logits.
Needs torch + transformers (the /work/.venv-t4 venv); not part of `make test`.
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def check(d):
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, torch_dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v}
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    tensors = {}
    for f in files:
        tensors.update(load_file(os.path.join(d, f)))
    n_file = sum(t.numel() for t in tensors.values())
    n_model = sum(p.numel() for p in model.parameters())
    sd = model.state_dict()
    wrong = [k for k, t in tensors.items() if k not in sd or not torch.equal(sd[k].float(), t.float())]
    # gpt-oss's router bias is drawn like a weight (its _init_weights), not zeroed
    odd_init = [k for k, t in tensors.items()
                if (k.endswith("norm.weight") and not torch.all(t == 1)) or
                (k.endswith(".bias") and not k.endswith("router.bias") and not torch.all(t == 0))]
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 200, 3]]) % model.config.vocab_size).logits
    ok = not bad and n_file == n_model and not wrong and not odd_init and torch.isfinite(logits).all()
    print(f"check_family_init: {d}: {type(model).__name__} tensors={len(tensors)} params={n_model} "
          f"file_params={n_file} loading_info={bad or 'clean'} differ={wrong[:3]} init={odd_init[:3]} "
          f"{'OK' if ok else 'FAIL'}")
    return ok


if __name__ == "__main__":
    results = [check(d) for d in sys.argv[1:]]
    sys.exit(0 if results and all(results) else 1)
