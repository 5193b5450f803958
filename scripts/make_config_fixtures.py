#!/usr/bin/env python3
"""config.json of each supported family as transformers' save_pretrained writes it, with odd sizes
and non-default values for every field that changes the math: tests/data/hf_configs/v4/ (run with
transformers 4.57) and v5/ (transformers 5.x). test_config_dialects.c reads both and checks they
describe the same model. Configs only: no torch needed.

    python scripts/make_config_fixtures.py            # writes v4/ or v5/ by the installed version
    python scripts/make_config_fixtures.py --check    # compares instead of writing (exit 1 on a difference)
"""
import json
import os
import sys
import tempfile

import transformers
from transformers import GptOssConfig, MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig

V5 = int(transformers.__version__.split(".")[0]) >= 5
THETA = 31337.0

# Every family: hidden 48 with 6 heads of 8, 2 kv heads, 3 layers, 6 experts top-2, vocab 300.
COMMON = dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, vocab_size=300,
              num_experts_per_tok=2, rms_norm_eps=3e-6, router_aux_loss_coef=0.03, initializer_range=0.05,
              max_position_embeddings=640, tie_word_embeddings=False)
FAMILIES = {
    "mixtral": (MixtralConfig, dict(intermediate_size=40, num_local_experts=6, head_dim=12, sliding_window=5,
                                    router_jitter_noise=0.0, bos_token_id=1, eos_token_id=2)),
    "qwen2_moe": (Qwen2MoeConfig, dict(moe_intermediate_size=20, intermediate_size=56, num_experts=6,
                                       shared_expert_intermediate_size=36, decoder_sparse_step=2, mlp_only_layers=[0],
                                       norm_topk_prob=True, qkv_bias=True, bos_token_id=5, eos_token_id=7)),
    "qwen3_moe": (Qwen3MoeConfig, dict(moe_intermediate_size=20, intermediate_size=56, num_experts=6,
                                       decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True,
                                       attention_bias=True, head_dim=12, bos_token_id=5, eos_token_id=7)),
    "olmoe": (OlmoeConfig, dict(intermediate_size=40, num_experts=6, clip_qkv=4.5, norm_topk_prob=True,
                                attention_bias=True, bos_token_id=5, eos_token_id=7, pad_token_id=1)),
    "gpt_oss": (GptOssConfig, dict(intermediate_size=40, num_local_experts=6, head_dim=12, sliding_window=5,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                   swiglu_alpha=1.5, swiglu_limit=6.5, attention_bias=True, bos_token_id=5,
                                   eos_token_id=7)),
}
# gpt-oss's YaRN, with non-default values (its rope_scaling / rope_parameters).
YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": True,
        "original_max_position_embeddings": 160}


def text(family):
    cls, extra = FAMILIES[family]
    kw = dict(COMMON, **extra)
    yarn = YARN if family == "gpt_oss" else {}
    if V5:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": THETA, **yarn}
    else:
        kw["rope_theta"] = THETA
        if yarn:
            kw["rope_scaling"] = dict(yarn)
    cfg = cls(**kw)
    cfg.architectures = [cls.__name__.replace("Config", "ForCausalLM")]
    with tempfile.TemporaryDirectory() as d:
        cfg.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            return f.read()


def main():
    check = "--check" in sys.argv[1:]
    out = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "hf_configs", "v5" if V5 else "v4")
    os.makedirs(out, exist_ok=True)
    bad = 0
    for family in FAMILIES:
        path = os.path.join(out, family + ".json")
        t = text(family)
        if check:
            same = os.path.exists(path) and open(path).read() == t
            print(f"{path}: {'same' if same else 'DIFFERENT'}")
            bad += not same
        else:
            with open(path + ".tmp", "w") as f:
                f.write(t)
            os.replace(path + ".tmp", path)
            print(f"wrote {path} (transformers {transformers.__version__})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
