// libFuzzer target: what a checkpoint's state.json means (trainer/checkpoint.h). The input, when
// it is a JSON object, is sealed (so it verifies) and read as a training state; a state that
// parses and passes mt_train_state_check against a 5-sample dataset and a 100-step run must be
// one that run can continue from: its step at most 100 and its data position one that the batch
// reader takes without an error. A state that names another run is read with that run id, never
// this one's.
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "data/data.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_data.h"
#include "trainer/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mt_dataset d;
    static char path[256], run[256];
    if (!d.n) {
        char jsonl[256];
        snprintf(jsonl, sizeof jsonl, "%s/data.jsonl", fuzz_dir("ckpt_state"));
        const char rows[] = "{\"text\":\"a\"}\n{\"text\":\"bb\"}\n{\"text\":\"ccc\"}\n{\"text\":\"dddd\"}\n{\"text\":\"e\"}\n";
        fuzz_write(jsonl, rows, sizeof rows - 1);
        mt_data_opts o;
        mt_data_opts_default(&o);
        o.seq = 16;
        if (mt_dataset_load(&d, jsonl, fuzz_byte_tokenizer(), &o) != 0 || d.n != 5) __builtin_trap();
        snprintf(path, sizeof path, "%s/state.json", fuzz_dir("ckpt_state"));
    }
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    if (cJSON_IsObject(j) && !cJSON_GetObjectItemCaseSensitive(j, "sha256")) {
        char *text = mt_ckpt_state_seal(j);
        fuzz_write(path, text, strlen(text));
        free(text);
        mt_train_state st;
        memset(&st, 0, sizeof st);
        if (mt_ckpt_state_parse(path, &st, run, sizeof run) == 0) {
            const cJSON *r = cJSON_GetObjectItem(j, "run");
            if (!cJSON_IsString(r) || strncmp(run, r->valuestring, sizeof run - 1) != 0) __builtin_trap();
            if (st.step < 0 || st.cursor.epoch < 0 || st.cursor.index < 0) __builtin_trap();
            if (mt_train_state_check(&st, &d, 100, "fuzz") == 0) {
                if (st.step > 100) __builtin_trap();
                int32_t tokens[2 * 16], labels[2 * 16], mask[2 * 16];
                mt_data_cursor c = st.cursor;
                if (mt_data_next_batch(&d, &c, 2, 16, tokens, labels, mask) <= 0) __builtin_trap();
            }
        }
    }
    cJSON_Delete(j);
    return 0;
}
