// trainer/option_ranges.c — the range of every numeric setting, checked when it is set (flag or
// YAML key) so that the error names the flag before anything is loaded, and shown in --help.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "trainer/options.h"

typedef struct {
    const char *key;
    double lo, hi;
    int lo_open, hi_open;  // 1: the bound itself is excluded
} opt_range;

static const opt_range ranges[] = {
    {"r", 1, 65536, 0, 0},
    {"alpha", 0, 1e6, 1, 0},
    {"dropout", 0, 1, 0, 1},  // 1 would drop every input: the adapter would never train
    {"shard-size", 1e3, 1e15, 0, 0},
    {"seq", 2, 1 << 20, 0, 0},
    {"batch", 1, 65536, 0, 0},
    {"gpus", 1, 65536, 0, 0},
    {"ep", 1, 65536, 0, 0},
    {"zero", 0, 2, 0, 0},
    {"gpu-mem", 1e6, 1e15, 0, 0},
    {"workspace", 0, 1e15, 0, 0},
    {"steps", 0, 1e12, 0, 0},
    {"epochs", 0, 1e6, 1, 0},
    {"accum", 1, 65536, 0, 0},
    {"lr", 0, 10, 1, 0},
    {"warmup", 0, 1e12, 0, 0},
    {"clip", 0, 1e6, 0, 0},
    {"weight-decay", 0, 10, 0, 0},
    {"aux-coef", 0, 1e3, 0, 0},
    {"z-coef", 0, 1e3, 0, 0},
    {"seq-aux-coef", 0, 1e3, 0, 0},
    {"router-bias-update", 0, 1, 0, 0},
    {"save-every", 0, 1e12, 0, 0},
    {"save-total-limit", 0, 1e6, 0, 0},
    {"eval-every", 0, 1e12, 0, 0},
    {"mem", 0, 1e15, 0, 0},
    {"max-line-bytes", 4096, 1e15, 0, 0},
    {"max-skips", 0, 1e6, 0, 0},
    {"early-stop-patience", 0, 1e6, 0, 0},
    {"max-new-tokens", 0, 1 << 20, 0, 0},
    {"temperature", 0, 100, 0, 0},
    {"top-p", 0, 1, 1, 0},
};

static const opt_range *find(const char *key) {
    for (size_t i = 0; i < MT_ARRAY_LEN(ranges); i++)
        if (strcmp(ranges[i].key, key) == 0) return &ranges[i];
    return NULL;
}

int mt_opt_range_text(const char *key, char *buf, size_t n) {
    const opt_range *r = find(key);
    if (!r) return 0;
    snprintf(buf, n, "%s%.15g, %.15g%s", r->lo_open ? "(" : "[", r->lo, r->hi, r->hi_open ? ")" : "]");
    return 1;
}

int mt_opt_range_check(const char *key, double v, const char *text) {
    const opt_range *r = find(key);
    if (!r) return 0;
    int ok = isfinite(v) && (r->lo_open ? v > r->lo : v >= r->lo) && (r->hi_open ? v < r->hi : v <= r->hi);
    if (ok) return 0;
    char range[96];
    mt_opt_range_text(key, range, sizeof range);
    // A size given without its unit ("--gpu-mem 24") reads as bytes: say how to write it.
    static const char *const sizes[] = {"gpu-mem", "mem", "workspace", "shard-size", "max-line-bytes"};
    int is_size = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(sizes); i++) is_size |= strcmp(key, sizes[i]) == 0;
    if (is_size && text[0] && strspn(text, "0123456789.") == strlen(text) && v < r->lo)
        mt_error_set("'%s' is outside its range %s (bytes): add a unit, e.g. %sGB or %sGiB", text, range, text, text);
    else
        mt_error_set("'%s' is outside its range %s", text, range);
    return -1;
}
