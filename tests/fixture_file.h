// tests/fixture_file.h — reading a committed .safetensors fixture in a test: a tensor that must be
// there, an aligned copy of its bytes, a float's bits. Include after criterion.h.
#pragma once
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "core/safetensors.h"

static inline const mt_st_tensor *st_need(const mt_st_file *f, const char *name) {
    const mt_st_tensor *t = mt_st_file_find(f, name);
    cr_assert_not_null(t, "%s: no tensor '%s'", f->path, name);
    return t;
}

// A copy of t's bytes (the mmap is not aligned); the caller frees it.
static inline void *st_copy(const mt_st_tensor *t) {
    void *p = mt_xmalloc(t->nbytes ? t->nbytes : 1);
    memcpy(p, t->data, t->nbytes);
    return p;
}

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
