// libFuzzer target: config.json parsing never crashes; what parses, writes and reads back equal.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_model_config cfg, back;
    memset(&cfg, 0, sizeof cfg);
    if (mt_model_config_parse((const char *)data, size, "fuzz.json", &cfg) != 0) return 0;
    char path[64];
    snprintf(path, sizeof path, "/tmp/moetrain-fuzz-config-%d.json", (int)getpid());
    if (mt_model_config_write(&cfg, path) != 0) __builtin_trap();
    memset(&back, 0, sizeof back);
    if (mt_model_config_load(path, &back) != 0) __builtin_trap();
    if (memcmp(&cfg, &back, sizeof cfg) != 0) __builtin_trap();  // write -> read -> equal
    unlink(path);
    return 0;
}
