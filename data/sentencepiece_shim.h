// data/sentencepiece_shim.h — a C view of libsentencepiece (sentencepiece_shim.cc, C++).
//
// Only what the tokenizer needs: load a tokenizer.model, encode text to ids (no BOS/EOS: the
// data layer adds them), decode ids to text, look pieces up, and train a model (tests build a
// tiny tokenizer.model at run time this way; no model file is shipped or downloaded).
// Every function that can fail returns -1 (or NULL) with a message set by mt_error_set().
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_spm mt_spm;

// Loads a serialized SentencePiece ModelProto (Mixtral's tokenizer.model). NULL on failure.
mt_spm *mt_spm_load(const char *path);
void mt_spm_free(mt_spm *s);

int mt_spm_piece_count(const mt_spm *s);
// Reserved ids of the model, -1 where the model defines none.
int mt_spm_bos_id(const mt_spm *s);
int mt_spm_eos_id(const mt_spm *s);
int mt_spm_unk_id(const mt_spm *s);
int mt_spm_pad_id(const mt_spm *s);

// Encodes text[0..len) (UTF-8) into a malloc'ed array of ids the caller frees; *n its length.
int mt_spm_encode(const mt_spm *s, const char *text, size_t len, int32_t **ids, size_t *n);
// Decodes ids into a malloc'ed NUL-terminated string; *len its length without the NUL.
// Control ids (<s>, </s>) decode to nothing, as in SentencePiece.
int mt_spm_decode(const mt_spm *s, const int32_t *ids, size_t n, char **text, size_t *len);
// The piece of `id` ("▁the", "<0x0A>", "<s>"): a string owned by the model, or NULL when id is
// out of range.
const char *mt_spm_id_to_piece(const mt_spm *s, int id);
// The id of `piece`, or the unknown id when the model has no such piece.
int mt_spm_piece_to_id(const mt_spm *s, const char *piece);

// SentencePieceTrainer::Train with spm_train's flags ("--input=a.txt --model_prefix=m
// --vocab_size=400 --model_type=bpe"); writes <model_prefix>.model. Quiet unless it fails.
int mt_spm_train(const char *args);

#ifdef __cplusplus
}
#endif
