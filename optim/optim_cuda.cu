// optim/optim_cuda.cu — CUDA twins of optim/optim.c's grad norm and AdamW element update,
// for f32 state on the device (no 8-bit state, no offload: those stay on the CPU path).
//
// Both walk a list of tensors in multi-tensor launches: up to ADAM_LIST tensors per launch, each
// block finds its tensor by a binary search over the blocks' starts, so hundreds of small LoRA
// tensors cost a few launches, not hundreds. The element rule is optim/optim.c's adamw_elem,
// every product and sum rounded on its own (__fmul_rn/__fadd_rn: nvcc would fuse them), so an
// f32 update matches the CPU bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "optim/optim_cuda.h"
#include "optim/optim.h"

enum {
    ADAM_THREADS = 256,
    ADAM_ELEMS = 2048,    // elements per block of the update
    NORM_ELEMS = 8192,    // elements per partial sum of the norm (optim.c's NORM_BLOCK)
    ADAM_LIST = 40,       // tensors per update launch (kernel parameters stay under 4 KiB)
    NORM_LIST = 96,       // tensors per norm launch
};

// ---------------------------------------------------------------------------------------------
// Scalars (host): optim.c's mt_adamw_step, rounded to fp32 once per step.

extern "C" mt_adamw_scalars mt_adamw_scalars_make(const mt_adamw_opts *p, int64_t t, double lr, double clip,
                                                  double norm) {
    double bc1 = 1.0 - pow(p->beta1, (double)t), bc2 = 1.0 - pow(p->beta2, (double)t);
    mt_adamw_scalars k;
    k.scale = (clip > 0 && norm > clip) ? (float)(clip / norm) : 1.0f;
    k.decay_mul = (float)(1.0 - lr * p->weight_decay);
    k.beta1 = (float)p->beta1;
    k.one_minus_beta1 = (float)(1.0 - p->beta1);
    k.beta2 = (float)p->beta2;
    k.one_minus_beta2 = (float)(1.0 - p->beta2);
    k.step_size = (float)(lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = (float)p->eps;
    return k;
}

// ---------------------------------------------------------------------------------------------
// Grad norm: part[b] = Σ g² over block b of NORM_ELEMS elements (double), then one block sums
// the parts in order into *sumsq.

struct norm_list {
    const void *g[NORM_LIST];
    int64_t n[NORM_LIST];
    int64_t part0[NORM_LIST + 1];  // first part (block) of each tensor, relative to the launch
    int bf16[NORM_LIST];
    int count;
};

static __device__ __forceinline__ int find_tensor(const int64_t *starts, int count, int64_t block) {
    int lo = 0, hi = count - 1;  // the last i with starts[i] <= block
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (starts[mid] <= block) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static __global__ void norm_partial_kernel(double *part, norm_list L) {
    __shared__ double red[32];
    const int64_t blk = blockIdx.x;
    const int i = find_tensor(L.part0, L.count, blk);
    const int64_t s = (blk - L.part0[i]) * NORM_ELEMS, e = MT_MIN(L.n[i], s + NORM_ELEMS);
    double acc = 0.0;
    for (int64_t x = s + threadIdx.x; x < e; x += blockDim.x) {
        double f = L.bf16[i] ? (double)__bfloat162float(((const __nv_bfloat16 *)L.g[i])[x])
                             : (double)((const float *)L.g[i])[x];
        acc += f * f;
    }
    acc = mt_block_sum(acc, red);
    if (threadIdx.x == 0) part[blk] = acc;
}

static __global__ void norm_sum_kernel(double *sumsq, const double *part, int64_t nparts) {
    __shared__ double red[32];
    double acc = 0.0;
    for (int64_t p = threadIdx.x; p < nparts; p += blockDim.x) acc += part[p];
    acc = mt_block_sum(acc, red);
    if (threadIdx.x == 0) *sumsq += acc;
}

static int64_t norm_parts(const mt_param *params, int n) {
    int64_t parts = 0;
    for (int i = 0; i < n; i++) {
        const mt_tensor *g = params[i].g;
        if (!g || !g->data) continue;
        if (g->be->ops->kind != MT_BACKEND_CUDA || (g->dtype != MT_F32 && g->dtype != MT_BF16))
            mt_fatal(MT_EXIT_ERROR, "grad_sumsq_cuda: grad '%s' is %s on the %s backend (want f32/bf16 on cuda)",
                     params[i].name ? params[i].name : "?", mt_dtype_name(g->dtype), g->be->ops->name);
        parts += (mt_tensor_numel(g) + NORM_ELEMS - 1) / NORM_ELEMS;
    }
    return parts;
}

extern "C" void grad_sumsq_cuda(mt_backend *be, double *sumsq, const mt_param *params, int n) {
    const int64_t nparts = norm_parts(params, n);
    if (nparts == 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    size_t bytes = (size_t)nparts * sizeof(double);
    double *part = (double *)mt_work_alloc(be, bytes);
    int64_t done = 0;  // parts written by earlier launches
    norm_list L;
    L.count = 0;
    L.part0[0] = 0;
    for (int i = 0; i <= n; i++) {
        const mt_tensor *g = i < n ? params[i].g : NULL;
        int64_t numel = g && g->data ? mt_tensor_numel(g) : 0;
        if (numel > 0) {
            L.g[L.count] = g->data;
            L.n[L.count] = numel;
            L.bf16[L.count] = g->dtype == MT_BF16;
            L.part0[L.count + 1] = L.part0[L.count] + (numel + NORM_ELEMS - 1) / NORM_ELEMS;
            L.count++;
        }
        if (L.count > 0 && (L.count == NORM_LIST || i == n)) {
            norm_partial_kernel<<<(unsigned)L.part0[L.count], ADAM_THREADS, 0, s>>>(part + done, L);
            MT_CHECK_LAUNCH();
            done += L.part0[L.count];
            L.count = 0;
        }
    }
    norm_sum_kernel<<<1, 1024, 0, s>>>(sumsq, part, nparts);
    MT_CHECK_LAUNCH();
    mt_work_free(be, part, bytes);
}

extern "C" double mt_grad_norm_cuda(mt_backend *be, const mt_param *params, int n) {
    cudaStream_t s = mt_cuda_begin(be);
    double *d = (double *)mt_work_alloc(be, sizeof(double)), h = 0.0;
    MT_CHECK_CUDA(cudaMemsetAsync(d, 0, sizeof(double), s));
    grad_sumsq_cuda(be, d, params, n);
    MT_CHECK_CUDA(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
    mt_cuda_backend_sync(be);  // the one synchronisation: the host wants the norm
    mt_work_free(be, d, sizeof(double));
    return sqrt(h);
}

// ---------------------------------------------------------------------------------------------
// The update

enum { ADAM_F32 = 0, ADAM_BF16_MASTER = 1, ADAM_BF16_DIRECT = 2 };

struct adam_list {
    void *w[ADAM_LIST];
    const void *g[ADAM_LIST];
    float *m[ADAM_LIST], *v[ADAM_LIST], *master[ADAM_LIST];
    int64_t n[ADAM_LIST];
    int64_t block0[ADAM_LIST + 1];
    float decay_mul[ADAM_LIST];
    int kind[ADAM_LIST];
    int count;
};

// optim.c's adamw_elem, one rounding per operation as the CPU computes it.
static __device__ __forceinline__ float adamw_elem(float gi, float w, float *m, float *v, const mt_adamw_scalars &k,
                                                   float decay_mul) {
    float wi = __fmul_rn(w, decay_mul);
    float mi = __fadd_rn(__fmul_rn(k.beta1, *m), __fmul_rn(k.one_minus_beta1, gi));
    float vi = __fadd_rn(__fmul_rn(k.beta2, *v), __fmul_rn(__fmul_rn(k.one_minus_beta2, gi), gi));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
    *m = mi;
    *v = vi;
    return __fsub_rn(wi, __fmul_rn(k.step_size, __fdiv_rn(mi, denom)));
}

static __global__ void adamw_kernel(adam_list L, mt_adamw_scalars k) {
    const int64_t blk = blockIdx.x;
    const int i = find_tensor(L.block0, L.count, blk);
    const int64_t s = (blk - L.block0[i]) * ADAM_ELEMS, e = MT_MIN(L.n[i], s + ADAM_ELEMS);
    float *m = L.m[i], *v = L.v[i], dm = L.decay_mul[i];
    for (int64_t x = s + threadIdx.x; x < e; x += blockDim.x) {
        switch (L.kind[i]) {
        case ADAM_F32: {
            float *w = (float *)L.w[i];
            w[x] = adamw_elem(__fmul_rn(((const float *)L.g[i])[x], k.scale), w[x], &m[x], &v[x], k, dm);
            break;
        }
        case ADAM_BF16_MASTER: {
            float gi = __fmul_rn(__bfloat162float(((const __nv_bfloat16 *)L.g[i])[x]), k.scale);
            float *ms = L.master[i];
            ms[x] = adamw_elem(gi, ms[x], &m[x], &v[x], k, dm);
            ((__nv_bfloat16 *)L.w[i])[x] = __float2bfloat16_rn(ms[x]);
            break;
        }
        default: {
            __nv_bfloat16 *w = (__nv_bfloat16 *)L.w[i];
            float gi = __fmul_rn(__bfloat162float(((const __nv_bfloat16 *)L.g[i])[x]), k.scale);
            w[x] = __float2bfloat16_rn(adamw_elem(gi, __bfloat162float(w[x]), &m[x], &v[x], k, dm));
        }
        }
    }
}

extern "C" int adamw_update_cuda(mt_backend *be, const mt_adamw *o, const mt_param *params, int n,
                                 const mt_adamw_scalars *k) {
    if (n != o->n) {
        mt_error_set("adamw cuda: %d params, but the optimizer was built for %d", n, o->n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const mt_param *q = &params[i];
        const char *name = q->name ? q->name : "?";
        if (o->opts.offload || mt_adamw_is_8bit(o, i)) {
            mt_error_set("adamw cuda: param '%s': 8-bit or offloaded state is updated on the host, not here", name);
            return -1;
        }
        if (q->w->be != be || q->g->be != be || o->m[i]->be != be || o->v[i]->be != be ||
            (q->w->dtype != MT_F32 && q->w->dtype != MT_BF16) || q->g->dtype != q->w->dtype ||
            mt_tensor_numel(q->w) != mt_tensor_numel(o->m[i])) {
            mt_error_set("adamw cuda: param '%s': weight, grad and state must be on this cuda backend, f32 or bf16, "
                         "and match the optimizer's state", name);
            return -1;
        }
    }
    cudaStream_t s = mt_cuda_begin(be);
    adam_list L;
    L.count = 0;
    L.block0[0] = 0;
    for (int i = 0; i <= n; i++) {
        const mt_param *q = i < n ? &params[i] : NULL;
        int64_t numel = q ? mt_tensor_numel(q->w) : 0;
        if (numel > 0) {
            int c = L.count;
            L.w[c] = q->w->data;
            L.g[c] = q->g->data;
            L.m[c] = (float *)o->m[i]->data;
            L.v[c] = (float *)o->v[i]->data;
            L.master[c] = o->master[i] ? (float *)o->master[i]->data : NULL;
            L.n[c] = numel;
            L.decay_mul[c] = q->decay ? k->decay_mul : 1.0f;
            L.kind[c] = q->w->dtype == MT_F32 ? ADAM_F32 : o->master[i] ? ADAM_BF16_MASTER : ADAM_BF16_DIRECT;
            L.block0[c + 1] = L.block0[c] + (numel + ADAM_ELEMS - 1) / ADAM_ELEMS;
            L.count++;
        }
        if (L.count > 0 && (L.count == ADAM_LIST || i == n)) {
            adamw_kernel<<<(unsigned)L.block0[L.count], ADAM_THREADS, 0, s>>>(L, *k);
            MT_CHECK_LAUNCH();
            L.count = 0;
        }
    }
    return 0;
}
