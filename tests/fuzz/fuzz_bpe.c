// libFuzzer target: byte-level BPE never crashes. First byte 0: the rest is a tokenizer.json,
// loaded (accepted or refused with an error). Otherwise the rest is text for the gpt2im fixture
// (no normalizer): invalid UTF-8 is refused, valid text decodes back to itself exactly.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "data/bpe.h"

static mt_bpe *fixture;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (data[0] == 0) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/moetrain-fuzz-bpe-%d.json", (int)getpid());
        if (mt_write_file_atomic(path, data + 1, size - 1) != 0) __builtin_trap();
        mt_bpe *b = mt_bpe_load(path);
        if (b) {
            mt_ids ids = {0};
            (void)mt_bpe_encode(b, "Hello, world! 123 <|x|>", 23, &ids);
            mt_ids_free(&ids);
            mt_bpe_free(b);
        }
        unlink(path);
        return 0;
    }
    if (!fixture && !(fixture = mt_bpe_load("tests/data/bpe/gpt2im/tokenizer.json"))) {
        fprintf(stderr, "fuzz_bpe: run from the repository root: %s\n", mt_error_get());
        abort();
    }
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    mt_ids ids = {0};
    if (mt_bpe_encode(fixture, text, len, &ids) == 0) {
        char *dec;
        size_t n;
        if (mt_bpe_decode(fixture, ids.v, ids.n, &dec, &n) != 0) __builtin_trap();
        if (n != len || memcmp(dec, text, len) != 0) __builtin_trap();  // round trip
        free(dec);
    } else if (ids.n != 0) {
        __builtin_trap();  // a refusal appends nothing
    }
    mt_ids_free(&ids);
    return 0;
}
