#!/usr/bin/env python3
"""gpt-oss fixtures (issue 29): the harmony chat template and an o200k-style byte-level BPE.

Writes tests/data/harmony/:
  chat_template.jinja  gpt-oss-120b's template, as llama.cpp keeps it
                       (models/templates/openai-gpt-oss-120b.jinja, LF line ends); committed by
                       hand, read here
  tokenizer.json       a small byte-level BPE trained here with gpt-oss's o200k_harmony layout:
                       no normalizer; Sequence[Split(o200k's regex, Isolated),
                       ByteLevel(use_regex=False)]; ByteLevel decoder; the harmony special tokens
                       after the vocabulary
  expected.json        {"magic": "mt-harmony-fixture", "version": 1, library versions, "date",
                        "chat_template",
                        "encode": [{"text", "ids", "decoded"}],   encode(text, add_special_tokens
                                                                  =False), decode(ids)
                        "chat": [{"name", "messages", "add_generation_prompt", "text", "ids"}]}
                       text = transformers' apply_chat_template(tokenize=False) with strftime_now
                       pinned to DATE (the template prints "Current date: " + today), ids =
                       encode(text)

Run:  /work/.venv-t5cfg/bin/python scripts/make_harmony_fixtures.py   (transformers 5, jinja2)
Nothing is downloaded. The C tests (tests/test_harmony.c) read the committed files.
"""
import datetime
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tokenizers
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "harmony")
DATE = "2025-08-05"  # the date every fixture renders ("Current date: ...")

# tiktoken's o200k pattern, the one gpt-oss's tokenizer.json splits with.
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# gpt-oss's special tokens in id order (o200k_harmony: 199998 on); here they follow the small
# vocabulary in the same order.
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
            "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
            "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>",
            "<|reserved_200013|>", "<|reserved_200014|>", "<|reserved_200015|>", "<|reserved_200016|>",
            "<|reserved_200017|>", "<|endofprompt|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's what they've said, and we'll see what I'd do.",
    "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n",
    "Reasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included.",
    "def forward(self, x):\n    return self.w2(F.silu(self.w1(x)) * self.w3(x))\n\n",
    "Numbers: 12345 67890 3.14159 2026-11-24 1,000,000 and 0x7FFF; path/to/file.txt",
    "Le café est très bon à Paris; l'été dernier, nous étions là-bas. Œuvre, naïve.",
    "Привет, как дела? Это тест токенизатора.",
    "你好，世界！这是一个分词器的测试。机器学习很有趣。日本語のテキスト。",
    "Emoji: 😀 🚀 👍🏽 ❤️ 🇫🇷 and symbols © ® ™ … — –",
    "Whitespace   runs\t\ttabs\n\n\nnewlines  \n  mixed \r\n windows lines",
    "SHOUTING IN CAPS, MiXeD cAsE, it'S tHe 'LL 'VE contractions. CamelCaseWords HTTPServer.",
]

TEXTS = [
    "Hello world",
    "It's what they've said; we'll see, I'm sure you'd agree. IT'S THEY'VE We'LL",
    "don'T CAN'T i'M You'Re HE'D",
    "CamelCaseWords HTTPServer getHTTPResponse iPhone McDonald's",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\t\tmore\ttabs",
    "line one\nline two\n\n\nline five\r\nwindows\r\n",
    "   \n\n   \n",
    "digits 1234567890 and 3.14159 and 1,000,000 and 12 123 1234",
    "Ⅻ ½ ١٢٣٤ ５６７",
    "path/to/file.txt a//b /// ?!/\n",
    "code: if (x != y) { return a->b[0] + 'c'; }\n    for i in range(10):\n\tpass",
    "Café crème brûlée, naïve façade, e\u0301 combining",
    "Привет мир",
    "你好，世界！机器学习",
    "日本語のテキスト",
    "مرحبا بالعالم",
    "emoji 😀🚀 👍🏽 ❤️ 🇫🇷 👨‍👩‍👧",
    "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Yo<|return|>",
    "almost special <|start and <|end|",
    "unicode spaces:\u00a0nbsp\u3000ideographic\u2028line sep\u2009thin",
    "x", " ", "",
    "the the the the the the",
]

