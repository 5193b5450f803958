// core/gemm_rows_cuda.cu — core/gemm_rows.h on the cuda backend: one kernel writes the call's
// per-group pointers and shapes from the device offsets, one cuBLASLt grouped matmul reads them.
//
// The column-major view cuBLASLt takes (as core/backend_cuda.cu's matmul: a row-major [r, c]
// matrix with row stride ld is a column-major [c, r] one with the same ld):
//   mt_gemm_rows     D_e [N, n_e] = op(W_e) · A_eᵀ: cuBLAS's A is W_e ([K, N] column-major, op T,
//                    when trans; else [N, K], op N), its B the group's rows of a ([K, n_e]).
//   mt_gemm_rows_tn  D_e [N, M] = Y_eᵀ-as-stored · X_e: cuBLAS's A is the rows of y ([N, n_e],
//                    op N), its B the rows of x ([M, n_e], op T); the reduction is n_e.
// alpha and beta are device scalars (CUBLASLT_POINTER_MODE_DEVICE, as the grouped matmul on
// Hopper takes one pair for all groups), written by the same kernel: no host buffer to keep.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "core/cublaslt_grouped.h"
#include "core/cuda_check.h"
#include "core/gemm_rows.h"
#include "core/profile.h"

// The scratch's arrays, at fixed places (MT_GEMM_ROWS_SCRATCH_BYTES).
enum { GMAX = MT_GEMM_ROWS_MAX };
struct rows_arrays {
    void *ptr[4][GMAX];       // A, B, C, D of each group
    int32_t shape[9][GMAX];   // rows, cols, ld of A, B, D (C shares D's)
    float alpha, beta;
};
static_assert(sizeof(rows_arrays) <= MT_GEMM_ROWS_SCRATCH_BYTES, "MT_GEMM_ROWS_SCRATCH_BYTES is too small");
enum { A_ROWS, A_COLS, A_LD, B_ROWS, B_COLS, B_LD, D_ROWS, D_COLS, D_LD };

// What the kernel needs, as its parameter: the uniform operand's pointers (w or g, one per
// group) and the row operands' bases, strides and element sizes.
struct rows_setup {
    const void *per_group[GMAX];  // w[e] (forward) or g[e] (tn)
    const char *rows_a, *rows_b;  // forward: a, c (the D); tn: y, x
    int64_t ld_a, ld_b, es_a, es_b;
    int32_t fixed_rows, fixed_cols, fixed_ld;  // the per-group operand's column-major shape
    int32_t width_a, width_b;                  // columns of the row operands' rows (their "rows")
    int tn;
    float alpha, beta;
};

// One thread per group: its rows from off, its pointers and shapes into the scratch.
static __global__ void rows_setup_kernel(const __grid_constant__ rows_setup S, const int32_t *__restrict__ off, int n,
                                         rows_arrays *out) {
    int e = threadIdx.x;
    if (e == 0) out->alpha = S.alpha, out->beta = S.beta;
    if (e >= n) return;
    const int32_t r0 = off[e], ne = off[e + 1] - off[e];
    const void *ra = S.rows_a + (int64_t)r0 * S.ld_a * S.es_a, *rb = S.rows_b + (int64_t)r0 * S.ld_b * S.es_b;
    if (!S.tn) {  // A = W_e, B = a's rows, C = D = c's rows
        out->ptr[0][e] = (void *)S.per_group[e], out->ptr[1][e] = (void *)ra;
        out->ptr[2][e] = out->ptr[3][e] = (void *)rb;
        out->shape[A_ROWS][e] = S.fixed_rows, out->shape[A_COLS][e] = S.fixed_cols, out->shape[A_LD][e] = S.fixed_ld;
        out->shape[B_ROWS][e] = S.width_a, out->shape[B_COLS][e] = ne, out->shape[B_LD][e] = (int32_t)S.ld_a;
        out->shape[D_ROWS][e] = S.width_b, out->shape[D_COLS][e] = ne, out->shape[D_LD][e] = (int32_t)S.ld_b;
    } else {      // A = y's rows, B = x's rows, C = D = g_e
        out->ptr[0][e] = (void *)ra, out->ptr[1][e] = (void *)rb;
        out->ptr[2][e] = out->ptr[3][e] = (void *)S.per_group[e];
        out->shape[A_ROWS][e] = S.width_a, out->shape[A_COLS][e] = ne, out->shape[A_LD][e] = (int32_t)S.ld_a;
        out->shape[B_ROWS][e] = S.width_b, out->shape[B_COLS][e] = ne, out->shape[B_LD][e] = (int32_t)S.ld_b;
        out->shape[D_ROWS][e] = S.fixed_rows, out->shape[D_COLS][e] = S.fixed_cols, out->shape[D_LD][e] = S.fixed_ld;
    }
}

