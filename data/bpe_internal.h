// data/bpe_internal.h — what the tokenizer.json reader (bpe.c) and the encoder (bpe_encode.c)
// share: the loaded tokenizer and its hash maps. Not for use outside data/bpe*.c.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <string.h>

#include "data/bpe.h"

#define BPE_MAX_REGEX 8

// ---------------------------------------------------------------------------------------------
// Hash maps: string → id (the vocabulary), id pair → merge.

typedef struct {
    const char *key;  // NULL: empty slot
    size_t len;
    int32_t id;
} str_slot;

typedef struct {
    uint64_t key;     // left << 32 | right; UINT64_MAX: empty
    int32_t rank, id;
} pair_slot;

static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static inline size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

typedef struct added_token {
    char *content;
    size_t len;
    int32_t id;
    int special;
} added_token;

struct mt_bpe {
    char path[1024];
    str_slot *vocab;          // model.vocab
    size_t vocab_cap;
    pair_slot *merges;
    size_t merges_cap;
    char **piece;             // [n_ids]: token string (vocab entry or added content), or NULL
    uint8_t *added;           // [n_ids]: 0, 1 added, 2 added and special
    int64_t n_ids;
    added_token *adds;        // longest first
    int n_adds;
    uint8_t add_first[256];   // 1: some added token starts with this byte
    pcre2_code *re[BPE_MAX_REGEX];
    int n_re;
    int nfc, ignore_merges;
    uint64_t max_tok;         // bytes of the longest token string
    int32_t byte_id[256];     // id of each byte's one-character token
    char byte_chr[256][3];    // byte → its character in the byte-level alphabet (UTF-8)
    uint8_t byte_chr_len[256];
    int16_t char_byte[324];   // that character's code point → byte; -1: none
};

static inline int32_t vocab_find(const mt_bpe *b, const char *s, size_t n) {
    size_t mask = b->vocab_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        const str_slot *e = &b->vocab[i];
        if (!e->key) return -1;
        if (e->len == n && memcmp(e->key, s, n) == 0) return e->id;
    }
}

static inline const pair_slot *merge_find(const mt_bpe *b, int32_t l, int32_t r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    size_t mask = b->merges_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        const pair_slot *e = &b->merges[i];
        if (e->key == UINT64_MAX) return NULL;
        if (e->key == key) return e;
    }
}

