// libFuzzer target: run-config YAML parsing never crashes, hangs or leaks, whatever the bytes.
#include <stdint.h>
#include <string.h>

#include "core/yaml.h"

static int count_pair(void *ctx, const char *key, const char *value, int line, int column) {
    (void)value;
    if (!key || line < 1 || column < 1) __builtin_trap();
    ++*(int *)ctx;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int pairs = 0;
    mt_yaml_read_flat_buffer("fuzz.yaml", (const char *)data, size, count_pair, &pairs);
    return 0;
}