// ---------------------------------------------------------------------------------------------
// The library's function, found once

static mt_lt_grouped_layout_create_fn layout_create;
static int lookup_state;  // 0: not tried, 1: found, -1: missing

static mt_lt_grouped_layout_create_fn find_layout_create(void) {
    if (lookup_state) return layout_create;
#ifdef MT_CUDASIM
    layout_create = cublasLtGroupedMatrixLayoutCreate;  // the emulator's stand-in is linked in
#else
    // The library this program is linked to is loaded already; RTLD_NOLOAD finds it by soname.
    void *lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_NOLOAD);
    if (lib) layout_create = (mt_lt_grouped_layout_create_fn)dlsym(lib, "cublasLtGroupedMatrixLayoutCreate");
#endif
    lookup_state = layout_create ? 1 : -1;
    return layout_create;
}

extern "C" int mt_gemm_rows_available(mt_backend *be, char *why, size_t why_bytes) {
    char local[160];
    if (!why) why = local, why_bytes = sizeof local;
    if (be->ops->kind != MT_BACKEND_CUDA) return snprintf(why, why_bytes, "backend %s is not cuda", be->ops->name), 0;
    mt_cuda_backend_enter(be);
    int dev = 0, major = 0;
    MT_CHECK_CUDA(cudaGetDevice(&dev));
    MT_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    const size_t v = cublasLtGetVersion();
    // Hopper only: there the grouped matmul takes one alpha and beta for all groups, as this
    // file passes them; Blackwell's takes per-group scalars (its callers pass arrays), not done.
    if (major != 9)
        return snprintf(why, why_bytes, "the grouped matmul is used on Hopper only (compute capability 9.x), not %d.x",
                        major), 0;
    if (v < MT_LT_GROUPED_VERSION_HOPPER)
        return snprintf(why, why_bytes, "cuBLASLt %zu.%zu.%zu has no grouped matmul for compute capability %d.x "
                        "(it came with %d.%d)", v / 10000, v % 10000 / 100, v % 100, major,
                        MT_LT_GROUPED_VERSION_HOPPER / 10000, MT_LT_GROUPED_VERSION_HOPPER % 10000 / 100), 0;
    if (v >= MT_LT_GROUPED_BAD_FROM && v < MT_LT_GROUPED_BAD_UNTIL)  // grouped outputs at separate addresses
        return snprintf(why, why_bytes, "cuBLASLt %zu.%zu.%zu corrupts grouped outputs at separate addresses "
                        "(13.7.0 to 13.8.0, as NVIDIA's TransformerEngine records)", v / 10000, v % 10000 / 100,
                        v % 100), 0;
    if (!find_layout_create())
        return snprintf(why, why_bytes, "cuBLASLt %zu lacks cublasLtGroupedMatrixLayoutCreate", v), 0;
    return snprintf(why, why_bytes, "cuBLASLt %zu.%zu.%zu, compute capability %d.x", v / 10000, v % 10000 / 100,
                    v % 100, major), 1;
}

// ---------------------------------------------------------------------------------------------
// The call

static cudaDataType_t lt_type(mt_dtype t) { return t == MT_F32 ? CUDA_R_32F : CUDA_R_16BF; }

static int lt_fail(const char *what, cublasStatus_t st) {
    return mt_error_set("gemm_rows: %s: %s", what, cublasLtGetStatusString(st)), -1;
}

// A heuristic hint, as an int64 (what NVIDIA's own callers pass; 13.4's header says uint32, so a
// library that wants that width gets it on a refusal: the hint is only a hint).
static void hint(cublasLtMatmulPreference_t p, int attr, int64_t v) {
    uint32_t v32 = (uint32_t)(v < 0 ? 0 : v > UINT32_MAX ? UINT32_MAX : v);
    if (cublasLtMatmulPreferenceSetAttribute(p, (cublasLtMatmulPreferenceAttributes_t)attr, &v, sizeof v) !=
        CUBLAS_STATUS_SUCCESS)
        (void)cublasLtMatmulPreferenceSetAttribute(p, (cublasLtMatmulPreferenceAttributes_t)attr, &v32, sizeof v32);
}

