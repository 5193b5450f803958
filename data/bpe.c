// data/bpe.c — byte-level BPE from a Hugging Face tokenizer.json (see bpe.h for what is accepted).
//
// Encoding, as `tokenizers` does it: split the raw text on added tokens (leftmost-longest);
// each other chunk is NFC-normalized (when asked), split by the pre-tokenizer regexes (matches
// and the gaps between them both kept: behavior Isolated), each piece's bytes mapped to GPT-2's
// printable byte alphabet, then merged by rank: the lowest-ranked adjacent pair first, the
// leftmost among equals, until no pair has a merge.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bpe.h"

#include <pcre2.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include <cjson/cJSON.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "data/bpe_internal.h"

#define BPE_MAX_FILE_BYTES (256u << 20)
#define BPE_MAX_IDS (1 << 24)  // the largest real vocabularies hold ~260k ids
// GPT-2's pattern, which ByteLevel(use_regex=true) applies.
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ---------------------------------------------------------------------------------------------
// Loading

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
// U+0100 upwards in byte order.
static void byte_table(mt_bpe *b) {
    int n = 0;
    for (int i = 0; i < 324; i++) b->char_byte[i] = -1;
    for (int c = 0; c < 256; c++) {
        int keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        int cp = keep ? c : 256 + n++;
        b->char_byte[cp] = (int16_t)c;
        if (cp < 0x80) {
            b->byte_chr[c][0] = (char)cp;
            b->byte_chr_len[c] = 1;
        } else {
            b->byte_chr[c][0] = (char)(0xC0 | (cp >> 6));
            b->byte_chr[c][1] = (char)(0x80 | (cp & 0x3F));
            b->byte_chr_len[c] = 2;
        }
    }
}

static int field_bool(const mt_bpe *b, const cJSON *obj, const char *where, const char *key,
                      int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) {
        mt_error_set("%s: %s.%s must be true or false", b->path, where, key);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

static const char *field_type(const cJSON *obj) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

// The pattern with \s and \S spelled \p{White_Space} and \P{White_Space}: Oniguruma (which
// `tokenizers` uses) means the White_Space property by \s, PCRE2 with UCP a slightly larger set
// (it adds U+180E). A malloc'ed string.
static char *white_space_pattern(const char *p) {
    size_t n = strlen(p), k = 0;
    char *out = mt_xmalloc(8 * n + 1);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\' && i + 1 < n) {
            if (p[i + 1] == 's' || p[i + 1] == 'S') {
                k += (size_t)sprintf(out + k, "\\%c{White_Space}", p[i + 1] == 's' ? 'p' : 'P');
            } else {
                out[k++] = p[i];
                out[k++] = p[i + 1];
            }
            i++;
            continue;
        }
        out[k++] = p[i];
    }
    out[k] = 0;
    return out;
}

static int add_regex(mt_bpe *b, const char *pattern_in, const char *where) {
    if (b->n_re == BPE_MAX_REGEX) {
        mt_error_set("%s: %s: more than %d regex splits", b->path, where, BPE_MAX_REGEX);
        return -1;
    }
    int err;
    PCRE2_SIZE at;
    char *pattern = white_space_pattern(pattern_in);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &err, &at, NULL);
    free(pattern);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        mt_error_set("%s: %s: the regex does not compile at offset %zu: %s", b->path, where,
                     (size_t)at, (const char *)msg);
        return -1;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // a speed-up only: the interpreter is the fallback
    b->re[b->n_re++] = re;
    return 0;
}

