// core/ledger.h — every byte of device memory, by category, with current and peak figures.
//
// Backends call mt_ledger_reserve() before allocating and mt_ledger_release() after freeing.
// The ledger is the planner's counterpart: the same categories, counted from a real step.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_MEM_BASE,    // frozen weights with their quantization constants
    MT_MEM_TRAIN,   // trainable weights
    MT_MEM_GRAD,    // gradients of trainable weights
    MT_MEM_OPTIM,   // optimizer state (Adam m, v)
    MT_MEM_MASTER,  // fp32 master weights
    MT_MEM_ACT,     // activations kept for backward
    MT_MEM_WORK,    // transient buffers
    MT_MEM_COMM,    // communication buffers
    MT_MEM_COUNT
} mt_mem_cat;

typedef struct mt_ledger {
    uint64_t cur[MT_MEM_COUNT], peak[MT_MEM_COUNT];
    uint64_t total_cur, total_peak;   // peak of the sum, not the sum of peaks
    uint64_t limit;                   // 0 = no limit; otherwise reservations beyond it fail
    uint64_t n_reserve;               // reservations made so far
    uint64_t fail_at;                 // testing: the fail_at-th reservation fails (1-based; 0 = off)
} mt_ledger;

const char *mt_mem_cat_name(mt_mem_cat c);  // "base", "train", ...
void mt_ledger_init(mt_ledger *l, uint64_t limit);
// Returns 0, or -1 with mt_error_set() naming the bytes asked, the category and the peak.
int mt_ledger_reserve(mt_ledger *l, mt_mem_cat c, uint64_t bytes);
void mt_ledger_release(mt_ledger *l, mt_mem_cat c, uint64_t bytes);
// Forget the peaks (e.g. after load, to measure one step alone).
void mt_ledger_reset_peak(mt_ledger *l);
// Human-readable table, one line per category, figures in GB (1e9) and GiB.
void mt_ledger_print(const mt_ledger *l, FILE *out);

#ifdef __cplusplus
}
#endif
