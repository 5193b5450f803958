#!/usr/bin/env python3
"""Checkpoints as transformers 4.57 and 5.x save them, with their logits: for each family, the
config of tests/data/hf_configs/<v4|v5>/<family>.json (scripts/make_config_fixtures.py) built by the
installed transformers with seeded random weights, saved by save_pretrained in bf16, and run in
fp32 on fixed tokens. Writes tests/data/hf_models/<v4|v5>/<family>/: config.json and
model.safetensors (save_pretrained's own), golden.safetensors (tokens I32 [B, S], logits F32
[B, S, V]). tests/test_config_dialects.c loads each with moetrain and compares the logits.

    python scripts/make_dialect_goldens.py           # needs torch and transformers (4.57 or 5.x)
    python scripts/make_dialect_goldens.py --check   # regenerates in a temporary folder and compares
                                                     # byte for byte (exit 1 on a difference)
"""
import filecmp
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded

import torch
import transformers
from safetensors.torch import save_file
from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

VERSION = "v5" if int(transformers.__version__.split(".")[0]) >= 5 else "v4"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
CLASSES = {
    "mixtral": (MixtralConfig, MixtralForCausalLM),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "olmoe": (OlmoeConfig, OlmoeForCausalLM),
}
TOKENS = [[1, 17, 250, 3, 99, 42, 7, 7, 180, 64, 2, 299], [5, 280, 11, 123, 0, 77, 31, 200, 16, 8, 150, 9]]


def make(family, out):
    cfg_cls, model_cls = CLASSES[family]
    with open(os.path.join(ROOT, "hf_configs", VERSION, family + ".json")) as f:
        cfg = cfg_cls.from_dict(json.load(f))
    torch.manual_seed(1234)
    # Eager attention: the plain softmax, as moetrain's CPU attention computes it.
    model = model_cls._from_config(cfg, attn_implementation="eager").eval()
    # Larger weights than initializer_range's, so that routing and every layer matter to the logits;
    # rounded to bf16 values (saved in bf16, run in fp32 on exactly those values). Parameters only:
    # the RoPE frequencies are a buffer, which a whole-model cast to bf16 would round too.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            p.copy_(p.to(torch.bfloat16).float())
    tokens = torch.tensor(TOKENS, dtype=torch.int32)
    with torch.no_grad():
        logits = model(input_ids=tokens.long(), use_cache=False).logits.float().contiguous()
    os.makedirs(out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    save_file({"tokens": tokens.contiguous(), "logits": logits}, os.path.join(out, "golden.safetensors"))
    return sorted(os.listdir(out))


def main():
    check = "--check" in sys.argv[1:]
    base = os.path.join(ROOT, "hf_models", VERSION)
    bad = 0
    tmp = tempfile.mkdtemp() if check else None
    try:
        for family in CLASSES:
            want = os.path.join(base, family)
            out = os.path.join(tmp, family) if check else want
            if not check and os.path.isdir(out):
                shutil.rmtree(out)
            files = make(family, out)
            if check:
                same = all(os.path.exists(os.path.join(want, f)) and filecmp.cmp(os.path.join(out, f),
                                                                                  os.path.join(want, f), shallow=False)
                           for f in files)
                print(f"{want}: {'same bytes' if same else 'DIFFERENT'}")
                bad += not same
            else:
                print(f"wrote {out}: {', '.join(files)} (transformers {transformers.__version__}, torch {torch.__version__})")
    finally:
        if tmp:
            shutil.rmtree(tmp)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