static int load_byte_level(mt_bpe *b, const cJSON *p, const char *where, int want_regex) {
    int prefix, use_regex;
    if (field_bool(b, p, where, "add_prefix_space", 1, &prefix) ||
        field_bool(b, p, where, "use_regex", 1, &use_regex))
        return -1;
    if (prefix) {
        mt_error_set("%s: %s.add_prefix_space is true; moetrain reads byte-level BPE without a "
                     "prefix space only (Qwen2, OLMoE)", b->path, where);
        return -1;
    }
    if (want_regex >= 0 && use_regex != want_regex) {
        mt_error_set("%s: %s.use_regex must be %s here", b->path, where, want_regex ? "true" : "false");
        return -1;
    }
    return use_regex ? add_regex(b, GPT2_PATTERN, where) : 0;
}

static int load_split(mt_bpe *b, const cJSON *p, const char *where) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    int invert;
    if (!cJSON_IsString(re)) {
        mt_error_set("%s: %s.pattern must be {\"Regex\": \"...\"}", b->path, where);
        return -1;
    }
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0) {
        mt_error_set("%s: %s.behavior must be \"Isolated\"", b->path, where);
        return -1;
    }
    if (field_bool(b, p, where, "invert", 0, &invert)) return -1;
    if (invert) {
        mt_error_set("%s: %s.invert must be false", b->path, where);
        return -1;
    }
    return add_regex(b, re->valuestring, where);
}

static int load_pre_tokenizer(mt_bpe *b, const cJSON *p) {
    const char *type = p ? field_type(p) : NULL;
    if (type && strcmp(type, "ByteLevel") == 0) return load_byte_level(b, p, "pre_tokenizer", 1);
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *steps = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        int n = cJSON_IsArray(steps) ? cJSON_GetArraySize(steps) : 0;
        if (n < 1) {
            mt_error_set("%s: pre_tokenizer.pretokenizers must be a non-empty array", b->path);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            const cJSON *s = cJSON_GetArrayItem(steps, i);
            const char *st = field_type(s);
            char where[64];
            snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%d]", i);
            if (i < n - 1 && st && strcmp(st, "Split") == 0) {
                if (load_split(b, s, where)) return -1;
            } else if (i == n - 1 && st && strcmp(st, "ByteLevel") == 0) {
                if (load_byte_level(b, s, where, -1)) return -1;
            } else {
                mt_error_set("%s: %s is %s; moetrain reads Split(Regex, Isolated) steps ending in "
                             "ByteLevel", b->path, where, st ? st : "not a typed object");
                return -1;
            }
        }
        return 0;
    }
    mt_error_set("%s: pre_tokenizer is %s; moetrain reads ByteLevel or Sequence[Split..., "
                 "ByteLevel] (Qwen2, OLMoE)", b->path, type ? type : "missing");
    return -1;
}

static int check_model_fields(mt_bpe *b, const cJSON *m) {
    const char *type = field_type(m);
    if (!type || strcmp(type, "BPE") != 0) {
        mt_error_set("%s: model.type is %s; moetrain reads \"BPE\"", b->path, type ? type : "missing");
        return -1;
    }
    int fallback;
    if (field_bool(b, m, "model", "byte_fallback", 0, &fallback) ||
        field_bool(b, m, "model", "ignore_merges", 0, &b->ignore_merges))
        return -1;
    if (fallback) {
        mt_error_set("%s: model.byte_fallback is true; moetrain reads byte-level BPE (false)", b->path);
        return -1;
    }
    const char *null_keys[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < MT_ARRAY_LEN(null_keys); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, null_keys[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0])) {
            mt_error_set("%s: model.%s must be null", b->path, null_keys[i]);
            return -1;
        }
    }
    return 0;
}

