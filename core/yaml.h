// core/yaml.h — run configs: a flat YAML mapping of option names to scalars or lists.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Called once per key, in file order. A sequence value arrives joined with ",".
// Return 0 to go on, non-zero to stop (the error is then the callback's own).
typedef int (*mt_yaml_pair_fn)(void *ctx, const char *key, const char *value, int line, int column);

// Reads `path` as a flat mapping. Depth, size, aliases and duplicate keys are bounded or refused
// (docs/design.md, "Reliability"): errors name the file, line and column. 0, or -1 with mt_error_set().
int mt_yaml_read_flat(const char *path, mt_yaml_pair_fn fn, void *ctx);
// The same on text in memory; `name` stands for the file in errors.
int mt_yaml_read_flat_buffer(const char *name, const char *buf, size_t len, mt_yaml_pair_fn fn,
                             void *ctx);

#ifdef __cplusplus
}
#endif
