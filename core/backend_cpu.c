// core/backend_cpu.c — the reference backend: host memory, fp32 compute, OpenBLAS for matmul (core/gemm.h).
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/gemm.h"

// glibc maps every block above its largest mmap threshold (32 MiB) afresh, so a step that frees
// and takes such a block again faults it in and zeroes it each time: at seq 2048, ~57,000 page
// faults a step from the loss's logits chunk (128 MiB at V = 32000) and the experts' backward
// scratch. The last CPU_KEPT such blocks freed (up to CPU_KEEP_MAX each: step scratch, not a
// freed model's weights) are kept for the next allocation of their size; only these stay
// resident beyond the ledger's count (a step's are reused by the next step).
enum { CPU_KEPT = 4, CPU_KEEP_SLACK = 64 << 10 };
#define CPU_KEEP_MIN ((size_t)32 << 20)
#define CPU_KEEP_MAX ((size_t)256 << 20)
static struct {
    void *p;
    size_t usable;   // malloc_usable_size: the request rounded up to its mapping
    uint64_t stamp;  // when it was kept: the oldest goes first
} cpu_kept[CPU_KEPT];
static uint64_t cpu_kept_clock;
static pthread_mutex_t cpu_kept_lock = PTHREAD_MUTEX_INITIALIZER;

// A kept block of the rounded size, taken out of the set, or NULL.
static void *cpu_kept_take(size_t rounded) {
    void *p = NULL;
    pthread_mutex_lock(&cpu_kept_lock);
    for (int i = 0; i < CPU_KEPT && !p; i++)
        if (cpu_kept[i].p && cpu_kept[i].usable >= rounded && cpu_kept[i].usable - rounded <= CPU_KEEP_SLACK) {
            p = cpu_kept[i].p;
            cpu_kept[i].p = NULL;
        }
    pthread_mutex_unlock(&cpu_kept_lock);
    return p;
}

// Keeps a freed block in an empty slot, or in place of the oldest kept one.
static void cpu_kept_put(void *ptr, size_t usable) {
    pthread_mutex_lock(&cpu_kept_lock);
    int slot = 0;
    for (int i = 0; i < CPU_KEPT; i++) {
        if (!cpu_kept[i].p) {
            slot = i;
            break;
        }
        if (cpu_kept[i].stamp < cpu_kept[slot].stamp) slot = i;
    }
    free(cpu_kept[slot].p);
    cpu_kept[slot].p = ptr, cpu_kept[slot].usable = usable, cpu_kept[slot].stamp = ++cpu_kept_clock;
    pthread_mutex_unlock(&cpu_kept_lock);
}

// Releases every kept block.
static void cpu_kept_clear(void) {
    pthread_mutex_lock(&cpu_kept_lock);
    for (int i = 0; i < CPU_KEPT; i++) free(cpu_kept[i].p), cpu_kept[i].p = NULL;
    pthread_mutex_unlock(&cpu_kept_lock);
}

static int cpu_alloc(mt_backend *be, size_t bytes, void **out) {
    (void)be;
    // 64-byte alignment for vector loads; aligned_alloc needs a multiple of the alignment.
    size_t rounded = (bytes + 63) & ~(size_t)63;
    *out = rounded >= CPU_KEEP_MIN && rounded <= CPU_KEEP_MAX ? cpu_kept_take(rounded) : NULL;
    if (!*out) *out = aligned_alloc(64, rounded ? rounded : 64);
    if (!*out) {
        mt_error_set("cpu backend: out of host memory allocating %zu bytes", bytes);
        return -1;
    }
    return 0;
}

static void cpu_free(mt_backend *be, void *ptr) {
    (void)be;
    size_t usable = ptr ? malloc_usable_size(ptr) : 0;
    if (usable >= CPU_KEEP_MIN && usable <= CPU_KEEP_MAX) cpu_kept_put(ptr, usable);
    else free(ptr);
}

