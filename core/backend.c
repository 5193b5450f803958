// core/backend.c — backend selection, ledger-checked allocation and tensors.
#include "core/backend.h"
#include "core/gemm_rows.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

// The ledger is shared by every thread that allocates: the cpu runs a layer's experts in
// parallel (model/experts.c), each taking its own work scratch.
static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;

mt_backend *mt_backend_new(const char *name) {
    if (strcmp(name, "cpu") == 0) return mt_backend_cpu_new();
    if (strcmp(name, "null") == 0) return mt_backend_null_new();
    if (strcmp(name, "cuda") == 0) return mt_backend_cuda_new(0);
    mt_error_set("unknown backend '%s' (expected cpu, cuda or null)", name);
    return NULL;
}

void mt_backend_free(mt_backend *be) {
    if (be) be->ops->destroy(be);
}

int mt_backend_alloc(mt_backend *be, mt_mem_cat cat, size_t bytes, void **out) {
    *out = NULL;
    pthread_mutex_lock(&ledger_lock);
    mt_ledger before = be->ledger;
    int rc = mt_ledger_reserve(&be->ledger, cat, bytes);
    if (rc == 0 && be->ops->alloc(be, bytes, out) != 0) {
        // The device refused: undo the reservation, peaks included (nothing was ever held).
        uint64_t n_reserve = be->ledger.n_reserve;
        be->ledger = before;
        be->ledger.n_reserve = n_reserve;
        rc = -1;
    }
    pthread_mutex_unlock(&ledger_lock);
    return rc;
}

void mt_backend_release(mt_backend *be, mt_mem_cat cat, size_t bytes, void *ptr) {
    pthread_mutex_lock(&ledger_lock);
    be->ops->free(be, ptr);
    mt_ledger_release(&be->ledger, cat, bytes);
    pthread_mutex_unlock(&ledger_lock);
}