SYSTEM = "You are a terse assistant."
CHATS = [
    ("user_assistant", [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}]),
    ("system_first", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a color."},
                      {"role": "assistant", "content": "Blue."}]),
    ("developer_first", [{"role": "developer", "content": "Answer in French.\nBe brief."},
                         {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Bonjour."}]),
    ("thinking_last", [{"role": "user", "content": "Is 17 prime?"},
                       {"role": "assistant", "thinking": "17 has no divisor between 2 and 4.", "content": "Yes."}]),
    ("thinking_dropped_before", [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "First?"}, {"role": "assistant", "thinking": "Easy one.", "content": "One."},
        {"role": "user", "content": "Second?"}, {"role": "assistant", "thinking": "Count on.", "content": "Two."}]),
    ("multi_turn_no_thinking", [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"}, {"role": "assistant", "content": "f"}]),
    ("unicode", [{"role": "developer", "content": "Réponds en 日本語 😀"},
                 {"role": "user", "content": "Héllo, 世界 😀\n\ttab"},
                 {"role": "assistant", "thinking": "Привет… 👍🏽", "content": "こんにちは！\nLigne deux."}]),
    ("empty_thinking", [{"role": "user", "content": "Hi"}, {"role": "assistant", "thinking": "", "content": "Hey."}]),
    ("empty_content", [{"role": "user", "content": ""}, {"role": "assistant", "thinking": "Nothing asked.",
                                                         "content": ""}]),
    ("empty_system", [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hey."}]),
    ("reasoning_content_alias", [{"role": "user", "content": "Why?"},
                                 {"role": "assistant", "reasoning_content": "Because.", "content": "So."}]),
    ("whitespace", [{"role": "user", "content": "  spaced  \n\n"},
                    {"role": "assistant", "thinking": "\n think \n", "content": " answer \n"}]),
    # Generation prompts: the conversation ends on a user turn.
    ("prompt_only", [{"role": "user", "content": "Tell me a joke."}]),
    ("prompt_after_history", [{"role": "developer", "content": "Be kind."}, {"role": "user", "content": "Hi"},
                              {"role": "assistant", "thinking": "Greet.", "content": "Hello!"},
                              {"role": "user", "content": "Bye"}]),
]


def corpus():
    for _ in range(3):
        yield from CORPUS


def train():
    tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + 500, initial_alphabet=alphabet,
                                  show_progress=False, min_frequency=1)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def render(fast, template, messages, gen):
    # The template prints strftime_now("%Y-%m-%d"): pin "now" so the fixtures do not age.
    import transformers.utils.chat_template_utils as ctu

    class Pinned(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime.strptime(DATE, "%Y-%m-%d")

    saved = ctu.datetime
    ctu.datetime = Pinned
    ctu._compile_jinja_template.cache_clear()
    try:
        return fast.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=gen)
    finally:
        ctu.datetime = saved
        ctu._compile_jinja_template.cache_clear()


def main():
    if not transformers.__version__.startswith("5."):
        sys.exit(f"transformers {transformers.__version__}: expected 5.x")
    with open(os.path.join(OUT, "chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    tok = train()
    path = os.path.join(OUT, "tokenizer.json")
    tok.save(path)
    tok = Tokenizer.from_file(path)  # the expectations come from the file as committed
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|return|>")
    enc = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        enc.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    chat = []
    for name, msgs in CHATS:
        gen = msgs[-1]["role"] == "user"
        text = render(fast, template, msgs, gen)
        if DATE not in text:
            sys.exit(f"{name}: the pinned date is not in the rendering")
        chat.append({"name": name, "messages": msgs, "add_generation_prompt": gen, "text": text,
                     "ids": tok.encode(text, add_special_tokens=False).ids})
        enc.append({"text": text, "ids": chat[-1]["ids"], "decoded": tok.decode(chat[-1]["ids"], skip_special_tokens=False)})
    out = {"magic": "mt-harmony-fixture", "version": 1, "tokenizers": tokenizers.__version__,
           "transformers": transformers.__version__, "date": DATE, "chat_template": template,
           "encode": enc, "chat": chat}
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"harmony: vocab {tok.get_vocab_size()}, {len(enc)} texts, {len(chat)} conversations")


if __name__ == "__main__":
    main()
