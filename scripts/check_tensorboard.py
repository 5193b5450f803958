#!/usr/bin/env python3
"""scripts/check_tensorboard.py — reads a run's TensorBoard event files with TensorBoard's own
reader (tensorboard.backend.event_processing.event_accumulator) and checks every scalar against
the run's metrics.jsonl: the same tags, the same number of points, the same steps, and the same
last value (to float32, what an event stores).

usage: check_tensorboard.py OUT      (OUT: a --report-to tensorboard run's --out)
Prints one line per tag and "check_tensorboard: ok" / "check_tensorboard: FAILED"; exit 0 / 1.
"""
import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0] if x is not None and math.isfinite(x) else float("nan")


def expected(out):
    """tag -> [(step, value)] from metrics.jsonl, as trainer/metrics.c maps them."""
    want = {}
    keys = {"loss": "train/loss", "aux": "train/aux", "lr": "train/learning_rate",
            "grad_norm": "train/grad_norm", "tokens_per_s": "train/tokens_per_s"}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r["type"] == "step":
                for k, tag in keys.items():
                    want.setdefault(tag, []).append((r["step"], r[k]))
                for l, row in enumerate(r["expert_load"] or []):
                    for e, v in enumerate(row):
                        want.setdefault(f"expert_load/layer_{l}/expert_{e}", []).append((r["step"], v))
            elif r["type"] == "eval":
                want.setdefault("eval/loss", []).append((r["step"], r["loss"]))
    return want


def main():
    out = sys.argv[1]
    acc = event_accumulator.EventAccumulator(os.path.join(out, "runs"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    have_tags = set(acc.Tags()["scalars"])
    want = expected(out)
    ok = True
    if have_tags != set(want):
        print(f"tags differ: only in events {sorted(have_tags - set(want))[:5]}, only in metrics.jsonl "
              f"{sorted(set(want) - have_tags)[:5]}")
        ok = False
    for tag in sorted(set(want) & have_tags):
        got = acc.Scalars(tag)
        w = want[tag]
        steps_ok = [e.step for e in got] == [s for s, _ in w]
        a, b = got[-1].value, f32(w[-1][1])
        same = (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6 * max(1.0, abs(b))
        line_ok = len(got) == len(w) and steps_ok and same
        ok &= line_ok
        if not line_ok or tag.startswith(("train/", "eval/")) or tag.endswith("layer_0/expert_0"):
            print(f"  {tag:34s} points {len(got)} (metrics.jsonl {len(w)}), steps {'same' if steps_ok else 'DIFFER'}, "
                  f"last {a:.9g} (metrics.jsonl {w[-1][1]}){'' if line_ok else '  MISMATCH'}")
    print(f"{len(have_tags)} tags read back by TensorBoard {acc.__module__.split('.')[0]} from "
          f"{len(os.listdir(os.path.join(out, 'runs')))} event file(s)")
    print("check_tensorboard: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
