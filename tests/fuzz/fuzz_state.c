// libFuzzer target: a checkpoint's state.json. Verifying any bytes as a checkpoint never crashes
// and never passes for what moetrain did not seal; any JSON object, sealed, reads back equal, and
// the same text with one byte changed is always refused.
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "tests/fuzz/fuzz_common.h"
#include "trainer/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_log_set_level(MT_LOG_ERROR);
    char dir[200], path[256];
    snprintf(dir, sizeof dir, "%s/ck", fuzz_dir("state"));
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/state.json", dir);
    // 1. the bytes as they come: verify (checksum, then every listed file in the folder)
    fuzz_write(path, data, size);
    (void)mt_checkpoint_verify(dir, 0);
    // 2. the bytes as JSON, sealed: reads back equal; one changed byte is refused
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    if (cJSON_IsObject(j) && !cJSON_GetObjectItemCaseSensitive(j, "sha256")) {
        char *text = mt_ckpt_state_seal(j);
        size_t len = strlen(text);
        fuzz_write(path, text, len);
        cJSON *back;
        if (mt_ckpt_state_read(path, &back) != 0) __builtin_trap();
        cJSON_DeleteItemFromObjectCaseSensitive(back, "sha256");
        char *a = cJSON_PrintUnformatted(j), *b = cJSON_PrintUnformatted(back);  // duplicate keys too
        if (strcmp(a, b) != 0) __builtin_trap();
        free(a), free(b);
        cJSON_Delete(back);
        size_t at = (size * 2654435761u) % len;
        text[at] ^= (char)(1u << (size % 8));
        fuzz_write(path, text, len);
        if (mt_ckpt_state_read(path, &back) == 0) __builtin_trap();
        free(text);
    }
    cJSON_Delete(j);
    return 0;
}
