#!/usr/bin/env python3
"""Plot a moetrain metrics JSONL: loss curves and the expert-load heatmap, to PNG.

Usage:
    python3 scripts/plot_metrics.py OUT/metrics.jsonl [--out DIR]

Writes DIR/loss.png (loss and cross-entropy, aux and z losses, learning rate, gradient norm;
skipped steps marked, eval losses as points) and, when the records carry per-layer expert
load, DIR/expert_load.png (the fraction of each layer's tokens that every expert got, over the
steps and at the last step: a collapsed router shows as one bright row per layer). DIR defaults
to the JSONL's folder.

Needs matplotlib, nothing else. On Debian or Ubuntu:
    apt-get install python3-matplotlib
(that serves /usr/bin/python3: run `/usr/bin/python3 scripts/plot_metrics.py ...` if another
python3 comes first on your PATH), or, in a virtual environment, `pip install matplotlib`. It draws with the Agg backend, so it
works without a display (over ssh, in CI).

Input: the records moetrain's trainer/metrics.c writes, one JSON object per line:
{"type":"step","step":N,...,"expert_load":[[...],...]} and events {"type":"eval",...}.
NaN or infinite values are written as null and are plotted as gaps. When a resumed run
appended to the same file, the last record of each step wins. A line that is not JSON (a
record cut short by a crash) is reported and skipped.
"""
import argparse
import json
import math
import os
import sys


def die(msg, code=1):
    print(f"plot_metrics.py: {msg}", file=sys.stderr)
    sys.exit(code)


def load_matplotlib():
    try:
        import matplotlib
    except ImportError:
        hint = ""
        if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") \
                and os.path.exists("/usr/bin/python3"):
            hint = (f" (this is {sys.executable}; Debian's package serves /usr/bin/python3, "
                    "so run the script with that)")
        die("matplotlib is not installed for this Python. Install it with "
            "`apt-get install python3-matplotlib` (Debian/Ubuntu) or `pip install matplotlib`, "
            f"then run this again{hint}.", 2)
    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt
    return plt


