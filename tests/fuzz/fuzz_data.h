// tests/fuzz/fuzz_data.h — what the dataset targets share (fuzz_dataset, fuzz_mttok, fuzz_chat,
// fuzz_ckpt_state): the byte-level tokenizer they read with, the invariants of a loaded dataset,
// and its write -> read -> equal round trip.
#pragma once
#include <string.h>

#include "core/common.h"
#include "data/data.h"
#include "data/tokenizer.h"

// Bytes, vocab 256, BOS 1, EOS 2; made once, with errors not logged.
static inline const mt_tokenizer *fuzz_byte_tokenizer(void) {
    static mt_tokenizer tok;
    static int ready;
    if (!ready) {
        mt_log_set_level(MT_LOG_ERROR);
        if (mt_tokenizer_init_bytes(&tok, 256, 1, 2) != 0) __builtin_trap();
        ready = 1;
    }
    return &tok;
}

// No empty sample, at most `seq` tokens each, ids in [0, vocab), labels the token or ignored.
static inline void fuzz_check_dataset(const mt_dataset *d, int64_t vocab, int64_t seq) {
    if (d->n < 0 || (d->n && d->offsets[0] != 0) || d->stats.samples != d->n || d->stats.longest > seq) __builtin_trap();
    for (int64_t i = 0; i < d->n; i++) {
        if (d->offsets[i + 1] <= d->offsets[i] || d->offsets[i + 1] - d->offsets[i] > seq) __builtin_trap();
        for (int64_t k = d->offsets[i]; k < d->offsets[i + 1]; k++) {
            if (d->tokens[k] < 0 || d->tokens[k] >= vocab) __builtin_trap();
            if (d->labels[k] != d->tokens[k] && d->labels[k] != MT_LABEL_IGNORE) __builtin_trap();
        }
    }
}

// Written as a token file to `out` and read back with the same options: the same samples.
static inline void fuzz_round_trip(const mt_dataset *d, const char *out, const mt_data_opts *o) {
    mt_dataset back;
    if (mt_dataset_save_tokens(d, out) != 0) __builtin_trap();
    if (mt_dataset_load(&back, out, fuzz_byte_tokenizer(), o) != 0) __builtin_trap();
    if (back.n != d->n || memcmp(back.offsets, d->offsets, (size_t)(d->n + 1) * sizeof *d->offsets) != 0 ||
        memcmp(back.tokens, d->tokens, (size_t)d->offsets[d->n] * 4) != 0 ||
        memcmp(back.labels, d->labels, (size_t)d->offsets[d->n] * 4) != 0)
        __builtin_trap();
    mt_dataset_free(&back);
}
