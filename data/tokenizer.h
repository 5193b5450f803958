// data/tokenizer.h — text ↔ token ids: Mixtral's SentencePiece tokenizer.model, or bytes.
//
// Selection (mt_tokenizer_open): a tokenizer.model in the model folder → SentencePiece; else
// the byte-level tokenizer when config.json's vocab_size ≥ 256; else an error.
//
// Encoding never adds BOS or EOS: the data layer (data.h) places them, as Mixtral/Llama
// training does (BOS at the start of each sample, EOS after each completion).
//
// Byte-level vocabulary (tiny models):
//   * ids 0..255 are the bytes of the UTF-8 text, one id per byte;
//   * BOS and EOS are config.json's bos_token_id / eos_token_id (1 and 2 for the tiny
//     configs), whatever the vocab size: the model's config and its tokenizer always agree;
//   * when such an id is below 256 it shadows a byte (1 = 0x01, 2 = 0x02): those control
//     bytes never occur in real text, and text containing one is refused by the encoder
//     (an error, never a silent BOS/EOS inside a sample); the pad id 0 (NUL) is likewise
//     refused, since a JSON string cannot carry it through the parser anyway;
//   * ids 256..vocab-1 other than BOS/EOS are unused (decode skips them).
// So vocab 256 means "bytes only, with two control bytes doubling as BOS/EOS".
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_TOKENIZER_BYTE, MT_TOKENIZER_SPM } mt_tokenizer_kind;

struct mt_spm;

typedef struct mt_tokenizer {
    mt_tokenizer_kind kind;
    int64_t vocab;        // the model's vocab_size; every id produced is below it
    int32_t bos, eos;     // config.json's ids (checked against tokenizer.model's when it has them)
    int32_t pad;          // the id written into padding: 0 (always masked out of loss and attention)
    struct mt_spm *spm;   // SentencePiece model, kind == MT_TOKENIZER_SPM
    char source[1024];    // "bytes" or the tokenizer.model path, for messages
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
void mt_tokenizer_free(mt_tokenizer *t);
// 1 when this build has the SentencePiece shim (MT_SENTENCEPIECE); 0: SentencePiece models
// are refused with a message saying so.
int mt_tokenizer_have_spm(void);

// Appends the ids of text[0..len) to `out` (no BOS/EOS). 0, or -1 with an error.
int mt_tokenizer_encode(const mt_tokenizer *t, const char *text, size_t len, mt_ids *out);
// Text of ids[0..n): BOS/EOS and unused ids are skipped. A malloc'ed NUL-terminated string
// (the caller frees it) and its length; -1 with an error for an id outside [0, vocab).
int mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, char **text,
                        size_t *len);
// The piece of one id, for logs and tests: SentencePiece's piece ("▁the", "<0x0A>"), or for
// bytes the character itself when printable ASCII, "<0xNN>" otherwise, "<s>"/"</s>" for
// BOS/EOS, "<unused>" for unused ids. -1 for an id outside [0, vocab).
int mt_tokenizer_piece(const mt_tokenizer *t, int32_t id, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
