#!/usr/bin/env python3
"""Long runs of one character class through `tokenizers` (issue 32): tests/data/bpe/runs/expected.json.

The texts are 10 MB runs (spaces, newlines and spaces, digits, one letter, a word repeated without
a space), each between a word before and after, built from a short spec so that only the spec and
the ids are committed. The ids are written compactly: a list of [pattern, repeat] segments (the
ids are `pattern` repeated `repeat` times, in order), found by looking for the shortest period
at each position.

  {"magic": "mt-bpe-runs", "version": 1, "tokenizers_version",
   "cases": [{"tokenizer": "qwen2" | "olmoe" | "gpt2im", "name",
              "text": [[piece, repeat], ...],       the text: each piece repeated, concatenated
              "ids": [[[id, ...], repeat], ...]}]}  encode(text, add_special_tokens=False)
   or, where `tokenizers` itself fails on the text, "tokenizers_error" (its message) instead of
   "ids": tokenizers 0.23.3 gives up ("retry-limit-in-match over") on Qwen2's pattern over 10 MB
   of spaces; it handles 3 MB ("spaces3m").

Run:  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
      /tmp/tokvenv/bin/python scripts/make_bpe_run_fixtures.py
The C test (tests/test_bpe_runs.c) rebuilds each text and compares mt_bpe_encode's ids.
"""
import array
import json
import os

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MB10 = 10_000_000
SPECS = [
    ("spaces", [["word", 1], [" ", MB10], ["end", 1]]),
    ("spaces3m", [["word", 1], [" ", 3_000_000], ["end", 1]]),
    ("newlines", [["word", 1], ["  \n", MB10 // 3], ["end", 1]]),
    ("digits", [["n ", 1], ["0123456789", MB10 // 10], [" x", 1]]),
    ("letter", [["1 ", 1], ["a", MB10], [" 2", 1]]),
    ("word", [["1 ", 1], ["thequickbrownfox", MB10 // 16], [" 2", 1]]),
]


def periodic_len(mv, n, i, p):
    """The largest L with ids[i:i+L] == ids[i+p:i+p+L] (mv: the ids as a memoryview of int32)."""
    lo, hi = 0, n - i - p
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mv[i:i + mid] == mv[i + p:i + p + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def compact(ids):
    mv = memoryview(array.array("i", ids))
    out, lit, i, n = [], [], 0, len(ids)
    while i < n:
        best = None
        for p in range(1, 65):
            if i + 2 * p > n:
                break
            if mv[i:i + p] != mv[i + p:i + 2 * p]:
                continue
            reps = (periodic_len(mv, n, i, p) + p) // p
            if reps * p >= 64:
                best = (p, reps)
                break
        if best:
            if lit:
                out.append([lit, 1])
                lit = []
            p, reps = best
            out.append([list(ids[i:i + p]), reps])
            i += p * reps
        else:
            lit.append(ids[i])
            i += 1
    if lit:
        out.append([lit, 1])
    return out


def main():
    cases = []
    for tok_name in ("qwen2", "olmoe", "gpt2im"):
        tok = Tokenizer.from_file(os.path.join(ROOT, "tests/data/bpe", tok_name, "tokenizer.json"))
        for name, spec in SPECS:
            text = "".join(piece * rep for piece, rep in spec)
            try:
                ids = tok.encode(text, add_special_tokens=False).ids
            except BaseException as e:  # tokenizers 0.23's Oniguruma gives up on some 10 MB runs
                cases.append({"tokenizer": tok_name, "name": name, "text": spec,
                              "tokenizers_error": str(e)})
                print(tok_name, name, "tokenizers failed:", e, flush=True)
                continue
            segs = compact(ids)
            assert sum(len(p) * r for p, r in segs) == len(ids)
            cases.append({"tokenizer": tok_name, "name": name, "text": spec, "ids": segs})
            print(tok_name, name, len(text), "bytes ->", len(ids), "ids,", len(segs), "segments", flush=True)
    with open(os.path.join(ROOT, "tests/data/bpe/runs/expected.json"), "w") as f:
        json.dump({"magic": "mt-bpe-runs", "version": 1, "tokenizers_version": tokenizers.__version__,
                   "cases": cases}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