// The heuristic's choice per kind of problem, kept for the process: a step asks the same few
// kinds thousands of times (every run of experts, every layer, every step), and the heuristic
// costs the host far more than building the descriptors. A grouped algorithm is chosen for the
// groups' average shape (the hints), not for one shape, so the cached one serves every call of
// its kind. Slots are replaced round-robin once all are taken.
typedef struct {
    int used, dev, n, op_a, op_b, sm_target;
    mt_dtype tc;
    int64_t rows, cols, k;
    size_t ws_bytes;
    cublasLtMatmulAlgo_t algo;
} algo_slot;
enum { ALGO_SLOTS = 64 };
static algo_slot algo_cache[ALGO_SLOTS];
static int algo_next;
static uint64_t heuristic_calls;

extern "C" uint64_t mt_gemm_rows_heuristic_calls(void) { return heuristic_calls; }

static algo_slot *algo_find(const algo_slot *k) {
    for (int i = 0; i < ALGO_SLOTS; i++) {
        const algo_slot *s = &algo_cache[i];
        if (s->used && s->dev == k->dev && s->n == k->n && s->op_a == k->op_a && s->op_b == k->op_b &&
            s->sm_target == k->sm_target && s->tc == k->tc && s->rows == k->rows && s->cols == k->cols && s->k == k->k &&
            s->ws_bytes == k->ws_bytes)
            return &algo_cache[i];
    }
    return NULL;
}

// The grouped matmul over the arrays the kernel wrote: A, B of type bf16, C = D of type tc.
static int grouped_matmul(mt_backend *be, rows_arrays *arr, int n, int op_a, int op_b, mt_dtype tc, int64_t avg_rows,
                          int64_t avg_cols, int64_t avg_k) {
    void *lt_v, *ws;
    size_t ws_bytes;
    int sm_target;
    mt_cuda_backend_lt(be, &lt_v, &ws, &ws_bytes, &sm_target);
    cublasLtHandle_t lt = (cublasLtHandle_t)lt_v;
    cudaStream_t stream = (cudaStream_t)mt_cuda_backend_stream(be);
    mt_lt_grouped_layout_create_fn create = find_layout_create();
    cublasLtMatrixLayout_t lay[3] = {NULL, NULL, NULL};
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const cudaDataType_t types[3] = {CUDA_R_16BF, CUDA_R_16BF, lt_type(tc)};
    int rc = -1;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = create(&lay[i], types[i], n, arr->shape[3 * i], arr->shape[3 * i + 1], arr->shape[3 * i + 2]);
    if (st != CUBLAS_STATUS_SUCCESS) {
        lt_fail("cublasLtGroupedMatrixLayoutCreate", st);
        goto out;
    }
    {
        MT_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const int32_t ta = op_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = op_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        const int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
        MT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        MT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        MT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof mode));
        if (sm_target > 0)  // the SMs a reserve leaves to the dequantization beside (mt_cuda_gemm_sm_reserve)
            MT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target,
                                                           sizeof sm_target));
        MT_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws64 = ws_bytes;
        MT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws64,
                                                             sizeof ws64));
        hint(pref, MT_LT_PREF_GROUPED_AVG_ROWS, avg_rows);
        hint(pref, MT_LT_PREF_GROUPED_AVG_COLS, avg_cols);
        hint(pref, MT_LT_PREF_GROUPED_AVG_K, avg_k);
        algo_slot key;
        memset(&key, 0, sizeof key);
        MT_CHECK_CUDA(cudaGetDevice(&key.dev));
        key.used = 1, key.n = n, key.op_a = op_a, key.op_b = op_b, key.sm_target = sm_target, key.tc = tc;
        key.rows = avg_rows, key.cols = avg_cols, key.k = avg_k, key.ws_bytes = ws_bytes;
        algo_slot *hit = algo_find(&key);
        if (!hit) {
            cublasLtMatmulHeuristicResult_t res;
            int found = 0;
            memset(&res, 0, sizeof res);
            heuristic_calls++;
            st = cublasLtMatmulAlgoGetHeuristic(lt, desc, lay[0], lay[1], lay[2], lay[2], pref, 1, &res, &found);
            if (st != CUBLAS_STATUS_SUCCESS || !found) {
                if (st == CUBLAS_STATUS_SUCCESS) mt_error_set("gemm_rows: cuBLASLt has no grouped algorithm for this problem");
                else lt_fail("cublasLtMatmulAlgoGetHeuristic", st);
                goto out;
            }
            hit = &algo_cache[algo_next];
            algo_next = (algo_next + 1) % ALGO_SLOTS;
            *hit = key, hit->algo = res.algo;
        }
        // With device pointers, cuBLASLt's A, B, C, D arguments are the device arrays of pointers.
        st = cublasLtMatmul(lt, desc, &arr->alpha, arr->ptr[0], lay[0], arr->ptr[1], lay[1], &arr->beta, arr->ptr[2],
                            lay[2], arr->ptr[3], lay[2], &hit->algo, ws, ws_bytes, stream);
        if (st != CUBLAS_STATUS_SUCCESS) {
            lt_fail("cublasLtMatmul (grouped)", st);
            goto out;
        }
        rc = 0;
    }