mt_tensor *mt_tensor_new(mt_backend *be, mt_mem_cat cat, mt_dtype dtype, int ndim,
                         const int64_t *shape) {
    if (ndim < 0 || ndim > MT_MAX_DIMS) {
        mt_error_set("tensor rank %d outside 0..%d", ndim, MT_MAX_DIMS);
        return NULL;
    }
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || !mt_mul_ok(n, (uint64_t)shape[i], &n)) {
            mt_error_set("tensor shape dimension %d (%lld) is negative or overflows", i,
                         (long long)shape[i]);
            return NULL;
        }
    }
    mt_tensor *t = mt_xcalloc(1, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->nbytes = mt_dtype_bytes(dtype, n);
    t->be = be;
    t->cat = cat;
    if (mt_backend_alloc(be, cat, t->nbytes, &t->data) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

void mt_tensor_free(mt_tensor *t) {
    if (!t) return;
    mt_backend_release(t->be, t->cat, t->nbytes, t->data);
    free(t);
}

int64_t mt_tensor_numel(const mt_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

void mt_tensor_upload(mt_tensor *t, const void *host_src) {
    t->be->ops->upload(t->be, t->data, host_src, t->nbytes);
}

void mt_tensor_upload_f32(mt_tensor *t, const float *host_src) {
    if (t->dtype == MT_F32) return mt_tensor_upload(t, host_src);
    void *raw = mt_xmalloc(t->nbytes ? t->nbytes : 1);
    mt_convert(raw, t->dtype, host_src, MT_F32, (size_t)mt_tensor_numel(t));
    mt_tensor_upload(t, raw);
    free(raw);
}

void mt_tensor_download_f32(const mt_tensor *t, float *host_dst) {
    if (t->dtype == MT_F32) return mt_tensor_download(t, host_dst);
    void *raw = mt_xmalloc(t->nbytes ? t->nbytes : 1);
    mt_tensor_download(t, raw);
    mt_convert(host_dst, MT_F32, raw, t->dtype, (size_t)mt_tensor_numel(t));
    free(raw);
}

void mt_tensor_download(const mt_tensor *t, void *host_dst) {
    t->be->ops->download(t->be, host_dst, t->data, t->nbytes);
}

void mt_download_begin(mt_backend *be, void *host_dst, const void *src, size_t bytes) {
    if (be->ops->kind == MT_BACKEND_CUDA) mt_cuda_download_begin(be, host_dst, src, bytes);
    else be->ops->download(be, host_dst, src, bytes);
}

void mt_download_end(mt_backend *be) {
    if (be->ops->kind == MT_BACKEND_CUDA) mt_cuda_download_end(be);
}

mt_tensor mt_view2(mt_backend *be, const void *p, mt_dtype dtype, int64_t rows, int64_t cols, int64_t ld) {
    mt_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype, t.ndim = 2, t.shape[0] = rows, t.shape[1] = cols, t.ld = ld == cols ? 0 : ld;
    t.nbytes = rows ? mt_dtype_bytes(dtype, (size_t)((rows - 1) * (ld ? ld : cols) + cols)) : 0;
    t.data = (void *)p, t.be = be, t.cat = MT_MEM_WORK;
    return t;
}

mt_tensor mt_view_rows(const mt_tensor *t, int64_t row0, int64_t rows) {
    int64_t ld = mt_tensor_ld(t);
    const char *p = t->data ? (const char *)t->data + mt_dtype_bytes(t->dtype, (size_t)(row0 * ld)) : NULL;
    return mt_view2(t->be, p, t->dtype, rows, t->shape[1], ld);
}

int mt_matmul(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, int trans_a, int trans_b,
              float alpha, float beta) {
    if (a->be != c->be || b->be != c->be) {
        mt_error_set("matmul: operands live on different backends");
        return -1;
    }
    return c->be->ops->matmul(c->be, c, a, b, trans_a, trans_b, alpha, beta);
}

// Shape check shared by every backend's matmul: fills M, N, K or reports the mismatch.
int mt_matmul_shapes(const mt_tensor *c, const mt_tensor *a, const mt_tensor *b, int trans_a,
                     int trans_b, int64_t *m, int64_t *n, int64_t *k) {
    if (a->ndim != 2 || b->ndim != 2 || c->ndim != 2) {
        mt_error_set("matmul: operands must be 2-D (got %d, %d -> %d)", a->ndim, b->ndim, c->ndim);
        return -1;
    }
    *m = trans_a ? a->shape[1] : a->shape[0];
    *k = trans_a ? a->shape[0] : a->shape[1];
    int64_t kb = trans_b ? b->shape[1] : b->shape[0];
    *n = trans_b ? b->shape[0] : b->shape[1];
    if (kb != *k || c->shape[0] != *m || c->shape[1] != *n) {
        mt_error_set("matmul: shapes do not agree: op(a) [%lld, %lld], op(b) [%lld, %lld], c [%lld, %lld]",
                     (long long)*m, (long long)*k, (long long)kb, (long long)*n,
                     (long long)c->shape[0], (long long)c->shape[1]);
        return -1;
    }
    const mt_tensor *ops[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (mt_tensor_ld(ops[i]) < ops[i]->shape[1]) {
            mt_error_set("matmul: %c has a row stride of %lld elements, below its %lld columns", "abc"[i],
                         (long long)ops[i]->ld, (long long)ops[i]->shape[1]);
            return -1;
        }
    return 0;
}

#ifndef MT_CUDA
static const char CPU_BUILD[] =
    "this moetrain is the CPU build: the CUDA one is build-cuda/moetrain (`make CUDA=1` builds it; --device cuda runs there)";

void mt_cuda_backend_sync(mt_backend *be) { (void)be; }
mt_backend *mt_backend_cuda_new(int device) {
    (void)device;
    mt_error_set("%s", CPU_BUILD);
    return NULL;
}
int mt_cuda_device_count(void) { return 0; }
int mt_cuda_gemm_sm_reserve(mt_backend *be, int reserve) {
    (void)be, (void)reserve;
    mt_error_set("%s", CPU_BUILD);
    return -1;
}
int mt_cuda_gemm_sm_reserved(mt_backend *be) {
    (void)be;
    return 0;
}
void mt_cuda_download_begin(mt_backend *be, void *host_dst, const void *src, size_t bytes) {
    (void)be, (void)host_dst, (void)src, (void)bytes;
    mt_fatal(MT_EXIT_ERROR, "%s", CPU_BUILD);  // no cuda backend exists in this build
}
void mt_cuda_download_end(mt_backend *be) {
    (void)be;
    mt_fatal(MT_EXIT_ERROR, "%s", CPU_BUILD);
}
uint64_t mt_cuda_matmul_plans_built(mt_backend *be) {
    (void)be;
    mt_error_set("%s", CPU_BUILD);
    return 0;
}

int mt_cuda_mem_info(mt_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    *free_bytes = *total_bytes = 0;
    mt_error_set("%s", CPU_BUILD);
    return -1;
}

int mt_cuda_mem_peak_start(mt_backend *be) {
    size_t f, t;
    return mt_cuda_mem_info(be, &f, &t);
}

int mt_cuda_mem_trim(mt_backend *be) {
    size_t f, t;
    return mt_cuda_mem_info(be, &f, &t);
}

int mt_cuda_mem_peak_stop(mt_backend *be, size_t *used_peak) {
    *used_peak = 0;
    return mt_cuda_mem_peak_start(be);
}

// core/gemm_rows.h: a cuBLASLt call, so CUDA builds only.
int mt_gemm_rows_available(mt_backend *be, char *why, size_t why_bytes) {
    (void)be;
    if (why) snprintf(why, why_bytes, "%s", CPU_BUILD);
    return 0;
}
int mt_gemm_rows_checked(mt_backend *be, char *why, size_t why_bytes) { return mt_gemm_rows_available(be, why, why_bytes); }
uint64_t mt_gemm_rows_heuristic_calls(void) { return 0; }
int mt_gemm_rows(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_tensor *const *w, int trans, int experts,
                 const int32_t *off, int64_t rows_total, float alpha, float beta, void *scratch) {
    (void)be, (void)c, (void)a, (void)w, (void)trans, (void)experts, (void)off, (void)rows_total, (void)alpha;
    (void)beta, (void)scratch;
    return mt_error_set("mt_gemm_rows: %s", CPU_BUILD), -1;
}
int mt_gemm_rows_tn(mt_backend *be, mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y, int experts,
                    const int32_t *off, int64_t rows_total, float alpha, float beta, void *scratch) {
    (void)be, (void)g, (void)x, (void)y, (void)experts, (void)off, (void)rows_total, (void)alpha, (void)beta;
    (void)scratch;
    return mt_error_set("mt_gemm_rows_tn: %s", CPU_BUILD), -1;
}
#endif

void *mt_work_alloc(mt_backend *be, size_t bytes) {
    void *p;
    if (mt_backend_alloc(be, MT_MEM_WORK, bytes, &p) != 0) mt_fatal(MT_EXIT_OOM, "%s", mt_error_get());
    return p;
}

void mt_work_free(mt_backend *be, void *ptr, size_t bytes) {
    mt_backend_release(be, MT_MEM_WORK, bytes, ptr);  // ptr is NULL on the null backend
}
