#!/usr/bin/env python3
"""make_tokens.py — write a moetrain token file (MTTOK1, README "Token files") from JSONL text.

    python scripts/make_tokens.py --tokenizer DIR_OR_HUB_ID --in data.jsonl --out data.tok [--mask]
    python scripts/make_tokens.py --bytes --bos 1 --eos 2 --in data.jsonl --out data.tok

Each JSONL line {"text": ...} becomes one sample <bos> ids </bos... eos>: the ids of a Hugging Face
tokenizer (AutoTokenizer, encoded without special tokens; BOS/EOS from the tokenizer) or, with
--bytes, the UTF-8 bytes (moetrain's byte-level tokenizer for tiny models). Lines
{"prompt": ..., "completion": ...} become prompt+completion with the loss mask on the
completion and its EOS only (written with --mask, which such lines need). Needs `transformers`
only without --bytes.

Layout (little-endian): "MTTOK1", u16 flags (bit 0: a mask follows each sample), u64 samples,
then per sample u32 length L, int32 ids[L] and with bit 0 u8 mask[L] (1 = in the loss).
"""
import argparse
import json
import os
import struct
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in", dest="inp", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", help="a tokenizer folder (or Hub id) for AutoTokenizer")
    ap.add_argument("--bytes", action="store_true", help="byte-level ids (vocab >= 256)")
    ap.add_argument("--bos", type=int, default=1)
    ap.add_argument("--eos", type=int, default=2)
    ap.add_argument("--mask", action="store_true", help="write loss masks (needed for prompt/completion lines)")
    a = ap.parse_args()
    if bool(a.tokenizer) == a.bytes:
        sys.exit("make_tokens: give exactly one of --tokenizer and --bytes")
    if a.bytes:
        encode, bos, eos = (lambda s: list(s.encode("utf-8"))), a.bos, a.eos
    else:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(a.tokenizer)
        encode, bos, eos = (lambda s: tok.encode(s, add_special_tokens=False)), tok.bos_token_id, tok.eos_token_id

    samples = []
    with open(a.inp, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            doc = json.loads(line)
            if "text" in doc:
                ids = [bos] + encode(doc["text"]) + [eos]
                mask = [1] * len(ids)
            elif "prompt" in doc and "completion" in doc:
                if not a.mask:
                    sys.exit("%s:%d: prompt/completion lines need --mask" % (a.inp, lineno))
                p, c = [bos] + encode(doc["prompt"]), encode(doc["completion"]) + [eos]
                ids, mask = p + c, [0] * len(p) + [1] * len(c)
            else:
                sys.exit("%s:%d: expected {\"text\"} or {\"prompt\", \"completion\"}" % (a.inp, lineno))
            samples.append((ids, mask))
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:  # written to a temporary name, then renamed
        f.write(b"MTTOK1" + struct.pack("<HQ", 1 if a.mask else 0, len(samples)))
        for ids, mask in samples:
            f.write(struct.pack("<I%di" % len(ids), len(ids), *ids))
            if a.mask:
                f.write(bytes(mask))
    os.replace(tmp, a.out)
    print("make_tokens: wrote %s: %d samples, %d tokens" % (a.out, len(samples), sum(len(s) for s, _ in samples)))


if __name__ == "__main__":
    main()
