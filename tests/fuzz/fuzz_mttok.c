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
#include "tests/fuzz/fuzz_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const mt_tokenizer *tok = fuzz_byte_tokenizer();
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
    mt_dataset d;
    if (mt_dataset_load(&d, in, tok, &o) == 0) {
        fuzz_check_dataset(&d, 256, o.seq);
        fuzz_round_trip(&d, out, &o);
    } else if (!strstr(mt_error_get(), in)) {
        __builtin_trap();  // a refusal names the file
    }
    mt_dataset_free(&d);
    return 0;
}
