#!/usr/bin/env python3
"""Byte-level BPE and chat-template fixtures (issue 16), made with `tokenizers` and transformers.

Trains small BPE tokenizers (a few hundred merges on the corpus below) configured as the real
families' tokenizer.json files are, and writes tests/data/bpe/<name>/:
  tokenizer.json    as `tokenizers` saves it (olmoe: merges rewritten as "a b" strings, the older
                    format; the file is re-read by `tokenizers` and the expectations come from it)
  expected.json     {"magic": "mt-bpe-fixture", "version": 1, library versions,
                     "encode": [{"text", "ids", "decoded"}],   ids = encode(text, add_special_tokens
                                                               =False), decoded = decode(ids)
                     "decode": [{"ids", "text"}],              ids that cut UTF-8 characters
                     "invalid_utf8_hex": [...],               byte strings Python refuses to decode
                     "chat": [{"template", "bos_token", "eos_token", "messages",
                               "add_generation_prompt", "text", "ids"}]}
                     text = transformers' apply_chat_template(tokenize=False), ids = encode(text)

Families:
  qwen2   Qwen2's layout: NFC normalizer; Sequence[Split(Qwen2's regex, Isolated), ByteLevel(
          use_regex=False)]; ByteLevel decoder; special tokens <|endoftext|> <|im_start|> <|im_end|>
          after the vocabulary; a non-special added token <tool_call>; merges as [a, b] pairs.
  olmoe   GPT-NeoX's layout (OLMoE's tokenizer): NFC; ByteLevel(add_prefix_space=False,
          use_regex=True); ByteLevel decoder; <|endoftext|> <|padding|> special, a non-special
          whitespace token; merges as "a b" strings.
  gpt2im  ByteLevel(use_regex=True), no normalizer, ignore_merges=True (the null-normalizer and
          ignore_merges paths).

Run:  /work/.venv-t4/bin/python scripts/make_bpe_fixtures.py   (tokenizers 0.22, transformers 4.57)
Nothing is downloaded. The C tests (tests/test_bpe.c) read the committed files.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tokenizers
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import AddedToken

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "bpe")

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's what they've said, and we'll see what I'd do.",
    "Mixture-of-Experts models route each token to a few experts; the router's top-k picks them.",
    "def forward(self, x):\n    return self.w2(F.silu(self.w1(x)) * self.w3(x))\n\n",
    "Numbers: 12345 67890 3.14159 2026-11-24 1,000,000 and 0x7FFF.",
    "Le café est très bon à Paris; l'été dernier, nous étions là-bas. Œuvre, naïve, façade.",
    "Die Straße ist schön, und die Bäume grünen. Über alle Gipfel ist Ruh.",
    "Привет, как дела? Это тест токенизатора на русском языке.",
    "你好，世界！这是一个分词器的测试。机器学习很有趣。",
    "日本語のテキストも少し入れます。カタカナとひらがな。",
    "مرحبا بالعالم، هذا اختبار.",
    "Emoji: 😀 🚀 👍🏽 ❤️ 🇫🇷 and symbols © ® ™ … — –",
    "Whitespace   runs\t\ttabs\n\n\nnewlines  \n  mixed \r\n windows lines",
    "SHOUTING IN CAPS, MiXeD cAsE, it'S tHe 'LL 'VE contractions.",
]


def corpus():
    for _ in range(3):
        yield from CORPUS


TRICKY = [
    "Hello world",
    "It's what they've said; we'll see, I'm sure you'd agree. IT'S THEY'VE",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\t\tmore\ttabs",
    "line one\nline two\n\n\nline five\r\nwindows\r\n",
    "   \n\n   \n",
    "digits 1234567890 and 3.14159 and 1,000,000",
    "Café crème brûlée, naïve façade",
    "Cafe\u0301 with a combining accent (NFC composes it)",
    "Ångström and A\u030angström",
    "Привет мир",
    "你好，世界！机器学习",
    "日本語のテキスト",
    "مرحبا بالعالم",
    "emoji 😀🚀 👍🏽 ❤️ 🇫🇷 👨‍👩‍👧",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    "text<|endoftext|>more text<|endoftext|>",
    "<|im_start|><|im_end|><|endoftext|>",
    "a <tool_call> b<tool_call>c",
    "almost special <|im_start and <|endoftext",
    "code: if (x != y) { return a->b[0] + 'c'; }",
    "unicode spaces:\u00a0nbsp\u3000ideographic\u2028line sep\u2009thin",
    "x",
    " ",
    "",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "the the the the the the",
    "MiXeD cAsE WoRdS",
    "padding<|padding|>here and   three spaces",
]

# Random strings over a pool that mixes the classes the regexes tell apart, with the whitespace
# characters where regex engines may disagree (U+0085, U+180E, U+2028, U+00A0, U+3000).
POOL = (list("abcXYZ019 _-.,;'!?()<>|/\\\"") + [" ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "'ve", "<|", "|>",
        "<|im_end|>", "<|endoftext|>", "<tool_call>", "é", "e\u0301", "Å", "ß", "世界", "テ", "Ж", "ا", "😀", "👍🏽",
        "\u200d", "\u00a0", "\u3000", "\u0085", "\u180e", "\u2028", "\u2009", "١٢", "Ⅻ", "½", "\u0300"])


def random_strings(n, seed):
    import random
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 24))) for _ in range(n)]


INVALID_UTF8 = [b"abc\xff", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok \xc0\xaf"]

CHAT_MESSAGES = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Red, then green."}],
    [{"role": "user", "content": "Héllo, 世界 😀"}, {"role": "assistant", "content": "Bonjour !\nLigne deux."}],
]

TEMPLATES = {
    # transformers' generic ChatML (no default system message).
    "chatml": ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
               " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    # Qwen1.5-*-Chat / Qwen1.5-MoE-A2.7B-Chat: ChatML with a default system message.
    "qwen": ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
             "{{ '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}"
             "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    # Qwen2-*-Instruct (Qwen2-57B-A14B-Instruct): the same with a full stop.
    "qwen2": ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
              "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
              "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    # OLMoE-1B-7B-0924-Instruct: the Tulu template (reconstructed, see data/chat_template.c).
    "tulu": ("{{ bos_token }}{% for message in messages %}\n{% if message['role'] == 'system' %}\n"
             "{{ '<|system|>\\n' + message['content'] }}\n{% elif message['role'] == 'user' %}\n"
             "{{ '<|user|>\\n' + message['content'] }}\n{% elif message['role'] == 'assistant' %}\n"
             "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
             "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
             "{% endfor %}"),
}
# AI2's OLMo template: Tulu's opening with eos_token (so quoted in public OLMo/OLMoE code).
TEMPLATES["olmo"] = TEMPLATES["tulu"].replace("{{ bos_token }}", "{{ eos_token }}", 1)


def train(pre, norm, specials, added, ignore_merges=False, merges=400):
    tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=ignore_merges))
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + merges, initial_alphabet=alphabet,
                                  show_progress=False, min_frequency=1)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if added:
        tok.add_tokens(added)
    return tok


def expectations(tok, chat_specs):
    enc = []
    for text in TRICKY + random_strings(60, 16):
        ids = tok.encode(text, add_special_tokens=False).ids
        enc.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    # Id runs that cut multi-byte characters: the decoder replaces what is left with U+FFFD.
    dec = []
    for text in ["😀", "é", "世界", "a😀b"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        for cut in ([ids[:-1]] if len(ids) > 1 else []) + [ids[1:]] + [ids + ids[:1]]:
            dec.append({"ids": cut, "text": tok.decode(cut, skip_special_tokens=False)})
    # Single byte-level tokens of a 4-byte emoji's bytes, in pieces and reordered.
    raw = "😀".encode()
    byte_ids = [tok.token_to_id(bytes_to_unicode()[x]) for x in raw]
    for cut in (byte_ids[:2], byte_ids[1:], byte_ids[::-1], byte_ids[:3] + byte_ids):
        dec.append({"ids": cut, "text": tok.decode(cut, skip_special_tokens=False)})
    for s in INVALID_UTF8:
        try:
            s.decode("utf-8")
            raise SystemExit(f"{s!r} is valid UTF-8: not a refusal case")
        except UnicodeDecodeError:
            pass
    chat = []
    for name, bos, eos in chat_specs:
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
        fast.chat_template = TEMPLATES[name]
        for msgs in CHAT_MESSAGES:
            for gen in (False, True):
                m = msgs if not gen else msgs[:-1]
                text = fast.apply_chat_template(m, tokenize=False, add_generation_prompt=gen)
                chat.append({"template": name, "chat_template": TEMPLATES[name], "bos_token": bos,
                             "eos_token": eos, "messages": m, "add_generation_prompt": gen,
                             "text": text, "ids": tok.encode(text, add_special_tokens=False).ids})
    return {"magic": "mt-bpe-fixture", "version": 1, "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__, "encode": enc, "decode": dec,
            "invalid_utf8_hex": [s.hex() for s in INVALID_UTF8], "chat": chat}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write(name, tok, strings_merges, chat_specs):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    if strings_merges:
        with open(path) as f:
            j = json.load(f)
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
        with open(path, "w") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
    tok = Tokenizer.from_file(path)  # the expectations come from the file as committed
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expectations(tok, chat_specs), f, ensure_ascii=False, separators=(",", ":"))
    print(f"{name}: vocab {tok.get_vocab_size()}, {os.path.getsize(path)} bytes")


def main():
    if not tokenizers.__version__.startswith("0.2"):
        sys.exit(f"tokenizers {tokenizers.__version__}: expected 0.2x")
    qwen_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    qwen = train(qwen_pre, normalizers.NFC(), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                 [AddedToken("<tool_call>", special=False, normalized=False)])
    write("qwen2", qwen, False, [("chatml", None, "<|im_end|>"), ("qwen", None, "<|im_end|>"),
                                   ("qwen2", None, "<|im_end|>")])
    neox_pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    olmoe = train(neox_pre, normalizers.NFC(), ["<|endoftext|>", "<|padding|>"],
                  [AddedToken("   ", special=False, normalized=True)])
    write("olmoe", olmoe, True, [("tulu", "<|endoftext|>", "<|endoftext|>"),
                                 ("olmo", "<|padding|>", "<|endoftext|>")])  # bos ≠ eos: which one opens
    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), None,
                 ["<|endoftext|>"], [], ignore_merges=True, merges=300)
    write("gpt2im", gpt2, False, [])


if __name__ == "__main__":
    main()
