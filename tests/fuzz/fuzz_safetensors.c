// libFuzzer target: any bytes as a .safetensors file are either refused with an error or opened
// with every tensor inside the file; a file that opens survives write -> read -> equal.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[96], copy[112];
    snprintf(path, sizeof path, "/tmp/moetrain-fuzz-st-%d.safetensors", (int)getpid());
    snprintf(copy, sizeof copy, "%s.copy", path);
    if (mt_write_file_atomic(path, data, size) != 0) __builtin_trap();
    mt_st_file f;
    if (mt_st_file_open(&f, path) == 0) {
        const char *lo = f.map, *hi = lo + f.map_len;
        mt_st_entry *e = mt_xcalloc(f.n_tensors ? f.n_tensors : 1, sizeof *e);
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < f.n_tensors; i++) {
            const mt_st_tensor *t = &f.tensors[i];
            const char *d = t->data;
            if (t->nbytes && (d < lo || d + t->nbytes > hi)) __builtin_trap();  // inside the file
            for (uint64_t j = 0; j < t->nbytes; j++) sum += (uint8_t)d[j];
            e[i] = (mt_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
            memcpy(e[i].shape, t->shape, sizeof t->shape);
        }
        if (mt_st_write(copy, e, f.n_tensors, NULL, NULL, NULL) != 0) __builtin_trap();
        mt_st_file g;
        if (mt_st_file_open(&g, copy) != 0 || g.n_tensors != f.n_tensors) __builtin_trap();
        for (size_t i = 0; i < f.n_tensors; i++) {
            const mt_st_tensor *a = mt_st_file_find(&f, f.tensors[i].name), *b = mt_st_file_find(&g, a->name);
            if (!b || strcmp(a->dtype, b->dtype) || a->nbytes != b->nbytes ||
                (a->nbytes && memcmp(a->data, b->data, a->nbytes)))
                __builtin_trap();
        }
        mt_st_file_close(&g);
        free(e);
        mt_st_file_close(&f);
        unlink(copy);
    }
    unlink(path);
    return 0;
}
