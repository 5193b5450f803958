// data/tokenizer.c — byte-level, SentencePiece and BPE tokenizers behind one interface.
#include "data/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "data/bpe.h"
#ifdef MT_SENTENCEPIECE
#include "data/sentencepiece_shim.h"
#endif

void mt_ids_push(mt_ids *a, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 256;
        a->v = mt_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = id;
}

void mt_ids_free(mt_ids *a) {
    free(a->v);
    *a = (mt_ids){0};
}

int mt_tokenizer_have_spm(void) {
#ifdef MT_SENTENCEPIECE
    return 1;
#else
    return 0;
#endif
}

static int check_ids(int64_t vocab, int32_t bos, int32_t eos, const char *what) {
    if (vocab <= 0 || vocab > INT32_MAX) {
        mt_error_set("%s: vocab_size %lld is not a usable vocabulary size", what, (long long)vocab);
        return -1;
    }
    if (bos < 0 || bos >= vocab || eos < 0 || eos >= vocab || bos == eos) {
        mt_error_set("%s: bos_token_id %d and eos_token_id %d must be distinct ids below "
                     "vocab_size %lld", what, (int)bos, (int)eos, (long long)vocab);
        return -1;
    }
    return 0;
}

int mt_tokenizer_init_bytes(mt_tokenizer *t, int64_t vocab, int32_t bos, int32_t eos) {
    memset(t, 0, sizeof *t);
    if (vocab < 256) {
        mt_error_set("byte-level tokenizer: vocab_size %lld is below 256 (one id per byte)",
                     (long long)vocab);
        return -1;
    }
    // No bos_token_id (OLMoE's is null): samples start without one, as OLMoE's tokenizer's do.
    int no_bos = bos < 0;
    if (check_ids(vocab, no_bos ? (eos == 0 ? 1 : 0) : bos, eos, "byte-level tokenizer")) return -1;
    t->kind = MT_TOKENIZER_BYTE;
    t->vocab = vocab;
    t->bos = no_bos ? -1 : bos;
    t->add_bos = !no_bos;
    t->eos = eos;
    t->pad = 0;
    snprintf(t->source, sizeof t->source, "bytes");
    return 0;
}

int mt_tokenizer_load_spm(mt_tokenizer *t, const char *model_path, int64_t vocab, int32_t bos,
                          int32_t eos) {
    memset(t, 0, sizeof *t);
    if (check_ids(vocab, bos, eos, model_path)) return -1;
#ifdef MT_SENTENCEPIECE
    mt_spm *s = mt_spm_load(model_path);
    if (!s) return -1;
    int pieces = mt_spm_piece_count(s);
    if (pieces > vocab) {
        mt_error_set("%s: the tokenizer has %d pieces but config.json's vocab_size is %lld: "
                     "ids would run past the embedding", model_path, pieces, (long long)vocab);
        mt_spm_free(s);
        return -1;
    }
    int sb = mt_spm_bos_id(s), se = mt_spm_eos_id(s);
    if ((sb >= 0 && sb != bos) || (se >= 0 && se != eos)) {
        mt_error_set("%s: the tokenizer's BOS/EOS ids are %d/%d but config.json says %d/%d",
                     model_path, sb, se, (int)bos, (int)eos);
        mt_spm_free(s);
        return -1;
    }
    t->kind = MT_TOKENIZER_SPM;
    t->vocab = vocab;
    t->bos = bos;
    t->add_bos = 1;
    t->eos = eos;
    t->pad = 0;
    t->spm = s;
    snprintf(t->source, sizeof t->source, "%s", model_path);
    return 0;
#else
    mt_error_set("%s: this moetrain was built without SentencePiece (libsentencepiece); "
                 "rebuild with the shim to use a tokenizer.model", model_path);
    return -1;
#endif
}