// The token string of an id. An added token's content replaces the vocabulary's string for the
// same id (GPT-NeoX's whitespace tokens: "  " added over the vocabulary's "ĠĠ"), as it does in
// `tokenizers`' decoding; any other clash is an error.
static int set_piece(mt_bpe *b, int32_t id, const char *s, size_t len, int is_added) {
    if (b->piece[id] && is_added && !b->added[id]) {
        free(b->piece[id]);
        b->piece[id] = NULL;
    }
    if (b->piece[id] && (strlen(b->piece[id]) != len || memcmp(b->piece[id], s, len) != 0)) {
        mt_error_set("%s: id %d is both \"%s\" and \"%.*s\"", b->path, (int)id, b->piece[id],
                     (int)MT_MIN(len, 80), s);
        return -1;
    }
    b->max_tok = MT_MAX(b->max_tok, (uint64_t)len);
    if (!b->piece[id]) {
        b->piece[id] = mt_xmalloc(len + 1);
        memcpy(b->piece[id], s, len);
        b->piece[id][len] = 0;
    }
    return 0;
}

static int json_id(const mt_bpe *b, const cJSON *v, const char *what, int32_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= BPE_MAX_IDS ||
        v->valuedouble != (double)(int32_t)v->valuedouble) {
        mt_error_set("%s: %s: the id must be an integer in [0, %d)", b->path, what, BPE_MAX_IDS);
        return -1;
    }
    *out = (int32_t)v->valuedouble;
    return 0;
}

static int load_vocab(mt_bpe *b, const cJSON *vocab, const cJSON *added) {
    if (!cJSON_IsObject(vocab)) {
        mt_error_set("%s: model.vocab must be an object {token: id}", b->path);
        return -1;
    }
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) {
        mt_error_set("%s: added_tokens must be an array", b->path);
        return -1;
    }
    int64_t n = 0, count = 0;
    const cJSON *e;
    int32_t id;
    cJSON_ArrayForEach(e, vocab) {
        if (json_id(b, e, "model.vocab", &id)) return -1;
        n = MT_MAX(n, (int64_t)id + 1);
        count++;
    }
    cJSON_ArrayForEach(e, added) {
        if (json_id(b, cJSON_GetObjectItemCaseSensitive(e, "id"), "added_tokens[].id", &id)) return -1;
        n = MT_MAX(n, (int64_t)id + 1);
    }
    b->n_ids = n;
    b->piece = mt_xcalloc((size_t)MT_MAX(n, 1), sizeof *b->piece);
    b->added = mt_xcalloc((size_t)MT_MAX(n, 1), 1);
    b->vocab_cap = pow2_at_least((size_t)count);
    b->vocab = mt_xcalloc(b->vocab_cap, sizeof *b->vocab);
    cJSON_ArrayForEach(e, vocab) {
        id = (int32_t)e->valuedouble;
        size_t len = strlen(e->string);
        if (vocab_find(b, e->string, len) >= 0) {
            mt_error_set("%s: model.vocab: \"%s\" appears twice", b->path, e->string);
            return -1;
        }
        if (set_piece(b, id, e->string, len, 0)) return -1;
        size_t mask = b->vocab_cap - 1, i = hash_bytes(e->string, len) & mask;
        while (b->vocab[i].key) i = (i + 1) & mask;
        b->vocab[i] = (str_slot){mt_xstrdup(e->string), len, id};  // its own copy: see set_piece
    }
    int na = added ? cJSON_GetArraySize(added) : 0;
    b->adds = mt_xcalloc((size_t)MT_MAX(na, 1), sizeof *b->adds);
    cJSON_ArrayForEach(e, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%d]", b->n_adds);
        if (!cJSON_IsString(c) || !c->valuestring[0]) {
            mt_error_set("%s: %s.content must be a non-empty string", b->path, where);
            return -1;
        }
        int special, flag;
        if (field_bool(b, e, where, "special", 0, &special)) return -1;
        const char *refused[] = {"lstrip", "rstrip", "single_word"};
        for (size_t k = 0; k < MT_ARRAY_LEN(refused); k++) {
            if (field_bool(b, e, where, refused[k], 0, &flag)) return -1;
            if (flag) {
                mt_error_set("%s: %s (\"%s\").%s is true; moetrain matches added tokens as exact "
                             "strings only", b->path, where, c->valuestring, refused[k]);
                return -1;
            }
        }
        id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        size_t len = strlen(c->valuestring);
        if (set_piece(b, id, c->valuestring, len, 1)) return -1;
        b->added[id] = special ? 2 : 1;
        b->adds[b->n_adds++] = (added_token){b->piece[id], len, id, special};
        b->add_first[(uint8_t)c->valuestring[0]] = 1;
    }
    // Longest first: the first match at a position is the longest.
    for (int i = 1; i < b->n_adds; i++)
        for (int j = i; j > 0 && b->adds[j].len > b->adds[j - 1].len; j--) {
            added_token t = b->adds[j];
            b->adds[j] = b->adds[j - 1];
            b->adds[j - 1] = t;
        }
    for (int c = 0; c < 256; c++) {
        b->byte_id[c] = vocab_find(b, b->byte_chr[c], b->byte_chr_len[c]);
        if (b->byte_id[c] < 0) {
            mt_error_set("%s: model.vocab lacks the byte-level token \"%.*s\" of byte 0x%02X: not "
                         "a byte-level BPE vocabulary", b->path, (int)b->byte_chr_len[c],
                         b->byte_chr[c], (unsigned)c);
            return -1;
        }
    }
    return 0;
}

