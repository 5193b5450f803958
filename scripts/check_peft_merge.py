#!/usr/bin/env python3
"""check_peft_merge.py — is `moetrain merge`'s checkpoint PEFT's merge_and_unload() of the same adapter?

    python scripts/check_peft_merge.py --base DIR --adapter DIR --merged DIR --data FILE [--atol 1e-4]

Loads BASE with the adapter through PeftModel.from_pretrained and merges it (merge_and_unload), loads
MERGED (moetrain merge --out) with transformers alone, and compares the logits of every row of FILE
(JSONL {"text"}, byte-level ids as scripts/check_peft.py reads them) and the two mean losses.
Prints the largest |logit difference| (absolute, and relative to the largest logit) and the
losses; exit 0 when the largest difference is within --atol of the largest logit. fp32, eager
attention and experts. Needs torch, transformers, peft; not in `make test`.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_peft import read_samples  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--merged", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--atol", type=float, default=1e-4, help="relative to the largest |logit|")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    kw = {"dtype" if v5 else "torch_dtype": torch.float32, "attn_implementation": "eager"}
    if v5:
        kw["experts_implementation"] = "eager"
    peft_merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(a.base, **kw), a.adapter)
    peft_merged = peft_merged.merge_and_unload().eval()
    ours = AutoModelForCausalLM.from_pretrained(a.merged, **kw).eval()
    worst, big, losses = 0.0, 0.0, [[0.0, 0], [0.0, 0]]
    with torch.no_grad():
        for ids, mask in read_samples(a.data, a.base, 1024):
            x = torch.tensor([ids])
            for k, m in enumerate((peft_merged, ours)):
                logits = m(input_ids=x).logits[0].double()
                lp = torch.log_softmax(logits[:-1], dim=-1)
                losses[k][0] += -lp.gather(1, x[0, 1:].unsqueeze(1)).sum().item()
                losses[k][1] += len(ids) - 1
                if k == 0:
                    ref = logits
                else:
                    worst = max(worst, (logits - ref).abs().max().item())
                    big = max(big, ref.abs().max().item())
    lp, lo = losses[0][0] / losses[0][1], losses[1][0] / losses[1][1]
    ok = worst <= a.atol * big
    print("merge: max |logit diff| %.3g (largest |logit| %.3g, relative %.3g); loss PEFT merged %.8f, moetrain merge "
          "%.8f, relative %.3g; %s" % (worst, big, worst / big, lp, lo, abs(lp - lo) / abs(lp), "OK" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
