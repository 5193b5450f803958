// data/tokenizer.h — text ↔ token ids: Mixtral's SentencePiece tokenizer.model, a Hugging Face
// byte-level BPE tokenizer.json (Qwen2/Qwen3-MoE, OLMoE; data/bpe.h), or bytes.
//
// Selection (mt_tokenizer_open): a tokenizer.model in the model folder → SentencePiece; else a
// tokenizer.json → byte-level BPE; else the byte-level tokenizer when config.json's vocab_size
// ≥ 256; else an error. transformers prefers tokenizer.json when both exist; we prefer
// tokenizer.model because the folders that ship both (Mixtral, Llama) ship a tokenizer.json that
// is a conversion of it (Metaspace, byte fallback), which the BPE reader refuses; both files
// describe the same tokenizer there.
//
// Encoding never adds BOS or EOS: the data layer (data.h) places them, as Mixtral/Llama
// training does (BOS at the start of each sample, EOS after each completion).
//
// tokenizer_config.json beside it (transformers' tokenizer settings): add_bos_token is honoured
// (true: a BPE tokenizer gets config.json's bos_token_id, which its vocabulary must hold; false: no
// BOS for SentencePiece either); add_eos_token needs nothing (the data layer ends every sample with
// EOS, as TRL's SFT does); clean_up_tokenization_spaces only changes decoding (generate's text);
// add_prefix_space and do_lower_case, which change encoding beyond tokenizer.json, are refused when
// true, naming the file and the field.
//
// BOS: `add_bos` 0 means the data layer inserts none. Without tokenizer_config.json's word, BPE
// tokenizers have bos = -1: Qwen2's and OLMoE's tokenizers add no BOS (their post_processor is
// ByteLevel; one with a TemplateProcessing is refused), whatever config.json's bos_token_id says
// (Qwen's names <|endoftext|>; OLMoE's is null). Chat templates that print a bos_token string
// (OLMoE's) emit it as text, which the BPE encoder turns into its added-token id.
//
// Byte-level vocabulary (tiny models):
//   * ids 0..255 are the bytes of the UTF-8 text, one id per byte;
//   * BOS and EOS are config.json's bos_token_id / eos_token_id (1 and 2 for the tiny
//     configs), whatever the vocab size: the model's config and its tokenizer always agree;
//   * when such an id is below 256 it shadows a byte (1 = 0x01, 2 = 0x02): those control
//     bytes never occur in real text, and text containing one is refused by the encoder
//     (an error, never a silent BOS/EOS inside a sample); the pad id 0 (NUL) is likewise
//     refused, since a JSON string cannot carry it through the parser anyway;
//   * ids 256..vocab-1 other than BOS/EOS are unused (decode skips them);
//   * no bos_token_id (null, as OLMoE's): no BOS, samples start with their text.
// So vocab 256 means "bytes only, with two control bytes doubling as BOS/EOS"; the shipped tiny
// non-Mixtral configs use 256 + specials (BOS 256, EOS 257, pad 258) instead.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_TOKENIZER_BYTE, MT_TOKENIZER_SPM, MT_TOKENIZER_BPE } mt_tokenizer_kind;

struct mt_spm;
struct mt_bpe;

typedef struct mt_tokenizer {
    mt_tokenizer_kind kind;
    int64_t vocab;        // the model's vocab_size; every id produced is below it
    int32_t bos, eos;     // config.json's ids (checked against tokenizer.model's when it has them);
                          // bos -1: none (BPE unless tokenizer_config.json adds one)
    int add_bos;          // 1: the data layer starts each sample with bos (SentencePiece and bytes;
                          // tokenizer_config.json's add_bos_token overrides, as transformers does)
    int32_t pad;          // the id written into padding: 0 (always masked out of loss and attention)
    struct mt_spm *spm;   // SentencePiece model, kind == MT_TOKENIZER_SPM
    struct mt_bpe *bpe;   // tokenizer.json, kind == MT_TOKENIZER_BPE
    char source[1024];    // "bytes" or the tokenizer.model / tokenizer.json path, for messages
} mt_tokenizer;

// A growable array of ids.
typedef struct mt_ids {
    int32_t *v;
    size_t n, cap;
} mt_ids;

void mt_ids_push(mt_ids *a, int32_t id);
void mt_ids_free(mt_ids *a);

// Picks the tokenizer for a model folder (see the top of this file). `vocab`, `bos`, `eos`
// come from the model's config.json. 0, or -1 with an error naming the folder.
int mt_tokenizer_open(mt_tokenizer *t, const char *model_dir, int64_t vocab, int32_t bos,
                      int32_t eos);
// The byte-level tokenizer; vocab ≥ 256 and bos, eos in [0, vocab), distinct.
int mt_tokenizer_init_bytes(mt_tokenizer *t, int64_t vocab, int32_t bos, int32_t eos);
// A SentencePiece tokenizer.model. Its piece count must not exceed `vocab` (a model may pad
// its embedding past the tokenizer, never the other way), and its own BOS/EOS ids, where it
// defines them, must equal config.json's.
int mt_tokenizer_load_spm(mt_tokenizer *t, const char *model_path, int64_t vocab, int32_t bos,
                          int32_t eos);
// A byte-level BPE tokenizer.json (data/bpe.h). Its ids must lie below `vocab` (Qwen pads its
// embedding past the tokenizer); eos must name a token. bos is ignored: BPE has none (above).
int mt_tokenizer_load_bpe(mt_tokenizer *t, const char *json_path, int64_t vocab, int32_t eos);
void mt_tokenizer_free(mt_tokenizer *t);
// 1 when this build has the SentencePiece shim (MT_SENTENCEPIECE); 0: SentencePiece models
// are refused with a message saying so.
int mt_tokenizer_have_spm(void);

// Appends the ids of text[0..len) to `out` (no BOS/EOS). 0, or -1 with an error.
int mt_tokenizer_encode(const mt_tokenizer *t, const char *text, size_t len, mt_ids *out);
// The same, appending at most `max` ids: the first `max` of what mt_tokenizer_encode gives. The
// whole text is still checked (UTF-8, reserved bytes), but encoding stops once `max` ids are
// out, so the work and memory past them do not grow with the text (BPE: the pre-tokenizer's
// pieces after the one that fills `max` are not merged; SentencePiece encodes the whole text).
int mt_tokenizer_encode_max(const mt_tokenizer *t, const char *text, size_t len, size_t max,
                            mt_ids *out);
// The most bytes of text one id stands for (1 for bytes; BPE: its longest token; SentencePiece:
// 64, an assumed bound: its pieces are at most 16 characters).
uint64_t mt_tokenizer_max_token_bytes(const mt_tokenizer *t);
// Text of ids[0..n): BOS/EOS and unused ids are skipped. A malloc'ed NUL-terminated string
// (the caller frees it) and its length; -1 with an error for an id outside [0, vocab).
int mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, char **text,
                        size_t *len);
// The piece of one id, for logs and tests: SentencePiece's piece ("▁the", "<0x0A>"), BPE's
// token ("Ġthe", "<|im_start|>"), or for
// bytes the character itself when printable ASCII, "<0xNN>" otherwise, "<s>"/"</s>" for
// BOS/EOS, "<unused>" for unused ids. -1 for an id outside [0, vocab).
int mt_tokenizer_piece(const mt_tokenizer *t, int32_t id, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
