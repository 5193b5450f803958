// libFuzzer target: MTTOK1 token files (data.h) never crash the reader, whatever their header,
// lengths, ids or mask bytes say. The input is the file after its magic (prepended here, so every
// input reaches the parser). What loads: every sample at most --seq tokens (the first byte picks
// --seq), ids in the vocabulary, labels the token or ignored; written back and read again, the
// same dataset. A sample longer than --seq is counted truncated, never grown.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mt_tokenizer tok;
    static int ready;
    if (!ready) {
        mt_log_set_level(MT_LOG_ERROR);
        if (mt_tokenizer_init_bytes(&tok, 256, 1, 2) != 0) __builtin_trap();
        ready = 1;
    }
    if (size < 1) return 0;
    char in[256], out[256];
    snprintf(in, sizeof in, "%s/in.tok", fuzz_dir("mttok"));
    snprintf(out, sizeof out, "%s/out.tok", fuzz_dir("mttok"));
    uint8_t *file = malloc(size + 5);
    memcpy(file, "MTTOK1", 6);
    memcpy(file + 6, data + 1, size - 1);
    fuzz_write(in, file, size + 5);
    free(file);
    mt_data_opts o;
    mt_data_opts_default(&o);
    o.shuffle = 0;
    o.seq = 2 + data[0] % 64;
    o.overlong = (mt_overlong)(data[0] / 64 % 3);
    mt_dataset d, back;
    if (mt_dataset_load(&d, in, &tok, &o) == 0) {
        if (d.stats.longest > o.seq || d.stats.samples != d.n) __builtin_trap();
        for (int64_t i = 0; i < d.n; i++) {
            if (d.offsets[i + 1] - d.offsets[i] > o.seq || d.offsets[i + 1] <= d.offsets[i]) __builtin_trap();
            for (int64_t k = d.offsets[i]; k < d.offsets[i + 1]; k++)
                if (d.tokens[k] < 0 || d.tokens[k] >= 256 || (d.labels[k] != d.tokens[k] && d.labels[k] != MT_LABEL_IGNORE))
                    __builtin_trap();
        }
        if (mt_dataset_save_tokens(&d, out) != 0) __builtin_trap();
        if (mt_dataset_load(&back, out, &tok, &o) != 0) __builtin_trap();
        if (back.n != d.n || memcmp(back.offsets, d.offsets, (size_t)(d.n + 1) * sizeof *d.offsets) != 0 ||
            memcmp(back.tokens, d.tokens, (size_t)d.offsets[d.n] * 4) != 0 ||
            memcmp(back.labels, d.labels, (size_t)d.offsets[d.n] * 4) != 0)
            __builtin_trap();
        mt_dataset_free(&back);
    } else if (!strstr(mt_error_get(), in)) {
        __builtin_trap();  // a refusal names the file
    }
    mt_dataset_free(&d);
    return 0;
}
