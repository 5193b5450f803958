// lora/lora_cuda.cu — CUDA twin of the LoRA forward/backward of lora/lora.c (fp32): the four
// small GEMMs go through the backend's matmul (cuBLASLt), dropout is regenerated on the device
// from the CPU's hash (lora/lora_dropout.h), so the masks are the same elements on both.
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "lora/lora.h"
#include "lora/lora_dropout.h"
#include "lora/lora_cuda.h"

enum { THREADS = 256 };

// out [n] = x [n] · factor(i) (accumulate = 0) or out [n] += x [n] · factor(i) (accumulate = 1)
static __global__ void dropout_kernel(float *out, const float *x, int64_t n, uint64_t seed, float p, int accumulate) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i] * mt_lora_dropout_factor(seed, p, (uint64_t)i);
        out[i] = accumulate ? out[i] + v : v;
    }
}

static void dropout_launch(mt_backend *be, float *out, const float *x, int64_t n, const mt_lora *l, int accumulate) {
    cudaStream_t s = mt_cuda_begin(be);
    dropout_kernel<<<mt_cuda_blocks(n, THREADS, 8192), THREADS, 0, s>>>(out, x, n, l->dropout_seed, l->dropout,
                                                                        accumulate);
    MT_CHECK_LAUNCH();
}

// A 2-D f32 view of device memory for the backend's matmul (nothing allocated).
static mt_tensor view2(mt_backend *be, const float *p, int64_t rows, int64_t cols) {
    mt_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = MT_F32;
    t.ndim = 2;
    t.shape[0] = rows, t.shape[1] = cols;
    t.nbytes = (size_t)(rows * cols) * sizeof(float);
    t.data = (void *)p;
    t.be = be;
    t.cat = MT_MEM_WORK;
    return t;
}

// c = alpha · op(a) · op(b) + beta · c through the backend; a refusal here is a programming error.
static void gemm(mt_backend *be, mt_tensor c, mt_tensor a, mt_tensor b, int ta, int tb, float alpha, float beta) {
    if (be->ops->matmul(be, &c, &a, &b, ta, tb, alpha, beta) != 0)
        mt_fatal(MT_EXIT_ERROR, "lora cuda: matmul: %s", mt_error_get());
}

static void lora_check(mt_backend *be, const mt_lora *l) {
    if (l->a->dtype != MT_F32 || l->b->dtype != MT_F32 || l->a->be != be)
        mt_fatal(MT_EXIT_ERROR, "lora cuda: A and B must be f32 tensors of this backend (got %s, %s)",
                 mt_dtype_name(l->a->dtype), mt_dtype_name(l->b->dtype));
}

// y [n, out] += scale · (dropout(x) · Aᵀ) · Bᵀ; xa [n, r] = dropout(x) · Aᵀ
extern "C" void mt_lora_forward_cuda(mt_backend *be, const mt_lora *l, float *y, const float *x, float *xa,
                                     int64_t n) {
    if (n == 0) return;
    lora_check(be, l);
    const int64_t in = l->in, out = l->out, r = l->r;
    size_t xbytes = (size_t)(n * in) * sizeof(float);
    float *xd = NULL;
    if (l->dropout > 0.0f) {
        xd = (float *)mt_work_alloc(be, xbytes);
        dropout_launch(be, xd, x, n * in, l, 0);
    }
    gemm(be, view2(be, xa, n, r), view2(be, xd ? xd : x, n, in), view2(be, (float *)l->a->data, r, in), 0, 1, 1.0f,
         0.0f);
    gemm(be, view2(be, y, n, out), view2(be, xa, n, r), view2(be, (float *)l->b->data, out, r), 0, 1, l->scale,
         1.0f);
    if (xd) mt_work_free(be, xd, xbytes);
}

// dB += scale · dyᵀ · xa; dxa = scale · dy · B (scratch [n, r]); dA += dxaᵀ · dropout(x);
// dx += dropout'(dxa · A).
extern "C" void mt_lora_backward_cuda(mt_backend *be, const mt_lora *l, float *dx, const float *dy, const float *x,
                                      const float *xa, float *scratch, int64_t n) {
    if (n == 0) return;
    lora_check(be, l);
    const int64_t in = l->in, out = l->out, r = l->r;
    const float *A = (const float *)l->a->data, *Bm = (const float *)l->b->data;
    gemm(be, view2(be, (float *)l->db->data, out, r), view2(be, dy, n, out), view2(be, xa, n, r), 1, 0, l->scale,
         1.0f);
    float *dxa = scratch;
    gemm(be, view2(be, dxa, n, r), view2(be, dy, n, out), view2(be, Bm, out, r), 0, 0, l->scale, 0.0f);
    size_t xbytes = (size_t)(n * in) * sizeof(float);
    float *buf = l->dropout > 0.0f ? (float *)mt_work_alloc(be, xbytes) : NULL;  // dropout(x), then dxa·A
    if (buf) dropout_launch(be, buf, x, n * in, l, 0);
    gemm(be, view2(be, (float *)l->da->data, r, in), view2(be, dxa, n, r), view2(be, buf ? buf : x, n, in), 1, 0,
         1.0f, 1.0f);
    if (dx) {
        if (!buf) {
            gemm(be, view2(be, dx, n, in), view2(be, dxa, n, r), view2(be, A, r, in), 0, 0, 1.0f, 1.0f);
        } else {  // the same stream: the dA matmul has read buf before this one overwrites it
            gemm(be, view2(be, buf, n, in), view2(be, dxa, n, r), view2(be, A, r, in), 0, 0, 1.0f, 0.0f);
            dropout_launch(be, dx, buf, n * in, l, 1);
        }
    }
    if (buf) mt_work_free(be, buf, xbytes);
}