static int load_merges(mt_bpe *b, const cJSON *merges) {
    if (!cJSON_IsArray(merges)) {
        mt_error_set("%s: model.merges must be an array", b->path);
        return -1;
    }
    int n = cJSON_GetArraySize(merges), rank = 0;
    b->merges_cap = pow2_at_least((size_t)n);
    b->merges = mt_xmalloc(b->merges_cap * sizeof *b->merges);
    for (size_t i = 0; i < b->merges_cap; i++) b->merges[i].key = UINT64_MAX;
    char *joined = NULL;
    size_t cap = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *l, *r;
        size_t ll, rl;
        if (cJSON_IsString(e)) {  // "a b"
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                mt_error_set("%s: model.merges[%d] \"%s\" is not two tokens joined by one space",
                             b->path, rank, e->valuestring);
                free(joined);
                return -1;
            }
            l = e->valuestring, ll = (size_t)(sp - l), r = sp + 1, rl = strlen(r);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 0)) && cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            l = cJSON_GetArrayItem(e, 0)->valuestring, ll = strlen(l);
            r = cJSON_GetArrayItem(e, 1)->valuestring, rl = strlen(r);
        } else {
            mt_error_set("%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", b->path, rank);
            free(joined);
            return -1;
        }
        int32_t li = vocab_find(b, l, ll), ri = vocab_find(b, r, rl);
        if (ll + rl + 1 > cap) joined = mt_xrealloc(joined, cap = 2 * (ll + rl + 1));
        memcpy(joined, l, ll);
        memcpy(joined + ll, r, rl);
        int32_t mi = vocab_find(b, joined, ll + rl);
        if (li < 0 || ri < 0 || mi < 0) {
            mt_error_set("%s: model.merges[%d] (\"%.*s\" \"%.*s\"): %s is not in model.vocab", b->path,
                         rank, (int)MT_MIN(ll, 80), l, (int)MT_MIN(rl, 80), r,
                         li < 0 ? "the first token" : ri < 0 ? "the second token" : "the merged token");
            free(joined);
            return -1;
        }
        // A repeated pair takes its last rank, as `tokenizers` builds its map.
        uint64_t key = (uint64_t)(uint32_t)li << 32 | (uint32_t)ri;
        size_t mask = b->merges_cap - 1, i = hash_u64(key) & mask;
        while (b->merges[i].key != UINT64_MAX && b->merges[i].key != key) i = (i + 1) & mask;
        b->merges[i] = (pair_slot){key, rank, mi};
        rank++;
    }
    free(joined);
    return 0;
}