out:
    if (pref) MT_CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
    if (desc) MT_CHECK_CUBLAS(cublasLtMatmulDescDestroy(desc));
    for (int i = 0; i < 3; i++)
        if (lay[i]) MT_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(lay[i]));
    return rc;
}

// The checks both calls share: the backend, the group count, the row operands (bf16, 2-D,
// int32 strides) and the scratch.
// 16 bytes: what each group's rows must be aligned to (core/gemm_rows.h), pointer and stride.
static int aligned(const void *p, int64_t ld, size_t es) {
    return (uintptr_t)p % 16 == 0 && ((size_t)ld * es) % 16 == 0;
}
static int align_fail(const char *who, const char *what, const mt_tensor *t) {
    return mt_error_set("%s: %s at %p with rows of %lld bytes apart is not 16-byte aligned (each group's rows start "
                        "at any row)", who, what, t->data, (long long)((size_t)mt_tensor_ld(t) * mt_dtype_bytes(t->dtype, 1))),
           -1;
}

static int common_checks(mt_backend *be, const char *who, int n, const int32_t *off, const mt_tensor *r1,
                         const mt_tensor *r2, mt_dtype r2_type, void *scratch) {
    char why[200];
    if (!mt_gemm_rows_available(be, why, sizeof why)) return mt_error_set("%s: %s", who, why), -1;
    if (n < 1 || n > GMAX) return mt_error_set("%s: %d groups, must be 1..%d", who, n, GMAX), -1;
    if (!scratch || !off) return mt_error_set("%s: no %s", who, off ? "scratch" : "offsets"), -1;
    if (r1->ndim != 2 || r2->ndim != 2) return mt_error_set("%s: the row operands must be 2-D", who), -1;
    if (r1->dtype != MT_BF16 || r2->dtype != r2_type)
        return mt_error_set("%s: row operands are %s and %s, must be bf16 and %s", who, mt_dtype_name(r1->dtype),
                            mt_dtype_name(r2->dtype), mt_dtype_name(r2_type)), -1;
    if (r1->shape[0] != r2->shape[0])
        return mt_error_set("%s: row operands have %lld and %lld rows", who, (long long)r1->shape[0],
                            (long long)r2->shape[0]), -1;
    if (mt_tensor_ld(r1) > INT32_MAX || mt_tensor_ld(r2) > INT32_MAX || r1->shape[0] > INT32_MAX)
        return mt_error_set("%s: a row operand beyond cuBLASLt's int32 shapes", who), -1;
    return 0;
}

// Every operand's rows 16-byte aligned (after the shapes are known to agree).
static int alignment_checks(const char *who, const mt_tensor *r1, const mt_tensor *r2, const mt_tensor *const *t,
                            int n) {
    if (!aligned(r1->data, mt_tensor_ld(r1), 2)) return align_fail(who, "the first row operand", r1);
    if (!aligned(r2->data, mt_tensor_ld(r2), mt_dtype_bytes(r2->dtype, 1))) return align_fail(who, "the second row operand", r2);
    for (int e = 0; e < n; e++)
        if (!aligned(t[e]->data, mt_tensor_ld(t[e]), mt_dtype_bytes(t[e]->dtype, 1)))
            return align_fail(who, "a group's matrix", t[e]);
    return 0;
}

