// core/backend_null.c — allocates nothing and computes nothing; the ledger still counts every
// byte, so running a real step on it measures the memory plan of a model of any size.
#include <string.h>

#include "core/backend.h"
#include "core/common.h"

static int null_alloc(mt_backend *be, size_t bytes, void **out) {
    (void)be, (void)bytes;
    *out = NULL;
    return 0;
}

static void null_free(mt_backend *be, void *ptr) { (void)be, (void)ptr; }

static void null_upload(mt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be, (void)dst, (void)src, (void)bytes;
}

// Reads from the null device yield zeros, so callers never see uninitialised host memory.
static void null_download(mt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be, (void)src;
    if (bytes) memset(dst, 0, bytes);
}

static void null_fill_zero(mt_backend *be, void *dst, size_t bytes) { (void)be, (void)dst, (void)bytes; }
static void null_scale(mt_backend *be, void *x, mt_dtype dtype, size_t n, float s) {
    (void)be, (void)x, (void)dtype, (void)n, (void)s;
}
static void null_copy(mt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be, (void)dst, (void)src, (void)bytes;
}

static void null_copy2d(mt_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows) {
    (void)be, (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)rows;
}

static int null_matmul(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_tensor *b,
                       int trans_a, int trans_b, float alpha, float beta) {
    (void)be, (void)alpha, (void)beta;
    int64_t m, n, k;
    return mt_matmul_shapes(c, a, b, trans_a, trans_b, &m, &n, &k);
}

static void null_synchronize(mt_backend *be) { (void)be; }
static void null_destroy(mt_backend *be) { free(be); }

static const mt_backend_ops null_ops = {
    .name = "null",
    .kind = MT_BACKEND_NULL,
    .alloc = null_alloc,
    .free = null_free,
    .upload = null_upload,
    .download = null_download,
    .fill_zero = null_fill_zero,
    .copy = null_copy,
    .copy2d = null_copy2d,
    .scale = null_scale,
    .matmul = null_matmul,
    .synchronize = null_synchronize,
    .destroy = null_destroy,
};

mt_backend *mt_backend_null_new(void) {
    mt_backend *be = mt_xcalloc(1, sizeof *be);
    be->ops = &null_ops;
    mt_ledger_init(&be->ledger, 0);
    return be;
}