static void cpu_copy(mt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_copy2d(mt_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows) {
    (void)be;
    for (size_t r = 0; r < rows && width; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

static void cpu_scale(mt_backend *be, void *x, mt_dtype dtype, size_t n, float s) {
    (void)be;
    if (dtype == MT_F32) {
        for (size_t i = 0; i < n; i++) ((float *)x)[i] *= s;
        return;
    }
    uint16_t *h = x;  // bf16: scaled in f32, rounded back to nearest even
    for (size_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(mt_bf16_to_f32(h[i]) * s);
}

static void cpu_fill_zero(mt_backend *be, void *dst, size_t bytes) {
    (void)be;
    if (bytes) memset(dst, 0, bytes);
}

// An f32 view of t: t's own data, or a converted copy held in the ledger under `work`.
static const float *as_f32(mt_backend *be, const mt_tensor *t, float **scratch) {
    *scratch = NULL;
    if (t->dtype == MT_F32) return t->data;
    size_t n = (size_t)mt_tensor_numel(t);
    if (mt_backend_alloc(be, MT_MEM_WORK, n * sizeof(float), (void **)scratch) != 0) return NULL;
    mt_convert(*scratch, MT_F32, t->data, t->dtype, n);
    return *scratch;
}

static void release_f32(mt_backend *be, const mt_tensor *t, float *scratch) {
    if (scratch) mt_backend_release(be, MT_MEM_WORK, (size_t)mt_tensor_numel(t) * sizeof(float), scratch);
}

static int is_float(mt_dtype t) { return t == MT_F32 || t == MT_BF16 || t == MT_F16; }

static int cpu_matmul(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_tensor *b,
                      int trans_a, int trans_b, float alpha, float beta) {
    int64_t m, n, k;
    if (mt_matmul_shapes(c, a, b, trans_a, trans_b, &m, &n, &k) != 0) return -1;
    if (!is_float(a->dtype) || !is_float(b->dtype) || !is_float(c->dtype)) {
        mt_error_set("cpu matmul: unsupported dtypes %s x %s -> %s", mt_dtype_name(a->dtype),
                     mt_dtype_name(b->dtype), mt_dtype_name(c->dtype));
        return -1;
    }
    const mt_tensor *ops[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (ops[i]->dtype != MT_F32 && mt_tensor_ld(ops[i]) != ops[i]->shape[1]) {
            mt_error_set("cpu matmul: a strided %s operand (only f32 ones may have a row stride)",
                         mt_dtype_name(ops[i]->dtype));
            return -1;
        }
    float *sa, *sb, *sc;
    const float *fa = as_f32(be, a, &sa), *fb = fa ? as_f32(be, b, &sb) : NULL;
    float *fc = fb ? (float *)as_f32(be, c, &sc) : NULL;
    int rc = -1;
    if (fc) {
        mt_sgemm(trans_a, trans_b, (int)m, (int)n, (int)k, alpha, fa, (int)mt_tensor_ld(a), fb,
                 (int)mt_tensor_ld(b), beta, fc, (int)mt_tensor_ld(c));
        if (sc) mt_convert(c->data, c->dtype, fc, MT_F32, (size_t)(m * n));
        rc = 0;
    }
    if (fc) release_f32(be, c, sc);
    if (fb) release_f32(be, b, sb);
    if (fa) release_f32(be, a, sa);
    return rc;
}

static void cpu_synchronize(mt_backend *be) { (void)be; }

static void cpu_destroy(mt_backend *be) {
    cpu_kept_clear();
    free(be);
}

static const mt_backend_ops cpu_ops = {
    .name = "cpu",
    .kind = MT_BACKEND_CPU,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .fill_zero = cpu_fill_zero,
    .copy = cpu_copy,
    .copy2d = cpu_copy2d,
    .scale = cpu_scale,
    .matmul = cpu_matmul,
    .synchronize = cpu_synchronize,
    .destroy = cpu_destroy,
};

// A step allocates and frees the same large work buffers every time. glibc serves blocks above
// its mmap threshold (dynamic, at most 32 MiB) with fresh mappings, so each step faulted in and
// zeroed its buffers again (~9,000 page faults a step at seq 128, the kernel's clear_page ~4% of
// the time). Served from the heap and not trimmed, a freed buffer's pages are there for the next
// step: the heap's high-water mark is the step's peak, which RSS reached anyway.
static void cpu_keep_freed_memory(void) {
    static int done;
    if (done) return;
    done = 1;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest (blocks above it: cpu_kept)
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

mt_backend *mt_backend_cpu_new(void) {
    cpu_keep_freed_memory();
    mt_backend *be = mt_xcalloc(1, sizeof *be);
    be->ops = &cpu_ops;
    mt_ledger_init(&be->ledger, 0);
    return be;
}