// The per-group operands: one shape, stride and dtype for all, on be.
static int same_shape(const char *who, const mt_tensor *const *t, int n, mt_dtype want) {
    for (int e = 0; e < n; e++) {
        if (!t[e] || t[e]->ndim != 2 || t[e]->dtype != want || t[e]->shape[0] != t[0]->shape[0] ||
            t[e]->shape[1] != t[0]->shape[1] || mt_tensor_ld(t[e]) != mt_tensor_ld(t[0]))
            return mt_error_set("%s: group %d's matrix differs from group 0's (every group needs one %s shape)", who, e,
                                mt_dtype_name(want)), -1;
    }
    return 0;
}

extern "C" int mt_gemm_rows(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_tensor *const *w, int trans,
                            int n, const int32_t *off, int64_t rows_total, float alpha, float beta, void *scratch) {
    const char *who = "mt_gemm_rows";
    if (common_checks(be, who, n, off, a, c, c->dtype == MT_F32 ? MT_F32 : MT_BF16, scratch) != 0) return -1;
    if (same_shape(who, w, n, MT_BF16) != 0) return -1;
    const int64_t K = a->shape[1], N = c->shape[1];
    const int64_t wk = trans ? w[0]->shape[1] : w[0]->shape[0], wn = trans ? w[0]->shape[0] : w[0]->shape[1];
    if (wk != K || wn != N)
        return mt_error_set("%s: a is [R, %lld], c [R, %lld], but op(w) is [%lld, %lld]", who, (long long)K,
                            (long long)N, (long long)wk, (long long)wn), -1;
    if (alignment_checks(who, a, c, w, n) != 0) return -1;
    rows_setup S;
    memset(&S, 0, sizeof S);
    for (int e = 0; e < n; e++) S.per_group[e] = w[e]->data;
    S.rows_a = (const char *)a->data, S.rows_b = (const char *)c->data;
    S.ld_a = mt_tensor_ld(a), S.ld_b = mt_tensor_ld(c), S.es_a = 2, S.es_b = (int64_t)mt_dtype_bytes(c->dtype, 1);
    S.fixed_rows = (int32_t)w[0]->shape[1], S.fixed_cols = (int32_t)w[0]->shape[0];  // W stored [out, in]
    S.fixed_ld = (int32_t)mt_tensor_ld(w[0]);
    S.width_a = (int32_t)K, S.width_b = (int32_t)N, S.alpha = alpha, S.beta = beta;
    cudaStream_t stream = (cudaStream_t)mt_cuda_backend_enter(be);
    if (mt_prof_active)
        mt_prof_count(2.0 * (double)rows_total * (double)N * (double)K,
                      2.0 * ((double)n * (double)N * (double)K + (double)rows_total * (double)K) +
                          (double)mt_dtype_bytes(c->dtype, (size_t)(rows_total * N)) * (beta != 0.0f ? 2 : 1));
    rows_setup_kernel<<<1, GMAX, 0, stream>>>(S, off, n, (rows_arrays *)scratch);
    MT_CHECK_LAUNCH();
    be->device_ops++;
    // cuBLAS's A is W_e: op T when trans (stored [K, N] column-major), else N.
    return grouped_matmul(be, (rows_arrays *)scratch, n, trans, 0, c->dtype, N, rows_total / n, K);
}

