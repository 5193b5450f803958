// libFuzzer target: the dataset reader (JSONL text/instruction/chat and MTTOK1 token files) never
// crashes; what loads has ids inside the vocabulary, labels that are the token or ignored, and
// offsets that add up; written as a token file and read back, it is the same dataset.
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_data.h"
#include "data/data.h"
#include "data/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const mt_tokenizer *tok = fuzz_byte_tokenizer();
    char in[256], out[256];
    snprintf(in, sizeof in, "%s/in", fuzz_dir("dataset"));
    snprintf(out, sizeof out, "%s/out.tok", fuzz_dir("dataset"));
    fuzz_write(in, data, size);
    mt_data_opts o;
    mt_data_opts_default(&o);
    o.shuffle = 0;
    o.seq = 64;
    if (size && data[0] & 1) o.packing = 1;
    mt_dataset d;
    if (mt_dataset_load(&d, in, tok, &o) == 0) {
        fuzz_check_dataset(&d, 256, o.seq);
        fuzz_round_trip(&d, out, &o);
    }
    mt_dataset_free(&d);
    return 0;
}
