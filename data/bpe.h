// data/bpe.h — Hugging Face tokenizer.json, byte-level BPE (Qwen2/Qwen3-MoE, OLMoE), exact to
// the `tokenizers` library for the configurations below; anything else is refused at load with
// an error naming tokenizer.json and the field.
//
// Accepted tokenizer.json:
//   model         {"type": "BPE", vocab, merges} with merges as "a b" strings or ["a", "b"]
//                 pairs; dropout null, byte_fallback false, no continuing_subword_prefix or
//                 end_of_word_suffix; ignore_merges as given (true: a pre-token found whole
//                 in the vocabulary is one id, without merging).
//   normalizer    null or NFC (utf8proc).
//   pre_tokenizer ByteLevel (add_prefix_space false; use_regex true: GPT-2's pattern, as the
//                 GPT-NeoX tokenizer OLMoE uses writes it), or a Sequence of Split(Regex,
//                 behavior Isolated, invert false) steps ending in ByteLevel (add_prefix_space
//                 false, use_regex false), as Qwen2 writes it. Regexes run in PCRE2 with UTF and
//                 UCP (Unicode \p{L}, \p{N}; `(?!\S)` lookahead), \s read as \p{White_Space}, as
//                 Oniguruma runs them in `tokenizers` (PCRE2's own \s adds U+180E).
//   decoder       ByteLevel. post_processor null or ByteLevel (adds nothing: the data layer
//                 places BOS/EOS itself, data.h); TemplateProcessing is refused.
//   added_tokens  matched as whole strings in the raw text before normalization and
//                 pre-tokenization, leftmost-longest, as `tokenizers` does; lstrip, rstrip and
//                 single_word must be false. One pass for special and non-special tokens (the
//                 library matches non-special ones on the normalized text: the same for NFC-stable
//                 contents, which all real ones are).
// Input text must be valid UTF-8 (a Python str, all `tokenizers` can be given): else an error
// naming the byte offset.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_bpe mt_bpe;

// Reads and checks tokenizer.json. NULL with an error naming the path and the field.
mt_bpe *mt_bpe_load(const char *path);
void mt_bpe_free(mt_bpe *b);
// One past the largest id of the vocabulary and the added tokens.
int64_t mt_bpe_id_count(const mt_bpe *b);
// The id of an added token's content or a vocabulary entry; -1 when there is none.
int32_t mt_bpe_token_id(const mt_bpe *b, const char *token);
// 1 when id is an added token marked special (<|im_start|>, <|endoftext|>).
int mt_bpe_is_special(const mt_bpe *b, int32_t id);
// Appends the ids of text[0..len). 0, or -1 with an error.
int mt_bpe_encode(const mt_bpe *b, const char *text, size_t len, mt_ids *out);
// The same, appending at most `max` ids (the first of them); pieces past those are not merged.
int mt_bpe_encode_max(const mt_bpe *b, const char *text, size_t len, size_t max, mt_ids *out);
// The bytes of the longest token's string (an upper bound on the text one id stands for).
uint64_t mt_bpe_max_token_bytes(const mt_bpe *b);
// Text of ids[0..n) as `tokenizers` decodes it (skip_special_tokens=False): added tokens as
// their content, the rest through the byte-level table, invalid UTF-8 replaced by U+FFFD.
// Ids with no token are skipped. A malloc'ed NUL-terminated string and its length.
int mt_bpe_decode(const mt_bpe *b, const int32_t *ids, size_t n, char **text, size_t *len);
// The token string of an id (byte-level form, "Ġthe"), or NULL.
const char *mt_bpe_piece(const mt_bpe *b, int32_t id);

#ifdef __cplusplus
}
#endif