extern "C" int mt_gemm_rows_tn(mt_backend *be, mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y, int n,
                               const int32_t *off, int64_t rows_total, float alpha, float beta, void *scratch) {
    const char *who = "mt_gemm_rows_tn";
    if (common_checks(be, who, n, off, y, x, MT_BF16, scratch) != 0) return -1;
    if (!g[0] || (g[0]->dtype != MT_F32 && g[0]->dtype != MT_BF16))
        return mt_error_set("%s: g must be bf16 or f32", who), -1;
    if (same_shape(who, (const mt_tensor *const *)g, n, g[0]->dtype) != 0) return -1;
    const int64_t M = x->shape[1], N = y->shape[1];
    if (g[0]->shape[0] != M || g[0]->shape[1] != N)
        return mt_error_set("%s: x is [R, %lld], y [R, %lld], but g is [%lld, %lld]", who, (long long)M, (long long)N,
                            (long long)g[0]->shape[0], (long long)g[0]->shape[1]), -1;
    if (alignment_checks(who, y, x, (const mt_tensor *const *)g, n) != 0) return -1;
    rows_setup S;
    memset(&S, 0, sizeof S);
    for (int e = 0; e < n; e++) S.per_group[e] = g[e]->data;
    S.rows_a = (const char *)y->data, S.rows_b = (const char *)x->data;
    S.ld_a = mt_tensor_ld(y), S.ld_b = mt_tensor_ld(x), S.es_a = S.es_b = 2;
    S.fixed_rows = (int32_t)N, S.fixed_cols = (int32_t)M, S.fixed_ld = (int32_t)mt_tensor_ld(g[0]);
    S.width_a = (int32_t)N, S.width_b = (int32_t)M, S.tn = 1, S.alpha = alpha, S.beta = beta;
    cudaStream_t stream = (cudaStream_t)mt_cuda_backend_enter(be);
    if (mt_prof_active)
        mt_prof_count(2.0 * (double)rows_total * (double)N * (double)M,
                      2.0 * (double)rows_total * (double)(M + N) +
                          (double)mt_dtype_bytes(g[0]->dtype, (size_t)(n * M * N)) * (beta != 0.0f ? 2 : 1));
    rows_setup_kernel<<<1, GMAX, 0, stream>>>(S, off, n, (rows_arrays *)scratch);
    MT_CHECK_LAUNCH();
    be->device_ops++;
    return grouped_matmul(be, (rows_arrays *)scratch, n, 0, 1, g[0]->dtype, N, M, rows_total / n);
}

// ---------------------------------------------------------------------------------------------
// The first use's check against per-group cuBLASLt GEMMs

// A small problem both ways, as the step calls it: groups of 3, 0 and 4 rows; the forward's
// c = a·Wᵀ into an f32 c with beta 1 and the backward's c = a·W into a bf16 c with beta 0; the
// weight gradient into f32 g with beta 1 and into bf16 g with beta 0 (the empty group's g zeroed).
// 1 when every product agrees with one plain cuBLASLt GEMM per group; 0 when one does not, with
// the worst difference in why; -1 when the check could not run (an allocation: not a verdict).
// The grouped matmul is marked experimental and its conventions are read from a header, so a
// library that reads them otherwise is caught before a step trusts it.
enum { CK_E = 3, CK_R = 7, CK_D = 16 };  // groups, rows, and every other dimension (square W)
static const int32_t ck_off[CK_E + 1] = {0, 3, 3, 7};

static mt_tensor *ck_tensor(mt_backend *be, mt_dtype dt, int64_t rows, int seed) {
    int64_t sh[2] = {rows, CK_D};
    mt_tensor *t = mt_tensor_new(be, MT_MEM_WORK, dt, 2, sh);
    if (!t) return NULL;
    float v[CK_R > CK_D ? CK_R * CK_D : CK_D * CK_D];
    for (int64_t i = 0; i < rows * CK_D; i++) v[i] = (float)((i * 7 + 5 * seed) % 13 - 6) / 8.0f;  // exact in bf16
    mt_tensor_upload_f32(t, v);
    return t;
}

// The worst relative difference between two tensors of n elements.
static double ck_diff(const mt_tensor *x, const mt_tensor *y) {
    float a[CK_D * CK_D], b[CK_D * CK_D];
    mt_tensor_download_f32(x, a), mt_tensor_download_f32(y, b);
    double worst = 0;
    for (int64_t i = 0; i < mt_tensor_numel(x); i++) worst = fmax(worst, fabs((double)a[i] - b[i]) / (1.0 + fabs(b[i])));
    return worst;
}

