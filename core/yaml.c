// core/yaml.c — placeholder until the YAML reader lands.
#include "core/yaml.h"
#include "core/common.h"
int mt_yaml_read_flat(const char *path, mt_yaml_pair_fn fn, void *ctx) {
    (void)fn, (void)ctx;
    mt_error_set("%s: YAML run configs are not read yet", path);
    return -1;
}
