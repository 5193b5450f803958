// model/parts_cuda.cu — CUDA twins of the parts some families add (docs/families.md): attention,
// router and expert biases and clip_qkv (model/bias.c), the shared expert's sigmoid gate and the MLP output's add
// (model/mlp.c), and MLA's key and value assembly (model/mla.c). Contract in model/ops_cuda.h.
//
// bf16 storage, fp32 arithmetic, one rounding on store. These are elementwise or one row per
// block, a small share of a step's time beside the GEMMs: plain element accesses, no 16-byte path.
// Column and row sums go in a fixed order (no atomics): the same bits on every run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "model/ops_cuda.h"
#include "model/row_expert.cuh"

enum { THREADS = 256 };

typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float bf(const bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 rn(float x) { return __float2bfloat16_rn(x); }

#define GRID_STRIDE(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// ---------------------------------------------------------------------------------------------
// Biases: of a projection (bf16 rows), of the router's fp32 logits (gpt-oss), and of each
// expert's rows in a grouped call (gpt-oss's expert biases, model/experts_gpu.c)

static __device__ __forceinline__ float bf(const float x) { return x; }
static __device__ __forceinline__ void put(bf16 *p, float v) { *p = rn(v); }
static __device__ __forceinline__ void put(float *p, float v) { *p = v; }

// y [T, n] += b [n]
template <typename Y>
static __global__ void bias_forward_kernel(Y *y, const bf16 *b, int64_t T, int64_t n) {
    GRID_STRIDE(i, T * n) put(&y[i], bf(y[i]) + bf(b[i % n]));
}

enum { BIAS_COLS = 32, BIAS_ROWS = 8 };

// Σ_{t0 ≤ t < t1} dy[t·ld + col] for the block's column col (block: 32 columns, 8 row groups):
// row group g sums rows t0 + g, t0 + g + 8, ... in order, then the 8 partials (part, the block's
// shared [8 × 32]) are added in group order. The sum is valid in row group 0.
template <typename D>
static __device__ float column_sum(float *part, const D *dy, int64_t ld, int64_t t0, int64_t t1, int64_t col,
                                   int64_t n) {
    float s = 0.0f;
    if (col < n)
        for (int64_t t = t0 + threadIdx.y; t < t1; t += BIAS_ROWS) s += bf(dy[t * ld + col]);
    part[threadIdx.y * BIAS_COLS + threadIdx.x] = s;
    __syncthreads();
    float sum = 0.0f;
    if (threadIdx.y == 0)
        for (int g = 0; g < BIAS_ROWS; g++) sum += part[g * BIAS_COLS + threadIdx.x];
    return sum;
}

// db [n] += Σ_t dy [T, n] (bf16 rows, or the router's fp32 logits' gradient)
template <typename D>
static __global__ void bias_backward_kernel(bf16 *db, const D *dy, int64_t T, int64_t n) {
    __shared__ float part[BIAS_ROWS * BIAS_COLS];
    const int64_t col = blockIdx.x * (int64_t)BIAS_COLS + threadIdx.x;
    const float sum = column_sum(part, dy, n, 0, T, col, n);
    if (threadIdx.y == 0 && col < n) db[col] = rn(bf(db[col]) + sum);
}

// The expert of row r (counted from the call's first row, inside the call's rows).
static __device__ int expert_of_row(const mt_expert_offsets &g, int64_t r) {
    return row_expert(g.off, g.experts, g.off[0] + r);
}

// The offsets a block works from: g's own, or (g.dev: model/ops.h) read from the device into the
// block's shared copy. Every thread of the block calls it (it synchronises).
static __device__ const mt_expert_offsets &block_offsets(const mt_expert_offsets &g, mt_expert_offsets *shared) {
    if (!g.dev) return g;
    const int nt = blockDim.x * blockDim.y, t = threadIdx.y * blockDim.x + threadIdx.x;
    for (int i = t; i <= g.experts; i += nt) shared->off[i] = g.dev[i];
    if (t == 0) shared->experts = g.experts, shared->dev = NULL;
    __syncthreads();
    return *shared;
}

// y [rows, n] (row stride ldy) += b [e(r), :] (rows of stride ldb); a row per block. With g.dev,
// y starts at the offsets' row 0 (its rows from off[0] on are the call's).
static __global__ void expert_bias_forward_kernel(bf16 *y, int64_t ldy, const bf16 *b, int64_t ldb, int64_t n,
                                                  const __grid_constant__ mt_expert_offsets g0) {
    __shared__ mt_expert_offsets sh;
    const mt_expert_offsets &g = block_offsets(g0, &sh);
    if (g0.dev) y += (int64_t)g.off[0] * ldy;
    const int64_t rows = g.off[g.experts] - g.off[0];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const bf16 *br = b + (int64_t)expert_of_row(g, r) * ldb;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[r * ldy + j] = rn(bf(y[r * ldy + j]) + bf(br[j]));
    }
}

