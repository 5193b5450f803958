// core/ledger.c — device-memory accounting by category.
#include "core/ledger.h"

#include <string.h>

#include "core/common.h"

static const char *cat_names[MT_MEM_COUNT] = {
    [MT_MEM_BASE] = "base", [MT_MEM_TRAIN] = "train", [MT_MEM_GRAD] = "grad",
    [MT_MEM_OPTIM] = "optim", [MT_MEM_MASTER] = "master", [MT_MEM_ACT] = "act",
    [MT_MEM_WORK] = "work", [MT_MEM_COMM] = "comm",
};

const char *mt_mem_cat_name(mt_mem_cat c) { return c < MT_MEM_COUNT ? cat_names[c] : "?"; }

void mt_ledger_init(mt_ledger *l, uint64_t limit) {
    memset(l, 0, sizeof *l);
    l->limit = limit;
}

int mt_ledger_reserve(mt_ledger *l, mt_mem_cat c, uint64_t bytes) {
    l->n_reserve++;
    if (l->fail_at && l->n_reserve == l->fail_at) {
        mt_error_set("allocation #%llu of %llu bytes (%s) failed (injected fault); ledger peak %llu bytes",
                     (unsigned long long)l->n_reserve, (unsigned long long)bytes, cat_names[c],
                     (unsigned long long)l->total_peak);
        return -1;
    }
    if (l->limit && (bytes > l->limit || l->total_cur > l->limit - bytes)) {
        mt_error_set("out of device memory: asked %llu bytes (%s) with %llu in use of a %llu-byte limit; "
                     "ledger peak %llu bytes",
                     (unsigned long long)bytes, cat_names[c], (unsigned long long)l->total_cur,
                     (unsigned long long)l->limit, (unsigned long long)l->total_peak);
        return -1;
    }
    l->cur[c] += bytes;
    if (l->cur[c] > l->peak[c]) l->peak[c] = l->cur[c];
    l->total_cur += bytes;
    if (l->total_cur > l->total_peak) l->total_peak = l->total_cur;
    return 0;
}

void mt_ledger_release(mt_ledger *l, mt_mem_cat c, uint64_t bytes) {
    if (bytes > l->cur[c])
        mt_fatal(MT_EXIT_ERROR, "ledger: releasing %llu bytes of %s with only %llu held",
                 (unsigned long long)bytes, cat_names[c], (unsigned long long)l->cur[c]);
    l->cur[c] -= bytes;
    l->total_cur -= bytes;
}

void mt_ledger_reset_peak(mt_ledger *l) {
    for (int c = 0; c < MT_MEM_COUNT; c++) l->peak[c] = l->cur[c];
    l->total_peak = l->total_cur;
}

void mt_ledger_print(const mt_ledger *l, FILE *out) {
    fprintf(out, "%-8s %14s %14s %10s\n", "category", "current (B)", "peak (B)", "peak GB");
    for (int c = 0; c < MT_MEM_COUNT; c++)
        fprintf(out, "%-8s %14llu %14llu %10.3f\n", cat_names[c], (unsigned long long)l->cur[c],
                (unsigned long long)l->peak[c], l->peak[c] / 1e9);
    fprintf(out, "%-8s %14llu %14llu %10.3f  (%.3f GiB)\n", "total", (unsigned long long)l->total_cur,
            (unsigned long long)l->total_peak, l->total_peak / 1e9, l->total_peak / 1073741824.0);
}
