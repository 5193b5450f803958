// libFuzzer target: a sharded checkpoint's model.safetensors.index.json (its weight_map). Opening
// the folder never crashes; what opens holds exactly the tensors the index lists, each in the
// shard the index names, and no shard outside the folder.
#include <cjson/cJSON.h>
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "core/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

// Two real shards (written once): a.safetensors holds "x", b.safetensors holds "y" and "z".
static void shards(const char *dir) {
    static int done;
    if (done) return;
    char path[256];
    static const float v[4] = {1, 2, 3, 4};
    const char *names[] = {"x", "y", "z"};
    for (int s = 0; s < 2; s++) {
        mt_st_entry e[2];
        int n = s ? 2 : 1;
        for (int i = 0; i < n; i++)
            e[i] = (mt_st_entry){.name = names[s + i], .dtype = "F32", .ndim = 1, .shape = {4}, .data = v};
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, s ? "b" : "a");
        if (mt_st_write(path, e, (size_t)n, NULL, NULL, NULL) != 0) __builtin_trap();
    }
    done = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_dir("index");
    shards(dir);
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    fuzz_write(path, data, size);
    mt_st_model m;
    if (mt_st_model_open(&m, dir) == 0) {
        cJSON *j = cJSON_ParseWithLength((const char *)data, size);
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map"), *e;
        size_t listed = 0;
        cJSON_ArrayForEach(e, wm) {
            listed++;
            const mt_st_tensor *t = mt_st_model_find(&m, e->string);
            if (!t || !cJSON_IsString(e) || strchr(e->valuestring, '/')) __builtin_trap();
            const char *file = m.files[t->file_index].path, *base = strrchr(file, '/');
            if (strcmp(base ? base + 1 : file, e->valuestring) != 0) __builtin_trap();
        }
        if (listed != m.n_tensors) __builtin_trap();
        cJSON_Delete(j);
        mt_st_model_close(&m);
    }
    return 0;
}