int mt_tokenizer_load_bpe(mt_tokenizer *t, const char *json_path, int64_t vocab, int32_t eos) {
    memset(t, 0, sizeof *t);
    if (vocab <= 0 || vocab > INT32_MAX) {
        mt_error_set("%s: vocab_size %lld is not a usable vocabulary size", json_path, (long long)vocab);
        return -1;
    }
    mt_bpe *b = mt_bpe_load(json_path);
    if (!b) return -1;
    if (mt_bpe_id_count(b) > vocab) {
        mt_error_set("%s: the tokenizer has ids up to %lld but config.json's vocab_size is %lld: "
                     "ids would run past the embedding", json_path, (long long)mt_bpe_id_count(b) - 1,
                     (long long)vocab);
        mt_bpe_free(b);
        return -1;
    }
    if (eos < 0 || !mt_bpe_piece(b, eos)) {
        mt_error_set("%s: config.json's eos_token_id %d names no token of this tokenizer", json_path,
                     (int)eos);
        mt_bpe_free(b);
        return -1;
    }
    t->kind = MT_TOKENIZER_BPE;
    t->vocab = vocab;
    t->bos = -1;  // Qwen2/OLMoE add no BOS (tokenizer.h)
    t->add_bos = 0;
    t->eos = eos;
    t->pad = 0;
    t->bpe = b;
    snprintf(t->source, sizeof t->source, "%s", json_path);
    return 0;
}

static int open_files(mt_tokenizer *t, const char *dir, int64_t vocab, int32_t bos,
                      int32_t eos) {
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    if (stat(path, &st) == 0) return mt_tokenizer_load_spm(t, path, vocab, bos, eos);
    if (errno != ENOENT) {
        mt_error_set("%s: cannot read: %s", path, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (stat(path, &st) == 0) return mt_tokenizer_load_bpe(t, path, vocab, eos);
    if (errno != ENOENT) {
        mt_error_set("%s: cannot read: %s", path, strerror(errno));
        return -1;
    }
    if (vocab < 256) {
        mt_error_set("%s: no tokenizer.model, and vocab_size %lld is too small for the byte-level "
                     "tokenizer (it needs 256)", dir, (long long)vocab);
        return -1;
    }
    if (vocab > 1024)
        mt_warn("%s: no tokenizer.model: byte-level tokenizer for vocab_size %lld (ids 256 and up "
                "stay unused)", dir, (long long)vocab);
    return mt_tokenizer_init_bytes(t, vocab, bos, eos);
}

// tokenizer_config.json's settings that change the ids of a sample (tokenizer.h): honoured or
// refused by name; the file's absence changes nothing.
static int apply_config(mt_tokenizer *t, const char *dir, int32_t bos) {
    char path[4200], *text;
    size_t len;
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (stat(path, &st) != 0) return 0;
    if (mt_read_file(path, 64u << 20, &text, &len) != 0) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        mt_error_set("%s: not a JSON object", path);
        rc = -1;
    }
    static const char *const refused[] = {"add_prefix_space", "do_lower_case"};
    for (size_t i = 0; rc == 0 && i < MT_ARRAY_LEN(refused); i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, refused[i]))) {
            mt_error_set("%s: %s: true changes how text is split beyond tokenizer.json, which moetrain does not do",
                         path, refused[i]);
            rc = -1;
        }
    const cJSON *add_bos = rc == 0 ? cJSON_GetObjectItemCaseSensitive(root, "add_bos_token") : NULL;
    if (cJSON_IsFalse(add_bos)) {
        t->add_bos = 0;
    } else if (cJSON_IsTrue(add_bos) && !t->add_bos) {
        // BPE: transformers rebuilds the post-processor to add the bos_token; here, config.json's id.
        if (bos < 0 || bos >= t->vocab || (t->bpe && !mt_bpe_piece(t->bpe, bos))) {
            mt_error_set("%s: add_bos_token is true, but config.json's bos_token_id (%d) names no token of this "
                         "tokenizer", path, (int)bos);
            rc = -1;
        } else {
            t->bos = bos, t->add_bos = 1;
        }
    }
    cJSON_Delete(root);
    return rc;
}

int mt_tokenizer_open(mt_tokenizer *t, const char *model_dir, int64_t vocab, int32_t bos, int32_t eos) {
    memset(t, 0, sizeof *t);
    // --model may name the config.json itself: look beside it.
    char dir[4096];
    mt_model_folder(model_dir, dir, sizeof dir);
    if (open_files(t, dir, vocab, bos, eos) != 0) return -1;
    if (apply_config(t, dir, bos) != 0) {
        mt_tokenizer_free(t);
        return -1;
    }
    return 0;
}

void mt_tokenizer_free(mt_tokenizer *t) {
#ifdef MT_SENTENCEPIECE
    if (t->spm) mt_spm_free(t->spm);
#endif
    mt_bpe_free(t->bpe);
    memset(t, 0, sizeof *t);
}

static int byte_reserved(const mt_tokenizer *t, int32_t b) {
    return b == t->bos || b == t->eos || b == t->pad;
}

