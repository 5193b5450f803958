// libFuzzer target: loading a PEFT adapter folder (lora/peft.h), v4 and v5 layouts, never
// crashes. Input: a little-endian u16 L, then L bytes of adapter_config.json, then the bytes of
// adapter_model.safetensors. What loads: r in range, and every pair handed over has A [r', in]
// and B [out, r'] of one rank r' >= 1 with sizes that fit their data; a refusal names a file of
// the folder.
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "lora/peft.h"
#include "tests/fuzz/fuzz_common.h"

static int check_pair(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    (void)ctx;
    if (!module || !module[0] || a->ndim != 2 || b->ndim != 2) __builtin_trap();
    if (a->shape[0] < 1 || a->shape[0] != b->shape[1] || a->shape[1] < 1 || b->shape[0] < 1) __builtin_trap();
    uint64_t na = (uint64_t)a->shape[0] * (uint64_t)a->shape[1], nb = (uint64_t)b->shape[0] * (uint64_t)b->shape[1];
    if (a->nbytes * 8 < na * (uint64_t)a->dtype_bits || b->nbytes * 8 < nb * (uint64_t)b->dtype_bits) __builtin_trap();
    volatile uint8_t sink = 0;  // the data is readable to its end (ASan checks)
    if (a->nbytes) sink ^= ((const uint8_t *)a->data)[a->nbytes - 1];
    if (b->nbytes) sink ^= ((const uint8_t *)b->data)[b->nbytes - 1];
    (void)sink;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_log_set_level(MT_LOG_ERROR);
    if (size < 2) return 0;
    size_t len = (size_t)data[0] | (size_t)data[1] << 8;
    if (len > size - 2) len = size - 2;
    const char *dir = fuzz_dir("adapter");
    char cfg_path[256], st_path[256];
    snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
    fuzz_write(cfg_path, data + 2, len);
    fuzz_write(st_path, data + 2 + len, size - 2 - len);
    mt_peft_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (mt_peft_read(dir, &cfg, check_pair, NULL) == 0) {
        if (cfg.r < 1 || cfg.r > MT_PEFT_MAX_R || !(cfg.lora_alpha > 0)) __builtin_trap();
    } else if (!strstr(mt_error_get(), "adapter_") && !strstr(mt_error_get(), dir)) {
        __builtin_trap();  // a refusal names the folder or one of its files
    }
    return 0;
}
