#!/usr/bin/env python3
"""PEFT's own gpt-oss adapters, for tests/test_peft_gpt_oss.c (issue 29).

Writes tests/data/peft_gpt_oss/<stack>/ (stack "t5": transformers 5.x + PEFT 0.21, "t4":
transformers 4.57 + PEFT 0.17; run the script once in each venv):
  adapter_config.json, adapter_model.safetensors   get_peft_model's adapter, saved by PEFT, on a
        tiny random GptOssForCausalLM (hidden 8, intermediate 4, 3 experts, 1 layer), r 2,
        alpha 6 (scale 3): target_modules q_proj; target_parameters gate_up_proj, down_proj and
        router.weight (PEFT's only way to them: GptOssTopKRouter is not an nn.Linear, the experts
        are fused [E, H, 2f] / [E, f, H]); every LoRA weight random (B too), so nothing is zero
  delta.safetensors   PEFT's own ParamWrapper.get_delta_weight / Linear.get_delta_weight output,
        in the parameter's layout: "gate_up_proj" [E, H, 2f] (gate in the even columns),
        "down_proj" [E, f, H], "router" [E, H], "q_proj" [out, in]; F32

moetrain reads the adapter into per-expert gate/up/down pairs; the test rebuilds each expert's
delta W = scale·B·A from them and compares it with these.

Run: /work/.venv-t5cfg/bin/python scripts/make_peft_gpt_oss_fixtures.py
     /work/.venv-t4cfg/bin/python scripts/make_peft_gpt_oss_fixtures.py
"""
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402

V5 = int(transformers.__version__.split(".")[0]) >= 5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "peft_gpt_oss",
                   "t5" if V5 else "t4")
R, ALPHA = 2, 6


def main():
    torch.manual_seed(29)
    cfg = GptOssConfig(hidden_size=8, intermediate_size=4, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=4, num_local_experts=3, num_experts_per_tok=2, vocab_size=16,
                       layer_types=["full_attention"])
    model = GptOssForCausalLM(cfg).float()
    lc = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["q_proj"],
                    target_parameters=["gate_up_proj", "down_proj", "router.weight"], init_lora_weights=False)
    pm = get_peft_model(model, lc)
    layer = pm.base_model.model.model.layers[0]
    outer = layer.mlp.experts  # ParamWrapper(down_proj) around ParamWrapper(gate_up_proj)
    assert outer.parameter_name == "down_proj" and outer.base_layer.parameter_name == "gate_up_proj"
    wrappers = {"gate_up_proj": outer.base_layer, "down_proj": outer, "router": layer.mlp.router,
                "q_proj": layer.self_attn.q_proj}
    with torch.no_grad():  # every factor random and O(1), so each entry of each delta matters
        for w in wrappers.values():
            w.lora_A["default"].weight.normal_()
            w.lora_B["default"].weight.normal_()
        delta = {k: w.get_delta_weight("default").detach().float().contiguous() for k, w in wrappers.items()}
    H, f, E = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    assert delta["gate_up_proj"].shape == (E, H, 2 * f) and delta["down_proj"].shape == (E, f, H)
    assert delta["router"].shape == (E, H)
    os.makedirs(OUT, exist_ok=True)
    pm.peft_config["default"].base_model_name_or_path = None
    pm.save_pretrained(OUT)
    readme = os.path.join(OUT, "README.md")
    if os.path.exists(readme):
        os.remove(readme)  # PEFT's model-card template
    path = os.path.join(OUT, "adapter_config.json")
    with open(path) as fh:
        ac = json.load(fh)
    for key in ("target_modules", "target_parameters"):  # sets: sorted, so reruns give the same file
        ac[key] = sorted(ac[key])
    with open(path, "w") as fh:
        json.dump(ac, fh, indent=2, sort_keys=True)
        fh.write("\n")
    save_file(delta, os.path.join(OUT, "delta.safetensors"),
              metadata={"transformers": transformers.__version__, "peft": peft.__version__})
    print("wrote", OUT, "transformers", transformers.__version__, "peft", peft.__version__)


if __name__ == "__main__":
    main()