uint64_t mt_tokenizer_max_token_bytes(const mt_tokenizer *t) {
    if (t->kind == MT_TOKENIZER_BPE) return mt_bpe_max_token_bytes(t->bpe);
    return t->kind == MT_TOKENIZER_BYTE ? 1 : 64;
}

int mt_tokenizer_encode(const mt_tokenizer *t, const char *text, size_t len, mt_ids *out) {
    return mt_tokenizer_encode_max(t, text, len, SIZE_MAX, out);
}

int mt_tokenizer_encode_max(const mt_tokenizer *t, const char *text, size_t len, size_t max,
                            mt_ids *out) {
    if (t->kind == MT_TOKENIZER_BPE) return mt_bpe_encode_max(t->bpe, text, len, max, out);
    if (t->kind == MT_TOKENIZER_BYTE) {
        for (size_t i = 0; i < len; i++) {
            int32_t b = (uint8_t)text[i];
            if (byte_reserved(t, b)) {
                mt_error_set("byte 0x%02x at offset %zu is reserved by the byte-level tokenizer "
                             "(BOS %d, EOS %d, pad %d)", (unsigned)b, i, (int)t->bos, (int)t->eos,
                             (int)t->pad);
                return -1;
            }
        }
        for (size_t i = 0; i < len && i < max; i++) mt_ids_push(out, (uint8_t)text[i]);
        return 0;
    }
#ifdef MT_SENTENCEPIECE
    int32_t *ids;
    size_t n;
    if (mt_spm_encode(t->spm, text, len, &ids, &n)) return -1;
    for (size_t i = 0; i < n && i < max; i++) mt_ids_push(out, ids[i]);
    free(ids);
    return 0;
#else
    mt_error_set("SentencePiece is not built in");
    return -1;
#endif
}

int mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, char **text,
                        size_t *len) {
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->vocab) {
            mt_error_set("%s: decode: id %d at position %zu is outside the vocabulary (%lld)",
                         t->source, (int)ids[i], i, (long long)t->vocab);
            return -1;
        }
    if (t->kind == MT_TOKENIZER_BYTE) {
        char *buf = mt_xmalloc(n + 1);
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 256 && ids[i] != t->bos && ids[i] != t->eos) buf[k++] = (char)ids[i];
        buf[k] = 0;
        *text = buf;
        *len = k;
        return 0;
    }
    if (t->kind == MT_TOKENIZER_BPE) {  // BOS/EOS skipped, as for the other kinds
        int32_t *keep = mt_xmalloc((n ? n : 1) * sizeof *keep);
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (ids[i] != t->bos && ids[i] != t->eos) keep[k++] = ids[i];
        int rc = mt_bpe_decode(t->bpe, keep, k, text, len);
        free(keep);
        return rc;
    }
#ifdef MT_SENTENCEPIECE
    // Ids past the tokenizer's pieces (a padded embedding) are skipped, like unused bytes.
    int pieces = mt_spm_piece_count(t->spm);
    int32_t *keep = mt_xmalloc((n ? n : 1) * sizeof *keep);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < pieces) keep[k++] = ids[i];
    int rc = mt_spm_decode(t->spm, keep, k, text, len);
    free(keep);
    return rc;
#else
    mt_error_set("SentencePiece is not built in");
    return -1;
#endif
}

int mt_tokenizer_piece(const mt_tokenizer *t, int32_t id, char *buf, size_t n) {
    if (id < 0 || id >= t->vocab) {
        mt_error_set("%s: id %d is outside the vocabulary (%lld)", t->source, (int)id,
                     (long long)t->vocab);
        return -1;
    }
    if (t->kind == MT_TOKENIZER_BYTE) {
        if (id == t->bos) snprintf(buf, n, "<s>");
        else if (id == t->eos) snprintf(buf, n, "</s>");
        else if (id >= 256) snprintf(buf, n, "<unused>");
        else if (id > 0x20 && id < 0x7f) snprintf(buf, n, "%c", (char)id);
        else snprintf(buf, n, "<0x%02X>", (unsigned)id);
        return 0;
    }
    if (t->kind == MT_TOKENIZER_BPE) {
        const char *p = mt_bpe_piece(t->bpe, id);
        snprintf(buf, n, "%s", p ? p : "<unused>");
        return 0;
    }
#ifdef MT_SENTENCEPIECE
    const char *p = mt_spm_id_to_piece(t->spm, id);
    snprintf(buf, n, "%s", p ? p : "<unused>");
    return 0;
#else
    return -1;
#endif
}