static int load_json(mt_bpe *b, const cJSON *root) {
    if (!cJSON_IsObject(root)) {
        mt_error_set("%s: not a JSON object", b->path);
        return -1;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        mt_error_set("%s: model is missing", b->path);
        return -1;
    }
    if (check_model_fields(b, model)) return -1;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const char *t = field_type(norm);
        if (!t || strcmp(t, "NFC") != 0) {
            mt_error_set("%s: normalizer is %s; moetrain reads null or NFC", b->path, t ? t : "untyped");
            return -1;
        }
        b->nfc = 1;
    }
    if (load_pre_tokenizer(b, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) return -1;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (!dec || !field_type(dec) || strcmp(field_type(dec), "ByteLevel") != 0) {
        mt_error_set("%s: decoder is %s; moetrain reads ByteLevel", b->path,
                     dec && field_type(dec) ? field_type(dec) : "missing");
        return -1;
    }
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (post && !cJSON_IsNull(post)) {
        const char *t = field_type(post);
        if (!t || strcmp(t, "ByteLevel") != 0) {
            mt_error_set("%s: post_processor is %s; moetrain reads null or ByteLevel (a tokenizer "
                         "that adds no BOS/EOS: the data layer places them)", b->path,
                         t ? t : "untyped");
            return -1;
        }
    }
    if (load_vocab(b, cJSON_GetObjectItemCaseSensitive(model, "vocab"),
                   cJSON_GetObjectItemCaseSensitive(root, "added_tokens")))
        return -1;
    if (load_merges(b, cJSON_GetObjectItemCaseSensitive(model, "merges"))) return -1;
    return 0;
}

// Every key and string of the file must be valid UTF-8 (Hugging Face's JSON reader refuses the
// file otherwise). 0, or -1 with an error naming the file and the key.
static int check_utf8_tree(const mt_bpe *b, const cJSON *j, char *path, size_t at, size_t cap) {
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        size_t n = at;
        if (cJSON_IsObject(j)) {
            const char *k = c->string ? c->string : "";
            size_t kl = strlen(k), ok = mt_st_utf8_prefix(k, kl);
            if (ok != kl) {
                mt_error_set("%s: %s%s: a key is not valid UTF-8 (byte 0x%02X at its offset %zu)",
                             b->path, path, at ? "" : "(top level)", (unsigned)(uint8_t)k[ok], ok);
                return -1;
            }
            n += (size_t)snprintf(path + at, cap - at, "%s%.*s", at ? "." : "", (int)MT_MIN(kl, 60), k);
        } else {
            n += (size_t)snprintf(path + at, cap - at, "[%d]", i);
        }
        n = MT_MIN(n, cap - 1);
        if (cJSON_IsString(c) && c->valuestring) {
            size_t vl = strlen(c->valuestring), ok = mt_st_utf8_prefix(c->valuestring, vl);
            if (ok != vl) {
                mt_error_set("%s: %s: the string is not valid UTF-8 (byte 0x%02X at offset %zu)",
                             b->path, path, (unsigned)(uint8_t)c->valuestring[ok], ok);
                return -1;
            }
        }
        if (c->child && check_utf8_tree(b, c, path, n, cap)) return -1;
        path[at] = 0;
    }
    return 0;
}

mt_bpe *mt_bpe_load(const char *path) {
    char *text;
    size_t len;
    if (mt_read_file(path, BPE_MAX_FILE_BYTES, &text, &len)) return NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) {
        mt_error_set("%s: not valid JSON", path);
        return NULL;
    }
    mt_bpe *b = mt_xcalloc(1, sizeof *b);
    snprintf(b->path, sizeof b->path, "%s", path);
    byte_table(b);
    char where[512] = "";
    int rc = check_utf8_tree(b, root, where, 0, sizeof where) || load_json(b, root);
    cJSON_Delete(root);
    if (rc) {
        mt_bpe_free(b);
        return NULL;
    }
    return b;
}

