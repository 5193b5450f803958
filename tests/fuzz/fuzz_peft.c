// libFuzzer target: PEFT adapter_config.json and adapter tensor keys. What parses is in range
// (r in 1..65536, lora_alpha > 0, dropout in [0, 1)) and survives write -> read -> equal; a key
// that splits rebuilds to itself.
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "lora/peft.h"

static void config(const uint8_t *data, size_t size) {
    mt_peft_config c, back;
    memset(&c, 0, sizeof c);
    if (mt_peft_config_parse((const char *)data, size, "fuzz/adapter_config.json", &c) != 0) return;
    if (c.r < 1 || c.r > MT_PEFT_MAX_R || !(c.lora_alpha > 0) || !(c.lora_dropout >= 0 && c.lora_dropout < 1))
        __builtin_trap();
    char *names[] = {"w1"};
    mt_peft_targets t = {.n = 1, .names = names};
    char *json = mt_peft_config_json(&c, &t, NULL);
    memset(&back, 0, sizeof back);
    if (mt_peft_config_parse(json, strlen(json), "fuzz/written.json", &back) != 0) __builtin_trap();
    if (back.r != c.r || back.lora_alpha != c.lora_alpha || back.use_rslora != c.use_rslora ||
        back.lora_dropout != c.lora_dropout)
        __builtin_trap();
    free(json);
}

static void key(const uint8_t *data, size_t size) {
    char k[600], module[512], which, rebuilt[700];
    size_t n = size < sizeof k - 1 ? size : sizeof k - 1;
    memcpy(k, data, n);
    k[n] = 0;
    if (mt_peft_split_key(k, module, sizeof module, &which) != 0) return;
    if (which != 'A' && which != 'B') __builtin_trap();
    snprintf(rebuilt, sizeof rebuilt, "base_model.model.%s.lora_%c.weight", module, which);
    if (strcmp(rebuilt, k) != 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    config(data, size);
    key(data, size);
    return 0;
}