def num(x):
    """A JSON number, or NaN for null/missing/non-numbers."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return math.nan
    return float(x)


def read_jsonl(path):
    steps, events = {}, []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        die(f"{path}: cannot open: {e.strerror}")
    with f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"plot_metrics.py: {path}:{lineno}: not JSON ({e.msg}), skipped",
                      file=sys.stderr)
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("type") == "step" and isinstance(rec.get("step"), int):
                steps[rec["step"]] = rec  # last wins (resume overlap)
            else:
                events.append(rec)
    return [steps[s] for s in sorted(steps)], events


def plot_losses(plt, recs, events, path):
    x = [r["step"] for r in recs]
    fig, ax = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    a = ax[0][0]
    a.plot(x, [num(r.get("loss")) for r in recs], label="loss", lw=1.2)
    a.plot(x, [num(r.get("ce")) for r in recs], label="cross-entropy", lw=1.0, alpha=0.8)
    evals = [(e["step"], num(e.get("loss"))) for e in events
             if e.get("type") == "eval" and isinstance(e.get("step"), int)]
    if evals:
        a.plot([s for s, _ in evals], [v for _, v in evals], "o", label="eval loss")
    skipped = [r["step"] for r in recs if r.get("skipped") is True]
    for i, s in enumerate(skipped):
        a.axvline(s, color="red", alpha=0.3, lw=0.8, label="skipped step" if i == 0 else None)
    a.set_title("loss")
    a.legend()
    a = ax[0][1]
    a.plot(x, [num(r.get("aux")) for r in recs], label="router aux loss")
    a.plot(x, [num(r.get("z")) for r in recs], label="router z loss")
    a.set_title("auxiliary losses")
    a.legend()
    a = ax[1][0]
    a.plot(x, [num(r.get("lr")) for r in recs])
    a.set_title("learning rate")
    a.set_xlabel("step")
    a = ax[1][1]
    gn = [num(r.get("grad_norm")) for r in recs]
    a.plot(x, gn)
    if any(v > 0 for v in gn if not math.isnan(v)):
        a.set_yscale("log")
    a.set_title("gradient norm (before clipping)")
    a.set_xlabel("step")
    for row in ax:
        for a in row:
            a.grid(alpha=0.3)
    fig.suptitle(f"moetrain: {len(recs)} steps, {len(skipped)} skipped")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_expert_load(plt, recs, path):
    with_load = [r for r in recs if isinstance(r.get("expert_load"), list) and r["expert_load"]]
    if not with_load:
        return False
    layers = len(with_load[-1]["expert_load"])
    experts = max(len(row) for row in with_load[-1]["expert_load"])
    with_load = [r for r in with_load if len(r["expert_load"]) == layers]

    def grid(rec):  # layers × experts, NaN for null or missing
        return [[num(row[e]) if e < len(row) else math.nan for e in range(experts)]
                for row in rec["expert_load"]]

    # Over time: one row per (layer, expert), one column per step.
    cols = [grid(r) for r in with_load]
    over_time = [[c[l][e] for c in cols] for l in range(layers) for e in range(experts)]
    last = grid(with_load[-1])
    finite = [v for row in last for v in row if not math.isnan(v)]
    vmax = max([v for row in over_time for v in row if not math.isnan(v)] + [1e-9])

    fig, ax = plt.subplots(1, 2, figsize=(14, max(4.0, min(14.0, 0.06 * layers * experts + 2))),
                           gridspec_kw={"width_ratios": [3, 1]})
    steps = [r["step"] for r in with_load]
    im = ax[0].imshow(over_time, aspect="auto", interpolation="nearest", cmap="viridis",
                      vmin=0.0, vmax=vmax,
                      extent=(steps[0] - 0.5, steps[-1] + 0.5, layers * experts - 0.5, -0.5))
    ax[0].set_yticks([l * experts + (experts - 1) / 2 for l in range(layers)])
    ax[0].set_yticklabels([f"layer {l}" for l in range(layers)])
    for l in range(1, layers):
        ax[0].axhline(l * experts - 0.5, color="white", lw=0.5)
    ax[0].set_xlabel("step")
    ax[0].set_title(f"fraction of tokens per expert ({experts} experts per layer, rows)")
    fig.colorbar(im, ax=ax[0], fraction=0.03)
    im2 = ax[1].imshow(last, aspect="auto", interpolation="nearest", cmap="viridis",
                       vmin=0.0, vmax=vmax)
    if experts <= 32:
        ax[1].set_xticks(range(experts))
    if layers <= 64:
        ax[1].set_yticks(range(layers))
    ax[1].set_xlabel("expert")
    ax[1].set_ylabel("layer")
    ax[1].set_title(f"step {steps[-1]}")
    if layers * experts <= 256:
        for l in range(layers):
            for e in range(experts):
                v = last[l][e]
                if not math.isnan(v):
                    ax[1].text(e, l, f"{v:.2f}", ha="center", va="center", fontsize=7,
                               color="black" if v > 0.6 * vmax else "white")
    fig.colorbar(im2, ax=ax[1], fraction=0.05)
    top = max(finite) if finite else math.nan
    uniform = sum(finite) / len(finite) if finite else math.nan  # a balanced router's share
    fig.suptitle(f"expert load: largest share at the last step {top:.3f}, "
                 f"balanced share {uniform:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description="Plot a moetrain metrics JSONL to PNG.")
    ap.add_argument("jsonl", help="metrics file written by moetrain (metrics.jsonl)")
    ap.add_argument("--out", help="folder for the PNGs (default: the JSONL's folder)")
    args = ap.parse_args()
    plt = load_matplotlib()
    recs, events = read_jsonl(args.jsonl)
    if not recs:
        die(f"{args.jsonl}: no step records to plot")
    out = args.out or os.path.dirname(os.path.abspath(args.jsonl))
    os.makedirs(out, exist_ok=True)
    loss_png = os.path.join(out, "loss.png")
    plot_losses(plt, recs, events, loss_png)
    print(f"wrote {loss_png}")
    load_png = os.path.join(out, "expert_load.png")
    if plot_expert_load(plt, recs, load_png):
        print(f"wrote {load_png}")
    else:
        print("no expert_load in the records: no heatmap", file=sys.stderr)


if __name__ == "__main__":
    main()