void mt_bpe_free(mt_bpe *b) {
    if (!b) return;
    for (int64_t i = 0; i < b->n_ids; i++) free(b->piece[i]);
    free(b->piece);
    free(b->added);
    free(b->adds);
    for (size_t i = 0; b->vocab && i < b->vocab_cap; i++) free((char *)b->vocab[i].key);
    free(b->vocab);
    free(b->merges);
    for (int i = 0; i < b->n_re; i++) pcre2_code_free(b->re[i]);
    free(b);
}

int64_t mt_bpe_id_count(const mt_bpe *b) { return b->n_ids; }
uint64_t mt_bpe_max_token_bytes(const mt_bpe *b) { return MT_MAX(b->max_tok, (uint64_t)1); }

int32_t mt_bpe_token_id(const mt_bpe *b, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < b->n_adds; i++)
        if (b->adds[i].len == n && memcmp(b->adds[i].content, token, n) == 0) return b->adds[i].id;
    return vocab_find(b, token, n);
}

int mt_bpe_is_special(const mt_bpe *b, int32_t id) {
    return id >= 0 && id < b->n_ids && b->added[id] == 2;
}

const char *mt_bpe_piece(const mt_bpe *b, int32_t id) {
    return id >= 0 && id < b->n_ids ? b->piece[id] : NULL;
}

// ---------------------------------------------------------------------------------------------
// Decoding

typedef struct {
    char *p;
    size_t n, cap;
} dbuf;

static void db_put(dbuf *d, const void *s, size_t k) {
    if (d->n + k + 1 > d->cap) {
        d->cap = MT_MAX(2 * d->cap, d->n + k + 64);
        d->p = mt_xrealloc(d->p, d->cap);
    }
    memcpy(d->p + d->n, s, k);
    d->n += k;
}

// Appends bytes[0..n) with each maximal invalid UTF-8 subpart replaced by U+FFFD, as Rust's
// String::from_utf8_lossy does.
static void put_lossy(dbuf *d, const uint8_t *s, size_t n) {
    static const char fffd[] = "\xEF\xBF\xBD";
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c < 0x80) { db_put(d, s + i, 1); i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else { db_put(d, fffd, 3); i++; continue; }
        size_t k = 1;
        while (k <= need && i + k < n) {
            uint8_t x = s[i + k];
            uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
            if (x < l || x > h) break;
            k++;
        }
        if (k == need + 1) db_put(d, s + i, k);
        else db_put(d, fffd, 3);
        i += k;
    }
}

// The bytes of a byte-level token; one with a character outside the alphabet stands for its
// own UTF-8, as the ByteLevel decoder has it.
static void token_bytes(const mt_bpe *b, const char *tok, dbuf *raw) {
    size_t start = raw->n;
    const uint8_t *p = (const uint8_t *)tok;
    size_t n = strlen(tok);
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp >= 324 || b->char_byte[cp] < 0) {
            raw->n = start;
            db_put(raw, tok, n);
            return;
        }
        uint8_t byte = (uint8_t)b->char_byte[cp];
        db_put(raw, &byte, 1);
        i += (size_t)k;
    }
}

int mt_bpe_decode(const mt_bpe *b, const int32_t *ids, size_t n, char **text, size_t *len) {
    dbuf out = {0}, raw = {0};
    for (size_t i = 0; i <= n; i++) {
        int32_t id = i < n ? ids[i] : -1;
        int added = id >= 0 && id < b->n_ids && b->added[id];
        if (i == n || added) {  // flush the byte-level run
            put_lossy(&out, (const uint8_t *)raw.p, raw.n);
            raw.n = 0;
            if (added) db_put(&out, b->piece[id], strlen(b->piece[id]));
            continue;
        }
        if (id >= 0 && id < b->n_ids && b->piece[id]) token_bytes(b, b->piece[id], &raw);
    }
    db_put(&out, "", 0);
    out.p[out.n] = 0;
    free(raw.p);
    *text = out.p;
    *len = out.n;
    return 0;
}