static int self_check(mt_backend *be, char *why, size_t why_bytes) {
    // a, y, the W, the offsets; then per pass c and its reference, each g and its reference
    enum { NT = 2 + CK_E + 1 + 2 * (2 + 2 * CK_E) };
    mt_tensor *t[NT] = {0};
    int k = 0, ok = 1;
    mt_tensor *a = t[k++] = ck_tensor(be, MT_BF16, CK_R, 1), *y = t[k++] = ck_tensor(be, MT_BF16, CK_R, 2);
    mt_tensor *w[CK_E];
    for (int e = 0; e < CK_E; e++) w[e] = t[k++] = ck_tensor(be, MT_BF16, CK_D, 3 + e);
    int64_t so[1] = {CK_E + 1};
    mt_tensor *doff = t[k++] = mt_tensor_new(be, MT_MEM_WORK, MT_I32, 1, so);
    void *arrays = NULL;
    for (int i = 0; i < k; i++) ok = ok && t[i];
    ok = ok && mt_backend_alloc(be, MT_MEM_WORK, MT_GEMM_ROWS_SCRATCH_BYTES, &arrays) == 0;
    if (ok) mt_tensor_upload(doff, ck_off);
    double worst = 0;
    int ran = ok;
    for (int pass = 0; pass < 2 && ok; pass++) {  // pass 0: f32, beta 1, trans; pass 1: bf16, beta 0, plain
        const mt_dtype dt = pass ? MT_BF16 : MT_F32;
        const float beta = pass ? 0.0f : 1.0f;
        mt_tensor *c = t[k++] = ck_tensor(be, dt, CK_R, 9), *c_ref = t[k++] = ck_tensor(be, dt, CK_R, 9);
        mt_tensor *g[CK_E], *g_ref[CK_E];
        for (int e = 0; e < CK_E; e++) g[e] = t[k++] = ck_tensor(be, dt, CK_D, 7), g_ref[e] = t[k++] = ck_tensor(be, dt, CK_D, 7);
        for (int i = 0; i < k; i++) ok = ok && t[i];
        if (!ok) break;
        for (int e = 0; e < CK_E && ran; e++) {  // the reference: one plain GEMM per group
            const int64_t n = ck_off[e + 1] - ck_off[e];
            mt_tensor ae = mt_view_rows(a, ck_off[e], n), ce = mt_view_rows(c_ref, ck_off[e], n);
            mt_tensor ye = mt_view_rows(y, ck_off[e], n);
            ran = (n == 0 || mt_matmul(&ce, &ae, w[e], 0, !pass, 0.5f, beta) == 0) &&
                  mt_matmul(g_ref[e], &ae, &ye, 1, 0, 2.0f, beta) == 0;
        }
        ran = ran &&
              mt_gemm_rows(be, c, a, (const mt_tensor *const *)w, !pass, CK_E, (const int32_t *)doff->data, CK_R, 0.5f,
                           beta, arrays) == 0 &&
              mt_gemm_rows_tn(be, g, a, y, CK_E, (const int32_t *)doff->data, CK_R, 2.0f, beta, arrays) == 0;
        if (!ran) break;
        worst = fmax(worst, ck_diff(c, c_ref));
        for (int e = 0; e < CK_E; e++) worst = fmax(worst, ck_diff(g[e], g_ref[e]));
    }
    int verdict;
    if (!ok) verdict = -1, snprintf(why, why_bytes, "the grouped matmul's check could not allocate: %s", mt_error_get());
    else if (!ran) verdict = 0, snprintf(why, why_bytes, "the grouped matmul's check failed to run: %s", mt_error_get());
    else if (worst > 1e-2) verdict = 0, snprintf(why, why_bytes, "the grouped matmul disagrees with per-group GEMMs on a "
                                                 "test problem (relative difference %.3g): not used", worst);
    else verdict = 1;
    if (arrays) mt_backend_release(be, MT_MEM_WORK, MT_GEMM_ROWS_SCRATCH_BYTES, arrays);
    for (int i = 0; i < k; i++) mt_tensor_free(t[i]);
    return verdict;
}

extern "C" int mt_gemm_rows_checked(mt_backend *be, char *why, size_t why_bytes) {
    char local[200];
    if (!why) why = local, why_bytes = sizeof local;
    if (!mt_gemm_rows_available(be, why, why_bytes)) return 0;
    enum { MAX_DEVICES = 64 };
    static int state[MAX_DEVICES];  // 0: not checked on the device, 1 agreed, -1 not
    static char failed[MAX_DEVICES][200];
    int dev = 0;
    MT_CHECK_CUDA(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MAX_DEVICES) return snprintf(why, why_bytes, "device %d beyond %d", dev, MAX_DEVICES), 0;
    if (!state[dev]) {
        const int v = self_check(be, failed[dev], sizeof failed[dev]);
        if (v < 0) return snprintf(why, why_bytes, "%s", failed[dev]), 0;  // not a verdict: asked again next time
        state[dev] = v ? 1 : -1;
    }
    if (state[dev] < 0) return snprintf(why, why_bytes, "%s", failed[dev]), 0;
    const size_t n = strlen(why);
    if (n < why_bytes) snprintf(why + n, why_bytes - n, ", checked against per-group GEMMs");
    return 1;
}
