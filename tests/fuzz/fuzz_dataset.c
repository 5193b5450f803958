// libFuzzer target: the dataset reader (JSONL text/instruction/chat and MTTOK1 token files) never
// crashes; what loads has ids inside the vocabulary, labels that are the token or ignored, and
// offsets that add up; written as a token file and read back, it is the same dataset.
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "tests/fuzz/fuzz_common.h"
#include "data/data.h"
#include "data/tokenizer.h"

static void check(const mt_dataset *d, int64_t vocab) {
    if (d->n < 0 || (d->n && d->offsets[0] != 0)) __builtin_trap();
    for (int64_t i = 0; i < d->n; i++) {
        if (d->offsets[i + 1] <= d->offsets[i]) __builtin_trap();  // empty samples are dropped
        for (int64_t k = d->offsets[i]; k < d->offsets[i + 1]; k++) {
            if (d->tokens[k] < 0 || d->tokens[k] >= vocab) __builtin_trap();
            if (d->labels[k] != d->tokens[k] && d->labels[k] != MT_LABEL_IGNORE) __builtin_trap();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mt_tokenizer tok;
    static int ready;
    if (!ready) {
        mt_log_set_level(MT_LOG_ERROR);
        if (mt_tokenizer_init_bytes(&tok, 256, 1, 2) != 0) __builtin_trap();
        ready = 1;
    }
    char in[256], out[256];
    snprintf(in, sizeof in, "%s/in", fuzz_dir("dataset"));
    snprintf(out, sizeof out, "%s/out.tok", fuzz_dir("dataset"));
    fuzz_write(in, data, size);
    mt_data_opts o;
    mt_data_opts_default(&o);
    o.shuffle = 0;
    o.seq = 64;
    if (size && data[0] & 1) o.packing = 1;
    mt_dataset d, back;
    if (mt_dataset_load(&d, in, &tok, &o) == 0) {
        check(&d, 256);
        if (mt_dataset_save_tokens(&d, out) != 0) __builtin_trap();
        if (mt_dataset_load(&back, out, &tok, &o) != 0) __builtin_trap();  // write -> read -> equal
        if (back.n != d.n || memcmp(back.offsets, d.offsets, (size_t)(d.n + 1) * sizeof *d.offsets) != 0 ||
            memcmp(back.tokens, d.tokens, (size_t)d.offsets[d.n] * 4) != 0 ||
            memcmp(back.labels, d.labels, (size_t)d.offsets[d.n] * 4) != 0)
            __builtin_trap();
        mt_dataset_free(&back);
    }
    mt_dataset_free(&d);
    return 0;
}