// db [e, :] (rows of stride lddb) += Σ over expert e's rows of dy (row stride ldy): a block per
// (32 columns, expert), the sum in column_sum's order.
static __global__ void expert_bias_backward_kernel(bf16 *db, int64_t lddb, const bf16 *dy, int64_t ldy, int64_t n,
                                                   const __grid_constant__ mt_expert_offsets g0) {
    __shared__ mt_expert_offsets sh;
    const mt_expert_offsets &g = block_offsets(g0, &sh);
    if (g0.dev) dy += (int64_t)g.off[0] * ldy;
    __shared__ float part[BIAS_ROWS * BIAS_COLS];
    const int e = blockIdx.y;
    const int64_t col = blockIdx.x * (int64_t)BIAS_COLS + threadIdx.x;
    const float sum = column_sum(part, dy, ldy, g.off[e] - g.off[0], g.off[e + 1] - g.off[0], col, n);
    bf16 *o = db + (int64_t)e * lddb + col;
    if (threadIdx.y == 0 && col < n) *o = rn(bf(*o) + sum);
}

extern "C" void bias_forward_cuda(mt_backend *be, mt_bf16 *y, const mt_bf16 *b, int64_t T, int64_t n) {
    if (T <= 0 || n <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    bias_forward_kernel<<<mt_cuda_blocks(T * n, THREADS, 8192), THREADS, 0, s>>>((bf16 *)y, (const bf16 *)b, T, n);
    MT_CHECK_LAUNCH();
}

extern "C" void bias_backward_cuda(mt_backend *be, mt_bf16 *db, const mt_bf16 *dy, int64_t T, int64_t n) {
    if (T <= 0 || n <= 0 || !db) return;
    cudaStream_t s = mt_cuda_begin(be);
    dim3 block(BIAS_COLS, BIAS_ROWS);
    bias_backward_kernel<<<(unsigned)((n + BIAS_COLS - 1) / BIAS_COLS), block, 0, s>>>((bf16 *)db, (const bf16 *)dy,
                                                                                        T, n);
    MT_CHECK_LAUNCH();
}

extern "C" void logit_bias_forward_cuda(mt_backend *be, float *logits, const mt_bf16 *b, int64_t T, int64_t n) {
    if (T <= 0 || n <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    bias_forward_kernel<<<mt_cuda_blocks(T * n, THREADS, 8192), THREADS, 0, s>>>(logits, (const bf16 *)b, T, n);
    MT_CHECK_LAUNCH();
}

extern "C" void logit_bias_backward_cuda(mt_backend *be, mt_bf16 *db, const float *dlogits, int64_t T, int64_t n) {
    if (T <= 0 || n <= 0 || !db) return;
    cudaStream_t s = mt_cuda_begin(be);
    dim3 block(BIAS_COLS, BIAS_ROWS);
    bias_backward_kernel<<<(unsigned)((n + BIAS_COLS - 1) / BIAS_COLS), block, 0, s>>>((bf16 *)db, dlogits, T, n);
    MT_CHECK_LAUNCH();
}

static void expert_offsets_check(const mt_expert_offsets *g) {
    if (g->experts < 1 || g->experts > MT_EXPERT_OFFSETS_MAX)
        mt_fatal(MT_EXIT_ERROR, "expert_bias_cuda: %d experts in one call (1 to %d)", g->experts, MT_EXPERT_OFFSETS_MAX);
}

extern "C" void expert_bias_forward_cuda(mt_backend *be, mt_bf16 *y, int64_t ldy, const mt_bf16 *b, int64_t ldb,
                                         int64_t n, const mt_expert_offsets *g) {
    expert_offsets_check(g);
    const int64_t rows = g->dev ? g->dev_rows : g->off[g->experts] - g->off[0];  // dev: a bound
    if (rows <= 0 || n <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    expert_bias_forward_kernel<<<mt_cuda_blocks(rows, 1), THREADS, 0, s>>>((bf16 *)y, ldy, (const bf16 *)b, ldb, n,
                                                                           *g);
    MT_CHECK_LAUNCH();
}

extern "C" void expert_bias_backward_cuda(mt_backend *be, mt_bf16 *db, int64_t lddb, const mt_bf16 *dy, int64_t ldy,
                                          int64_t n, const mt_expert_offsets *g) {
    expert_offsets_check(g);
    if (n <= 0 || !db || (!g->dev && g->off[g->experts] == g->off[0])) return;
    cudaStream_t s = mt_cuda_begin(be);
    dim3 grid((unsigned)((n + BIAS_COLS - 1) / BIAS_COLS), (unsigned)g->experts), block(BIAS_COLS, BIAS_ROWS);
    expert_bias_backward_kernel<<<grid, block, 0, s>>>((bf16 *)db, lddb, (const bf16 *)dy, ldy, n, *g);
    MT_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// clip_qkv: clamp, and torch.clamp's gradient (passes where −c ≤ x ≤ c)

static __global__ void clip_forward_kernel(bf16 *x, int64_t n, float c) {
    GRID_STRIDE(i, n) x[i] = rn(fminf(fmaxf(bf(x[i]), -c), c));
}

static __global__ void clip_backward_kernel(bf16 *dy, const bf16 *x, int64_t n, float c) {
    GRID_STRIDE(i, n) {
        const float v = bf(x[i]);
        if (v < -c || v > c) dy[i] = rn(0.0f);
    }
}

// The value before clamping was RMSNorm's bf16 output: recomputed as rmsnorm_forward_cuda made it,
// w · (x · rstd) rounded once, so the same elements are cut as in the forward.
static __global__ void clip_backward_normed_kernel(bf16 *dy, const bf16 *x, const float *rstd, const bf16 *w,
                                                   int64_t rows, int64_t width, float c) {
    GRID_STRIDE(i, rows * width) {
        const float v = bf(rn(bf(w[i % width]) * (bf(x[i]) * rstd[i / width])));
        if (v < -c || v > c) dy[i] = rn(0.0f);
    }
}

extern "C" void clip_forward_cuda(mt_backend *be, mt_bf16 *x, int64_t n, float c) {
    if (n <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    clip_forward_kernel<<<mt_cuda_blocks(n, THREADS, 8192), THREADS, 0, s>>>((bf16 *)x, n, c);
    MT_CHECK_LAUNCH();
}

extern "C" void clip_backward_cuda(mt_backend *be, mt_bf16 *dy, const mt_bf16 *x, int64_t n, float c) {
    if (n <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    clip_backward_kernel<<<mt_cuda_blocks(n, THREADS, 8192), THREADS, 0, s>>>((bf16 *)dy, (const bf16 *)x, n, c);
    MT_CHECK_LAUNCH();
}

extern "C" void clip_backward_normed_cuda(mt_backend *be, mt_bf16 *dy, const mt_bf16 *x_raw, const float *rstd,
                                          const mt_bf16 *w, int64_t rows, int64_t width, float c) {
    if (rows <= 0 || width <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    clip_backward_normed_kernel<<<mt_cuda_blocks(rows * width, THREADS, 8192), THREADS, 0, s>>>(
        (bf16 *)dy, (const bf16 *)x_raw, rstd, (const bf16 *)w, rows, width, c);
    MT_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// The MLP's output: the shared expert's gate s = sigmoid(logit), out += s ⊙ y, and its backward

static __global__ void sigmoid_kernel(float *x, int64_t n) {
    GRID_STRIDE(i, n) x[i] = mt_sigmoid(x[i]);
}

// out [T, H] += (s ? s[t] : 1) · y [T, H]
static __global__ void scaled_add_kernel(bf16 *out, const bf16 *y, const float *s, int64_t T, int64_t H) {
    GRID_STRIDE(i, T * H) out[i] = rn(bf(out[i]) + (s ? s[i / H] : 1.0f) * bf(y[i]));
}

// dy [T, H] = s[t] · dx; ds [T] = s (1 − s) Σ_i dx·y; one block per row.
static __global__ void gate_backward_kernel(bf16 *dy, float *ds, const bf16 *dx, const bf16 *y, const float *s,
                                            int64_t T, int64_t H) {
    __shared__ float red[32];
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const float st = s[t];
        float dot = 0.0f;
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
            const float d = bf(dx[t * H + i]);
            dy[t * H + i] = rn(st * d);
            dot += d * bf(y[t * H + i]);
        }
        dot = mt_block_sum(dot, red);
        if (threadIdx.x == 0) ds[t] = dot * st * (1.0f - st);
    }
}

extern "C" void sigmoid_cuda(mt_backend *be, float *x, int64_t n) {
    if (n <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    sigmoid_kernel<<<mt_cuda_blocks(n, THREADS, 8192), THREADS, 0, s>>>(x, n);
    MT_CHECK_LAUNCH();
}

extern "C" void scaled_add_cuda(mt_backend *be, mt_bf16 *out, const mt_bf16 *y, const float *s, int64_t T,
                                int64_t H) {
    if (T <= 0 || H <= 0) return;
    cudaStream_t st = mt_cuda_begin(be);
    scaled_add_kernel<<<mt_cuda_blocks(T * H, THREADS, 8192), THREADS, 0, st>>>((bf16 *)out, (const bf16 *)y, s, T, H);
    MT_CHECK_LAUNCH();
}

extern "C" void gate_backward_cuda(mt_backend *be, mt_bf16 *dy, float *ds, const mt_bf16 *dx, const mt_bf16 *y,
                                   const float *s, int64_t T, int64_t H) {
    if (T <= 0 || H <= 0) return;
    cudaStream_t st = mt_cuda_begin(be);
    gate_backward_kernel<<<mt_cuda_blocks(T, 1), THREADS, 0, st>>>((bf16 *)dy, ds, (const bf16 *)dx, (const bf16 *)y, s,
                                                                    T, H);
    MT_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// MLA's key and value assembly (model/mla.c)

// k [T, nh, nope + rope] = kvb[:, h, :nope] | krot[t, :rope]; v [T, nh, vd] = kvb[:, h, nope:].
// One thread per element of k, then of v (the index past k's count).
static __global__ void mla_kv_forward_kernel(bf16 *k, bf16 *v, const bf16 *kvb, const bf16 *krot, int64_t krot_stride,
                                             int64_t rows, int nh, int nope, int rope, int vd) {
    const int64_t dk = nope + rope, dkv = nope + vd, nk = rows * dk;
    GRID_STRIDE(i, nk + rows * vd) {
        if (i < nk) {
            const int64_t row = i / dk;  // (t, h)
            const int c = (int)(i % dk);
            k[i] = c < nope ? kvb[row * dkv + c] : krot[(row / nh) * krot_stride + (c - nope)];
        } else {
            const int64_t e = i - nk, row = e / vd;
            v[e] = kvb[row * dkv + nope + e % vd];
        }
    }
}

// dkvb [T, nh, nope + vd] += dk's no-rope columns | dv, one thread per element.
static __global__ void mla_kv_dkvb_kernel(bf16 *dkvb, const bf16 *dk, const bf16 *dv, int64_t rows, int nope, int rope,
                                          int vd) {
    const int64_t dkv = nope + vd;
    GRID_STRIDE(i, rows * dkv) {
        const int64_t row = i / dkv;
        const int c = (int)(i % dkv);
        const float g = c < nope ? bf(dk[row * (nope + rope) + c]) : bf(dv[row * vd + c - nope]);
        dkvb[i] = rn(bf(dkvb[i]) + g);
    }
}

// dkrot [T, rows of krot_stride] += Σ_h dk[t, h, nope:], heads in order in fp32; one thread per (t, e).
static __global__ void mla_kv_dkrot_kernel(bf16 *dkrot, const bf16 *dk, int64_t krot_stride, int T, int nh, int nope,
                                           int rope) {
    const int64_t dkd = nope + rope;
    GRID_STRIDE(i, (int64_t)T * rope) {
        const int64_t t = i / rope;
        const int e = (int)(i % rope);
        float s = 0.0f;
        for (int h = 0; h < nh; h++) s += bf(dk[(t * nh + h) * dkd + nope + e]);
        bf16 *g = dkrot + t * krot_stride + e;
        *g = rn(bf(*g) + s);
    }
}

static void mla_kv_check(int nh, int nope, int rope, int vd, int64_t krot_stride) {
    if (nh <= 0 || nope < 0 || rope < 0 || vd <= 0 || krot_stride < rope)
        mt_fatal(MT_EXIT_ERROR, "mla_kv_cuda: nh=%d nope=%d rope=%d vd=%d krot_stride=%lld", nh, nope, rope, vd,
                 (long long)krot_stride);
}

extern "C" void mla_kv_forward_cuda(mt_backend *be, mt_bf16 *k, mt_bf16 *v, const mt_bf16 *kvb, const mt_bf16 *krot,
                                    int64_t krot_stride, int T, int nh, int nope, int rope, int vd) {
    mla_kv_check(nh, nope, rope, vd, krot_stride);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const int64_t rows = (int64_t)T * nh, n = rows * (nope + rope + vd);
    mla_kv_forward_kernel<<<mt_cuda_blocks(n, THREADS, 8192), THREADS, 0, s>>>(
        (bf16 *)k, (bf16 *)v, (const bf16 *)kvb, (const bf16 *)krot, krot_stride, rows, nh, nope, rope, vd);
    MT_CHECK_LAUNCH();
}

extern "C" void mla_kv_backward_cuda(mt_backend *be, mt_bf16 *dkvb, mt_bf16 *dkrot, const mt_bf16 *dk,
                                     const mt_bf16 *dv, int64_t krot_stride, int T, int nh, int nope, int rope,
                                     int vd) {
    mla_kv_check(nh, nope, rope, vd, krot_stride);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const int64_t rows = (int64_t)T * nh;
    if (dkvb) {
        mla_kv_dkvb_kernel<<<mt_cuda_blocks(rows * (nope + vd), THREADS, 8192), THREADS, 0, s>>>(
            (bf16 *)dkvb, (const bf16 *)dk, (const bf16 *)dv, rows, nope, rope, vd);
        MT_CHECK_LAUNCH();
    }
    if (dkrot && rope > 0) {
        mla_kv_dkrot_kernel<<<mt_cuda_blocks((int64_t)T * rope, THREADS, 8192), THREADS, 0, s>>>(
            (bf16 *)dkrot, (const bf16 *)dk, krot_stride, T, nh, nope, rope);
        MT_CHECK_LAUNCH();
    }
}
