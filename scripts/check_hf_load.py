#!/usr/bin/env python3
"""scripts/check_hf_load.py DIR [DIR ...] — each checkpoint folder (moetrain init, merge or quantize
output) loads in the installed transformers with no missing, unexpected or mismatched key, and a
forward pass gives finite logits. Prints one line per folder; exit 1 when any fails. Needs torch and
transformers (and bitsandbytes for a 4-bit folder); run by scripts/hf_roundtrip.sh, not by CI.
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def check(d):
    try:
        return load_and_run(d)
    except Exception as e:  # one folder's failure is reported, the others still run
        print(f"FAIL transformers {transformers.__version__}: {d}: {type(e).__name__}: {str(e)[:200]}")
        return False


def load_and_run(d):
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32) \
        if int(transformers.__version__.split(".")[0]) >= 5 else \
        AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, torch_dtype=torch.float32)
    bad = {k: sorted(v)[:4] for k, v in info.items() if v}
    # A 4-bit folder is loaded, not run: bitsandbytes' CPU kernels want sizes these tiny models lack.
    four_bit = getattr(model.config, "quantization_config", None) is not None
    finite = True
    if not four_bit:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[1, 7, 42, 99, 5]])).logits
        finite = bool(torch.isfinite(logits).all())
    ok = not bad and finite
    print(f"{'ok  ' if ok else 'FAIL'} transformers {transformers.__version__}: {d}: "
          f"{'no missing, unexpected or mismatched key' if not bad else bad}; "
          f"{'4-bit: loaded, not run' if four_bit else 'logits finite' if finite else 'logits NOT finite'}")
    return ok


if __name__ == "__main__":
    sys.exit(0 if all([check(d) for d in sys.argv[1:]]) else 1)
