// model/ops_cuda.cu — CUDA twins of model/ops.h on bf16 storage: embedding, RMSNorm, RoPE, fused
// causal attention (sliding window, key mask, GQA), the residual add, the f32 → bf16 cast, and
// the fp32 cross-entropy. Contract in model/ops_cuda.h.
//
// Every kernel loads bf16 into fp32 registers, computes in fp32 and rounds once on store
// (__float2bfloat16_rn); a gradient it accumulates into is read, added in fp32 and rounded once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "model/ops_cuda.h"
#include "model/attention_cudnn.h"
#include "model/attention_scratch.h"

enum { THREADS = 256 };

typedef __nv_bfloat16 bf16;

// ---------------------------------------------------------------------------------------------
// bf16 helpers: chunks of 8 elements (16 bytes). VEC: one 16-byte access when the chunk is whole
// (the launcher checked the alignment); otherwise element by element, the n valid ones only.

static __device__ __forceinline__ float bf(const bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 rn(float x) { return __float2bfloat16_rn(x); }

template <bool VEC> static __device__ __forceinline__ void load8(float f[8], const bf16 *p, int n) {
    if (VEC && n == 8) {
        uint4 u = *(const uint4 *)p;
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 t = __bfloat1622float2(h[i]);
            f[2 * i] = t.x, f[2 * i + 1] = t.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = i < n ? bf(p[i]) : 0.0f;
    }
}

template <bool VEC> static __device__ __forceinline__ void store8(bf16 *p, const float f[8], int n) {
    if (VEC && n == 8) {
        uint4 u;
        __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        *(uint4 *)p = u;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (i < n) p[i] = rn(f[i]);
    }
}

template <bool VEC> static __device__ __forceinline__ void load8(float f[8], const float *p, int n) {
    if (VEC && n == 8) {
        float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = i < n ? p[i] : 0.0f;
    }
}

// 16-byte accesses are allowed when every pointer is 16-byte aligned and `step` (a row length in
// elements, or 8 for flat arrays) keeps every chunk aligned.
static inline bool vec_ok(int64_t step, const void *a, const void *b = NULL, const void *c = NULL,
                          const void *d = NULL) {
    return step % 8 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 16 == 0 &&
           (uintptr_t)d % 16 == 0;
}

#define VEC_DISPATCH(ok, call) \
    do {                       \
        if (ok) call(true);    \
        else call(false);      \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Embedding

// out [T, H] bf16 = wte [V, H] bf16 [tokens[t]] (an exact copy); one block per row.
template <bool VEC>
static __global__ void embedding_forward_kernel(bf16 *out, const int32_t *tokens, const bf16 *wte, int T, int H) {
    const int chunks = (H + 7) / 8;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const bf16 *src = wte + (int64_t)tokens[t] * H;
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            const int n = MT_MIN(8, H - 8 * c);
            if (VEC && n == 8) *(uint4 *)(out + t * H + 8 * c) = *(const uint4 *)(src + 8 * c);
            else
                for (int i = 0; i < n; i++) out[t * H + 8 * c + i] = src[8 * c + i];
        }
    }
}

// The backward sums the rows of a repeated token in fp32 and rounds once into dwte, so each
// token's row has one writer: next[t] is the next row with the same token (−1: none), head[t]
// is 1 when no earlier row has it. next: one thread per row scans the later tokens tile by tile
// (the block stops when all its rows found theirs).
static __global__ void embedding_next_kernel(int32_t *next, const int32_t *tokens, int T) {
    __shared__ int32_t tile[THREADS];
    __shared__ int red[32];
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t tok = t < T ? tokens[t] : -1;
    int found = t < T ? -1 : T;  // rows past T count as found
    for (int u0 = blockIdx.x * blockDim.x + 1; u0 < T; u0 += blockDim.x) {
        __syncthreads();  // the previous tile is consumed
        if (u0 + (int)threadIdx.x < T) tile[threadIdx.x] = tokens[u0 + threadIdx.x];
        __syncthreads();
        if (found < 0)
            for (int i = 0; i < (int)blockDim.x && u0 + i < T; i++)
                if (u0 + i > t && tile[i] == tok) {
                    found = u0 + i;
                    break;
                }
        if (mt_block_sum(found < 0 ? 1 : 0, red) == 0) break;  // uniform over the block
    }
    if (t < T) next[t] = found < 0 ? -1 : found;
}

static __global__ void embedding_head_init_kernel(int32_t *head, int T) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T) head[t] = 1;
}

// head [T] starts at 1; a row that is some row's next is not a head (one predecessor each: no race).
static __global__ void embedding_head_kernel(int32_t *head, const int32_t *next, int T) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T && next[t] >= 0) head[next[t]] = 0;
}

// dwte [V, H] += Σ over a token's rows of dout [T, H], in row order; one block per head row.
template <bool VEC>
static __global__ void embedding_backward_kernel(bf16 *dwte, const bf16 *dout, const int32_t *tokens,
                                                 const int32_t *next, const int32_t *head, int T, int H) {
    const int chunks = (H + 7) / 8;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        if (!head[t]) continue;
        bf16 *dst = dwte + (int64_t)tokens[t] * H;
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            const int n = MT_MIN(8, H - 8 * c);
            float acc[8], g[8];
            load8<VEC>(acc, dst + 8 * c, n);
            for (int64_t u = t; u >= 0; u = next[u]) {
                load8<VEC>(g, dout + u * H + 8 * c, n);
#pragma unroll
                for (int i = 0; i < 8; i++) acc[i] += g[i];
            }
            store8<VEC>(dst + 8 * c, acc, n);
        }
    }
}

extern "C" void embedding_forward_cuda(mt_backend *be, mt_bf16 *out, const int32_t *tokens, const mt_bf16 *wte,
                                       int T, int H) {
    if (T <= 0 || H <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
#define LAUNCH(V)                                                                                              \
    embedding_forward_kernel<V><<<mt_cuda_blocks(T, 1), 128, 0, s>>>((bf16 *)out, tokens, (const bf16 *)wte, T, \
                                                                     H)
    VEC_DISPATCH(vec_ok(H, out, wte), LAUNCH);
#undef LAUNCH
    MT_CHECK_LAUNCH();
}

extern "C" void embedding_backward_cuda(mt_backend *be, mt_bf16 *dwte, const mt_bf16 *dout, const int32_t *tokens,
                                        int T, int H) {
    if (!dwte || T <= 0 || H <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    size_t bytes = (size_t)2 * T * sizeof(int32_t);
    int32_t *next = (int32_t *)mt_work_alloc(be, bytes), *head = next + T;
    const unsigned rblocks = mt_cuda_blocks(T, THREADS, 0x7fffffffu);
    embedding_next_kernel<<<rblocks, THREADS, 0, s>>>(next, tokens, T);
    MT_CHECK_LAUNCH();
    embedding_head_init_kernel<<<rblocks, THREADS, 0, s>>>(head, T);
    MT_CHECK_LAUNCH();
    embedding_head_kernel<<<rblocks, THREADS, 0, s>>>(head, next, T);
    MT_CHECK_LAUNCH();
#define LAUNCH(V)                                                                                                 \
    embedding_backward_kernel<V><<<mt_cuda_blocks(T, 1), 128, 0, s>>>((bf16 *)dwte, (const bf16 *)dout, tokens, \
                                                                      next, head, T, H)
    VEC_DISPATCH(vec_ok(H, dwte, dout), LAUNCH);
#undef LAUNCH
    MT_CHECK_LAUNCH();
    mt_work_free(be, next, bytes);  // stream-ordered: the free waits for the kernels
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

// x [T, H] bf16, w [H] bf16 → y [T, H] bf16 = w · (x · r), rstd [T] f32 = r; one block per row.
template <bool VEC>
static __global__ void rmsnorm_forward_kernel(bf16 *y, float *rstd, const bf16 *x, const bf16 *w, int T, int H,
                                              float eps) {
    __shared__ float red[32];
    const int chunks = (H + 7) / 8;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const bf16 *xt = x + t * H;
        float ss = 0.0f, f[8], g[8];
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            load8<VEC>(f, xt + 8 * c, MT_MIN(8, H - 8 * c));
#pragma unroll
            for (int i = 0; i < 8; i++) ss += f[i] * f[i];
        }
        ss = mt_block_sum(ss, red);
        const float r = 1.0f / sqrtf(ss / (float)H + eps);
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            const int n = MT_MIN(8, H - 8 * c);
            load8<VEC>(f, xt + 8 * c, n);
            load8<VEC>(g, w + 8 * c, n);
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = g[i] * (f[i] * r);
            store8<VEC>(y + t * H + 8 * c, f, n);
        }
        if (threadIdx.x == 0) rstd[t] = r;
    }
}

// dx [T, H] += r · (w dy − n · mean(w dy n)), n = x·r; one block per row.
template <bool VEC>
static __global__ void rmsnorm_backward_dx_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, const bf16 *w,
                                                  const float *rstd, int T, int H) {
    __shared__ float red[32];
    const int chunks = (H + 7) / 8;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const bf16 *xt = x + t * H, *gt = dy + t * H;
        const float r = rstd[t];
        float dot = 0.0f, xf[8], gf[8], wf[8], d[8];
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            const int n = MT_MIN(8, H - 8 * c);
            load8<VEC>(xf, xt + 8 * c, n);
            load8<VEC>(gf, gt + 8 * c, n);
            load8<VEC>(wf, w + 8 * c, n);
#pragma unroll
            for (int i = 0; i < 8; i++) dot += wf[i] * gf[i] * (xf[i] * r);
        }
        const float m = mt_block_sum(dot, red) / (float)H;
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            const int n = MT_MIN(8, H - 8 * c);
            load8<VEC>(xf, xt + 8 * c, n);
            load8<VEC>(gf, gt + 8 * c, n);
            load8<VEC>(wf, w + 8 * c, n);
            load8<VEC>(d, dx + t * H + 8 * c, n);
#pragma unroll
            for (int i = 0; i < 8; i++) d[i] += r * (wf[i] * gf[i] - (xf[i] * r) * m);
            store8<VEC>(dx + t * H + 8 * c, d, n);
        }
    }
}

enum { RMS_DW_ROWS = 256 };  // rows per partial column sum of dw

// part [nchunks, H] f32 = Σ over the chunk's rows of dy · x · r; a thread per column.
static __global__ void rmsnorm_dw_partial_kernel(float *part, const bf16 *dy, const bf16 *x, const float *rstd, int T,
                                                 int H) {
    int h = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (h >= H) return;
    int t0 = c * RMS_DW_ROWS, t1 = MT_MIN(T, t0 + RMS_DW_ROWS);
    float s = 0.0f;
    for (int64_t t = t0; t < t1; t++) s += bf(dy[t * H + h]) * (bf(x[t * H + h]) * rstd[t]);
    part[(int64_t)c * H + h] = s;
}

// dw [H] += Σ_c part[c, h], chunks in order, in fp32; one rounding into the bf16 gradient.
static __global__ void rmsnorm_dw_sum_kernel(bf16 *dw, const float *part, int nchunks, int H) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    float s = 0.0f;
    for (int c = 0; c < nchunks; c++) s += part[(int64_t)c * H + h];
    dw[h] = rn(bf(dw[h]) + s);
}

extern "C" void rmsnorm_forward_cuda(mt_backend *be, mt_bf16 *y, float *rstd, const mt_bf16 *x, const mt_bf16 *w,
                                     int T, int H, float eps) {
    if (T <= 0 || H <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
#define LAUNCH(V)                                                                                                  \
    rmsnorm_forward_kernel<V><<<mt_cuda_blocks(T, 1), THREADS, 0, s>>>((bf16 *)y, rstd, (const bf16 *)x,          \
                                                                       (const bf16 *)w, T, H, eps)
    VEC_DISPATCH(vec_ok(H, y, x, w), LAUNCH);
#undef LAUNCH
    MT_CHECK_LAUNCH();
}

extern "C" void rmsnorm_backward_cuda(mt_backend *be, mt_bf16 *dx, mt_bf16 *dw, const mt_bf16 *dy, const mt_bf16 *x,
                                      const mt_bf16 *w, const float *rstd, int T, int H) {
    if (T <= 0 || H <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    if (dx) {
#define LAUNCH(V)                                                                                                  \
    rmsnorm_backward_dx_kernel<V><<<mt_cuda_blocks(T, 1), THREADS, 0, s>>>(                                       \
        (bf16 *)dx, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)w, rstd, T, H)
        VEC_DISPATCH(vec_ok(H, dx, dy, x, w), LAUNCH);
#undef LAUNCH
        MT_CHECK_LAUNCH();
    }
    if (dw) {
        int nchunks = (T + RMS_DW_ROWS - 1) / RMS_DW_ROWS;
        size_t bytes = (size_t)nchunks * H * sizeof(float);
        float *part = (float *)mt_work_alloc(be, bytes);
        dim3 grid(mt_cuda_blocks(H, 128), (unsigned)nchunks);
        rmsnorm_dw_partial_kernel<<<grid, 128, 0, s>>>(part, (const bf16 *)dy, (const bf16 *)x, rstd, T, H);
        MT_CHECK_LAUNCH();
        rmsnorm_dw_sum_kernel<<<mt_cuda_blocks(H, 128), 128, 0, s>>>((bf16 *)dw, part, nchunks, H);
        MT_CHECK_LAUNCH();
        mt_work_free(be, part, bytes);  // stream-ordered: cudaFree waits for the kernels
    }
}

// ---------------------------------------------------------------------------------------------
// RoPE

// x [T, nh, stride] bf16: dims [off, off + rot) of each head rotated in place by ±angle, pairs
// (j, j + rot/2) or, interleaved, (2j, 2j + 1) (model/rope.c says why both); one thread per (t, j),
// the angle shared by the heads. inv_freq [rot/2] f32 (device; model/rope.h's table). The fp32
// arithmetic of model/rope.c (one product, cosf/sinf, times scale).
static __global__ void rope_kernel(bf16 *x, const int32_t *pos, int T, int nh, int stride, int off, int rot,
                                   int interleave, const float *inv_freq, float scale, float direction) {
    const int half = rot / 2, step = interleave ? 2 : 1, partner = interleave ? 1 : half;
    int64_t n = (int64_t)T * half;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = idx / half;
        int j = (int)(idx % half);
        float angle = __fmul_rn((float)pos[t], inv_freq[j]);
        float c = __fmul_rn(cosf(angle), scale), s = __fmul_rn(sinf(angle), scale) * direction;
        for (int h = 0; h < nh; h++) {
            bf16 *xa = x + (t * nh + h) * stride + off + (int64_t)j * step, *xb = xa + partner;
            float a = bf(*xa), b = bf(*xb);
            *xa = rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));  // two roundings then one add, as HF
            *xb = rn(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
        }
    }
}

static void rope_launch(mt_backend *be, mt_bf16 *x, const int32_t *pos, int T, int nh, int stride, int off, int rot,
                        int interleave, const float *inv_freq, float scale, float dir) {
    if (rot < 2 || rot % 2 || off < 0 || off + rot > stride)
        mt_fatal(MT_EXIT_ERROR, "rope_cuda: dims [%d, %d + %d) must be even in number (at least 2) and inside a head of %d",
                 off, off, rot, stride);
    if (T <= 0 || nh <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    rope_kernel<<<mt_cuda_blocks((int64_t)T * (rot / 2), THREADS), THREADS, 0, s>>>(
        (bf16 *)x, pos, T, nh, stride, off, rot, interleave, inv_freq, scale, dir);
    MT_CHECK_LAUNCH();
}

extern "C" void rope_forward_cuda(mt_backend *be, mt_bf16 *x, const int32_t *pos, int T, int n_heads, int stride,
                                  int off, int rot, int interleave, const float *inv_freq, float scale) {
    rope_launch(be, x, pos, T, n_heads, stride, off, rot, interleave, inv_freq, scale, 1.0f);
}

extern "C" void rope_backward_cuda(mt_backend *be, mt_bf16 *dx, const int32_t *pos, int T, int n_heads, int stride,
                                   int off, int rot, int interleave, const float *inv_freq, float scale) {
    rope_launch(be, dx, pos, T, n_heads, stride, off, rot, interleave, inv_freq, scale, -1.0f);
}

// ---------------------------------------------------------------------------------------------
// Attention on tensor cores. Visibility as model/attention.c: key j is visible to query i of
// sequence b iff j ≤ i, (window == 0 or i − j < window) and (key_mask == NULL or key_mask[b·S + j]).
//
// Design: our own flash-style kernels on WMMA (nvcuda::wmma 16×16×16 bf16 fragments, fp32
// accumulators), not query-chunked cuBLASLt GEMMs. Why: one kernel keeps the scores of a tile in
// shared memory and never writes a [chunk, S] score matrix to global memory (the cuBLASLt design
// moves it through HBM three times per chunk and needs a workspace that grows with S); masking,
// the window and GQA are index arithmetic in the kernel rather than batch strides; and the
// emulator gets a small, exactly specified fragment API (tests/cudasim/mma.h) with its own test.
//
// Each warp owns 16 rows (queries, or keys for dk/dv) and runs its GEMMs with warp_gemm below;
// the lanes then work on the 16 × 32 score tile in shared memory, two lanes per row (16 columns
// each). Tiles are bf16 in shared memory with their head dim zero-padded to a multiple of 16 (hqp
// for q and k, hvp for v and dout: MLA's differ) and a row pitch of that + 8 elements (off the
// bank period); fp32 accumulators (O, dQ, dK, dV) live in shared memory per warp so that the lanes
// can rescale rows (the fragment layout is opaque). So any head dims up to 256 run, multiples of
// 16 or not, equal or not; the zero padding adds nothing to the dot products.
// Blocks of 4 warps (2 when the larger padded dim is > 128, to fit sm_80's 163 KB of shared memory).
// Every shared buffer a fragment loads or stores starts at a multiple of 32 bytes (WMMA's rule):
// the bf16 buffers hold multiples of 16 rows of a pitch that is a multiple of 8 elements.
// Roundings beyond the fp32 flash kernels of before: P (forward, and for dV) and dS (for dQ,
// dK) are rounded to bf16 before their tensor-core GEMM, as FlashAttention-2 does.

enum { ATT_BK = 32, ATT_LDF = ATT_BK + 4, ATT_LDP = ATT_BK + 8, ATT_MAX_HD = 256 };

namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> att_fa;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> att_fc;

static __device__ __forceinline__ int att_visible(const uint8_t *mask, int b, int S, int i, int j, int window) {
    return j >= 0 && j <= i && i < S && (window == 0 || i - j < window) && (!mask || mask[(int64_t)b * S + j]);
}

// One warp: C[16, 16·nt] (pitch ldc, fp32) = (acc ? C : 0) + A[16, kd] · B[kd, 16·nt], A row-major
// (pitch lda); B row-major at b (element (k, n) at b[k·ldb + n]) or, BT, B = Xᵀ with X row-major
// (element (k, n) at b[n·ldb + k]). kd is a multiple of 16. The other lanes read C only after a
// __syncwarp (the store is warp-synchronous, its writes are not ordered before their reads).
template <bool BT>
static __device__ void warp_gemm(float *c, int ldc, int nt, const bf16 *a, int lda, const bf16 *b, int ldb, int kd,
                                 bool acc) {
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, typename std::conditional<BT, wmma::col_major, wmma::row_major>::type> fb_t;
    att_fa fa;
    fb_t fb;
    att_fc fc;
    for (int n = 0; n < nt; n++) {
        if (acc) wmma::load_matrix_sync(fc, c + 16 * n, (unsigned)ldc, wmma::mem_row_major);
        else wmma::fill_fragment(fc, 0.0f);
        for (int kk = 0; kk < kd; kk += 16) {
            wmma::load_matrix_sync(fa, a + kk, (unsigned)lda);
            wmma::load_matrix_sync(fb, BT ? b + (int64_t)16 * n * ldb + kk : b + (int64_t)kk * ldb + 16 * n, (unsigned)ldb);
            wmma::mma_sync(fc, fa, fb, fc);
        }
        wmma::store_matrix_sync(c + 16 * n, fc, (unsigned)ldc, wmma::mem_row_major);
    }
}

// rows × hdp bf16 into dst (pitch ld) from src (row r at src + r·stride), zeros past `valid` rows
// and past hd columns; all threads of the block; 16-byte copies when aligned (uniform condition).
static __device__ void att_load(bf16 *dst, int ld, const bf16 *src, int64_t stride, int rows, int valid, int hd,
                                int hdp) {
    const bool vec = hd % 8 == 0 && stride % 8 == 0 && (uintptr_t)src % 16 == 0;
    const int cpr = hdp / 8;
    for (int idx = threadIdx.x; idx < rows * cpr; idx += blockDim.x) {
        const int r = idx / cpr, d = (idx % cpr) * 8;
        bf16 *o = dst + r * ld + d;
        if (vec && r < valid && d + 8 <= hd) {
            *(uint4 *)o = *(const uint4 *)(src + r * stride + d);
            continue;
        }
        for (int e = 0; e < 8; e++) o[e] = r < valid && d + e < hd ? src[r * stride + d + e] : rn(0.0f);
    }
}

static __host__ __device__ __forceinline__ int att_hdp(int hd) { return (hd + 15) & ~15; }
static __host__ __device__ __forceinline__ int att_warps(int hd, int hv) { return att_hdp(MT_MAX(hd, hv)) > 128 ? 2 : 4; }

// Forward: grid (ceil(S / 16·nw), nh, B), 32·nw threads. Online softmax per row in fp32 (m, l held
// by both lanes of the row); O accumulates in shared memory, rescaled by the lanes per key tile.
// q, k rows of hd, v, out rows of hv.
static __global__ void attention_forward_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                                const bf16 *sinks, const uint8_t *mask, int S, int nh, int nkv, int hd,
                                                int hv, int window, float scale) {
    extern __shared__ __align__(128) unsigned char att_sm[];
    const int nw = blockDim.x >> 5, hqp = att_hdp(hd), hvp = att_hdp(hv), ldq = hqp + 8, ldv = hvp + 8, ldo = hvp + 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
    bf16 *Qs = (bf16 *)att_sm, *Ks = Qs + nw * 16 * ldq, *Vs = Ks + ATT_BK * ldq;
    float *Fs = (float *)(Vs + ATT_BK * ldv), *Sw = Fs + warp * 16 * (ATT_LDF + ldo), *Ow = Sw + 16 * ATT_LDF;
    bf16 *Pw = (bf16 *)(Fs + nw * 16 * (ATT_LDF + ldo)) + warp * 16 * ATT_LDP;
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * nw * 16, wi0 = i0 + warp * 16, i = wi0 + r;
    const int kvh = h / (nh / nkv), d0 = half * hvp / 2, d1 = d0 + hvp / 2;
    att_load(Qs, ldq, q + (((int64_t)b * S + i0) * nh + h) * hd, (int64_t)nh * hd, nw * 16, MT_MIN(nw * 16, S - i0),
             hd, hqp);
    for (int d = d0; d < d1; d++) Ow[r * ldo + d] = 0.0f;

    float m = -INFINITY, l = 0.0f;
    const int kstart = window > 0 ? MT_MAX(0, i0 - window + 1) : 0, kend = MT_MIN(i0 + nw * 16, S) - 1;
    for (int j0 = kstart; j0 <= kend; j0 += ATT_BK) {  // key tiles past the block's last query: skipped
        const int64_t kv0 = ((int64_t)b * S + j0) * nkv + kvh;
        __syncthreads();  // the previous tile is consumed (and Qs, Ow written, the first time)
        att_load(Ks, ldq, k + kv0 * hd, (int64_t)nkv * hd, ATT_BK, MT_MIN(ATT_BK, S - j0), hd, hqp);
        att_load(Vs, ldv, v + kv0 * hv, (int64_t)nkv * hv, ATT_BK, MT_MIN(ATT_BK, S - j0), hv, hvp);
        __syncthreads();
        if (wi0 >= S || j0 > wi0 + 15 || (window > 0 && j0 + ATT_BK - 1 <= wi0 - window)) continue;  // all masked
        warp_gemm<true>(Sw, ATT_LDF, ATT_BK / 16, Qs + warp * 16 * ldq, ldq, Ks, ldq, hqp, false);  // S = Q Kᵀ
        __syncwarp();
        float s[16], mx = -INFINITY;
        for (int c = 0; c < 16; c++) {
            const int col = half * 16 + c;
            s[c] = att_visible(mask, b, S, i, j0 + col, window) ? Sw[r * ATT_LDF + col] * scale : -INFINITY;
            mx = fmaxf(mx, s[c]);
        }
        const float m_new = fmaxf(m, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
        const float corr = m_new == -INFINITY ? 1.0f : expf(m - m_new);  // exp(-inf) = 0
        float sum = 0.0f;
        for (int c = 0; c < 16; c++) {
            const float p = s[c] == -INFINITY ? 0.0f : expf(s[c] - m_new);
            Pw[r * ATT_LDP + half * 16 + c] = rn(p);
            sum += p;
        }
        l = l * corr + sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        m = m_new;
        for (int d = d0; d < d1; d++) Ow[r * ldo + d] *= corr;
        __syncwarp();
        warp_gemm<false>(Ow, ldo, hvp / 16, Pw, ATT_LDP, Vs, ldv, ATT_BK, true);  // O += P V
    }
    __syncwarp();
    if (i >= S) return;
    const int64_t row = ((int64_t)b * S + i) * nh + h;
    if (sinks) {  // the sink joins the denominator: l·e^m + e^z over their max (no key: out 0, lse z)
        const float z = bf(sinks[h]), mx = fmaxf(m, z), a = expf(m - mx), den = l * a + expf(z - mx);
        const float inv = a / den;
        for (int d = d0; d < MT_MIN(d1, hv); d++) out[row * hv + d] = rn(Ow[r * ldo + d] * inv);
        if (half == 0) lse[row] = mx + logf(den);
        return;
    }
    const float inv = m == -INFINITY ? 0.0f : 1.0f / l;  // no visible key: out 0, lse -inf
    for (int d = d0; d < MT_MIN(d1, hv); d++) out[row * hv + d] = rn(Ow[r * ldo + d] * inv);
    if (half == 0) lse[row] = m == -INFINITY ? -INFINITY : m + logf(l);
}

// D [T·nh] f32 = Σ_d dout · out (both bf16, rows of hv); one warp per row.
static __global__ void attention_d_kernel(float *D, const bf16 *dout, const bf16 *out, int64_t rows, int hv) {
    int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    float s = 0.0f;
    for (int d = lane; d < hv; d += 32) s += bf(dout[r * hv + d]) * bf(out[r * hv + d]);
    s = mt_warp_sum(s);
    if (lane == 0) D[r] = s;
}

// dsinks [nh] bf16 += −Σ_t exp(sinks[h] − lse[t, h]) · D[t, h]: one block per head, the rows
// reduced in fp32 in a fixed order (strided partials, then the block's tree), one rounding.
static __global__ void attention_dsinks_kernel(bf16 *dsinks, const bf16 *sinks, const float *lse, const float *D,
                                               int64_t T, int nh) {
    __shared__ float red[32];
    const int h = blockIdx.x;
    const float z = bf(sinks[h]);
    float acc = 0.0f;
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) acc -= expf(z - lse[t * nh + h]) * D[t * nh + h];
    acc = mt_block_sum(acc, red);
    if (threadIdx.x == 0) dsinks[h] = rn(bf(dsinks[h]) + acc);
}

// dq: grid as the forward. P_ij = exp(scale q_i·k_j − lse_i), dS_ij = P_ij (dO_i·v_j − D_i) scale,
// dq_i += Σ_j dS_ij k_j (dS rounded to bf16 for the tensor cores).
static __global__ void attention_dq_kernel(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                                           const float *lse, const float *D, const uint8_t *mask, int S, int nh,
                                           int nkv, int hd, int hv, int window, float scale) {
    extern __shared__ __align__(128) unsigned char att_sm[];
    const int nw = blockDim.x >> 5, hqp = att_hdp(hd), hvp = att_hdp(hv), ldq = hqp + 8, ldv = hvp + 8, ldo = hqp + 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
    bf16 *Qs = (bf16 *)att_sm, *Gs = Qs + nw * 16 * ldq, *Ks = Gs + nw * 16 * ldv, *Vs = Ks + ATT_BK * ldq;
    float *Fs = (float *)(Vs + ATT_BK * ldv), *Sw = Fs + warp * 16 * (2 * ATT_LDF + ldo), *Dw = Sw + 16 * ATT_LDF;
    float *Aw = Dw + 16 * ATT_LDF;
    bf16 *Pw = (bf16 *)(Fs + nw * 16 * (2 * ATT_LDF + ldo)) + warp * 16 * ATT_LDP;
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * nw * 16, wi0 = i0 + warp * 16, i = wi0 + r;
    const int kvh = h / (nh / nkv), d0 = half * hqp / 2, d1 = d0 + hqp / 2;
    const int64_t q0 = ((int64_t)b * S + i0) * nh + h, row = ((int64_t)b * S + i) * nh + h;
    const int nq = MT_MIN(nw * 16, S - i0);
    att_load(Qs, ldq, q + q0 * hd, (int64_t)nh * hd, nw * 16, nq, hd, hqp);
    att_load(Gs, ldv, dout + q0 * hv, (int64_t)nh * hv, nw * 16, nq, hv, hvp);
    for (int d = d0; d < d1; d++) Aw[r * ldo + d] = 0.0f;
    const float lse_i = i < S ? lse[row] : -INFINITY, D_i = i < S ? D[row] : 0.0f;

    const int kstart = window > 0 ? MT_MAX(0, i0 - window + 1) : 0, kend = MT_MIN(i0 + nw * 16, S) - 1;
    for (int j0 = kstart; j0 <= kend; j0 += ATT_BK) {
        const int64_t kv0 = ((int64_t)b * S + j0) * nkv + kvh;
        __syncthreads();
        att_load(Ks, ldq, k + kv0 * hd, (int64_t)nkv * hd, ATT_BK, MT_MIN(ATT_BK, S - j0), hd, hqp);
        att_load(Vs, ldv, v + kv0 * hv, (int64_t)nkv * hv, ATT_BK, MT_MIN(ATT_BK, S - j0), hv, hvp);
        __syncthreads();
        if (wi0 >= S || j0 > wi0 + 15 || (window > 0 && j0 + ATT_BK - 1 <= wi0 - window)) continue;
        warp_gemm<true>(Sw, ATT_LDF, ATT_BK / 16, Qs + warp * 16 * ldq, ldq, Ks, ldq, hqp, false);  // Q Kᵀ
        warp_gemm<true>(Dw, ATT_LDF, ATT_BK / 16, Gs + warp * 16 * ldv, ldv, Vs, ldv, hvp, false);  // dO Vᵀ
        __syncwarp();
        for (int c = 0; c < 16; c++) {
            const int col = half * 16 + c;
            float ds = 0.0f;
            if (lse_i != -INFINITY && att_visible(mask, b, S, i, j0 + col, window)) {  // no visible key: zero
                const float p = expf(Sw[r * ATT_LDF + col] * scale - lse_i);
                ds = p * (Dw[r * ATT_LDF + col] - D_i) * scale;
            }
            Pw[r * ATT_LDP + col] = rn(ds);
        }
        __syncwarp();
        warp_gemm<false>(Aw, ldo, hqp / 16, Pw, ATT_LDP, Ks, ldq, ATT_BK, true);  // dQ += dS K
    }
    __syncwarp();
    if (i >= S) return;
    for (int d = d0; d < MT_MIN(d1, hd); d++) dq[row * hd + d] = rn(bf(dq[row * hd + d]) + Aw[r * ldo + d]);
}

// dk, dv: grid (ceil(S / 16·nw), nkv, B); a warp owns 16 keys, over tiles of 32 queries of every
// query head of the kv head's group: dv_j += Σ_i P_ij dO_i, dk_j += Σ_i dS_ij q_i (Pᵀ and dSᵀ
// computed directly as K Qᵀ and V dOᵀ, rounded to bf16 for the tensor cores).
static __global__ void attention_dkv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k,
                                            const bf16 *v, const float *lse, const float *D, const uint8_t *mask,
                                            int S, int nh, int nkv, int hd, int hv, int window, float scale) {
    extern __shared__ __align__(128) unsigned char att_sm[];
    const int nw = blockDim.x >> 5, hqp = att_hdp(hd), hvp = att_hdp(hv), ldq = hqp + 8, ldv = hvp + 8;
    const int ldok = hqp + 4, ldov = hvp + 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
    bf16 *Ks = (bf16 *)att_sm, *Vs = Ks + nw * 16 * ldq, *Qs = Vs + nw * 16 * ldv, *Gs = Qs + ATT_BK * ldq;
    float *Ls = (float *)(Gs + ATT_BK * ldv), *Ds = Ls + ATT_BK, *Fs = Ds + ATT_BK;
    float *Sw = Fs + warp * 16 * (2 * ATT_LDF + ldok + ldov), *Dw = Sw + 16 * ATT_LDF, *Kw = Dw + 16 * ATT_LDF;
    float *Vw = Kw + 16 * ldok;
    bf16 *Pw = (bf16 *)(Fs + nw * 16 * (2 * ATT_LDF + ldok + ldov)) + warp * 32 * ATT_LDP, *Ew = Pw + 16 * ATT_LDP;
    const int b = blockIdx.z, kvh = blockIdx.y, j0 = blockIdx.x * nw * 16, wj0 = j0 + warp * 16, j = wj0 + r;
    const int group = nh / nkv, dk0 = half * hqp / 2, dk1 = dk0 + hqp / 2, dv0 = half * hvp / 2, dv1 = dv0 + hvp / 2;
    const int64_t k0 = ((int64_t)b * S + j0) * nkv + kvh;
    att_load(Ks, ldq, k + k0 * hd, (int64_t)nkv * hd, nw * 16, MT_MIN(nw * 16, S - j0), hd, hqp);
    att_load(Vs, ldv, v + k0 * hv, (int64_t)nkv * hv, nw * 16, MT_MIN(nw * 16, S - j0), hv, hvp);
    for (int d = dk0; d < dk1; d++) Kw[r * ldok + d] = 0.0f;
    for (int d = dv0; d < dv1; d++) Vw[r * ldov + d] = 0.0f;

    const int last = window > 0 ? MT_MIN(S - 1, j0 + nw * 16 - 1 + window - 1) : S - 1;  // later queries: masked
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int i0 = j0; i0 <= last; i0 += ATT_BK) {
            const int64_t q0 = ((int64_t)b * S + i0) * nh + h;
            const int nq = MT_MIN(ATT_BK, S - i0);
            __syncthreads();
            att_load(Qs, ldq, q + q0 * hd, (int64_t)nh * hd, ATT_BK, nq, hd, hqp);
            att_load(Gs, ldv, dout + q0 * hv, (int64_t)nh * hv, ATT_BK, nq, hv, hvp);
            if (threadIdx.x < ATT_BK) {
                const int t = threadIdx.x;
                Ls[t] = t < nq ? lse[q0 + (int64_t)t * nh] : -INFINITY;
                Ds[t] = t < nq ? D[q0 + (int64_t)t * nh] : 0.0f;
            }
            __syncthreads();
            if (wj0 >= S || i0 + ATT_BK - 1 < wj0 || (window > 0 && i0 - (wj0 + 15) >= window)) continue;
            warp_gemm<true>(Sw, ATT_LDF, ATT_BK / 16, Ks + warp * 16 * ldq, ldq, Qs, ldq, hqp, false);  // K Qᵀ
            warp_gemm<true>(Dw, ATT_LDF, ATT_BK / 16, Vs + warp * 16 * ldv, ldv, Gs, ldv, hvp, false);  // V dOᵀ
            __syncwarp();
            for (int c = 0; c < 16; c++) {
                const int col = half * 16 + c;
                float p = 0.0f, ds = 0.0f;
                if (Ls[col] != -INFINITY && att_visible(mask, b, S, i0 + col, j, window)) {
                    p = expf(Sw[r * ATT_LDF + col] * scale - Ls[col]);
                    ds = p * (Dw[r * ATT_LDF + col] - Ds[col]) * scale;
                }
                Pw[r * ATT_LDP + col] = rn(p);
                Ew[r * ATT_LDP + col] = rn(ds);
            }
            __syncwarp();
            warp_gemm<false>(Vw, ldov, hvp / 16, Pw, ATT_LDP, Gs, ldv, ATT_BK, true);  // dV += Pᵀ dO
            warp_gemm<false>(Kw, ldok, hqp / 16, Ew, ATT_LDP, Qs, ldq, ATT_BK, true);  // dK += dSᵀ Q
        }
    __syncwarp();
    if (j >= S || (mask && !mask[(int64_t)b * S + j])) return;  // a masked key is seen by no one
    const int64_t krow = ((int64_t)b * S + j) * nkv + kvh;
    if (dv)
        for (int d = dv0; d < MT_MIN(dv1, hv); d++) dv[krow * hv + d] = rn(bf(dv[krow * hv + d]) + Vw[r * ldov + d]);
    if (dk)
        for (int d = dk0; d < MT_MIN(dk1, hd); d++) dk[krow * hd + d] = rn(bf(dk[krow * hd + d]) + Kw[r * ldok + d]);
}

static void att_check(int nh, int nkv, int hd, int hv) {
    if (nkv <= 0 || nh % nkv != 0 || hd <= 0 || hd > ATT_MAX_HD || hv <= 0 || hv > ATT_MAX_HD)
        mt_fatal(MT_EXIT_ERROR, "attention_cuda: nh=%d must be a multiple of nkv=%d, 0 < hd=%d, hd_v=%d <= %d", nh, nkv,
                 hd, hv, ATT_MAX_HD);
}

// Dynamic shared memory beyond the default 48 KiB must be asked for per kernel.
template <typename K> static void att_smem(K kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        MT_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

static __global__ void attention_kv_len_kernel(int32_t *kv_len, const uint8_t *mask, int B, int S) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    int32_t n = 0;
    for (int j = 0; j < S; j++) n += mask[(int64_t)b * S + j] != 0;
    kv_len[b] = n;
}

extern "C" void attention_kv_len_cuda(mt_backend *be, int32_t *kv_len, const uint8_t *key_mask, int B, int S) {
    if (B <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    attention_kv_len_kernel<<<(unsigned)((B + 63) / 64), 64, 0, s>>>(kv_len, key_mask, B, S);
    MT_CHECK_LAUNCH();
}

// Sinks are not in the cuDNN graph (model/attention_cudnn.h): the WMMA kernels run them, whatever
// MT_ATTENTION says (noted once when it asked for cuDNN).
static bool att_sinks_skip_cudnn(const mt_bf16 *sinks) {
    static bool noted;
    if (!sinks) return false;
    if (!noted && attention_get_mode() == MT_ATTENTION_CUDNN)
        fprintf(stderr, "attention: sinks are not in the cuDNN graph: using the WMMA kernel\n");
    noted = true;
    return true;
}

// Which path runs (cuDNN's SDPA where it loads and takes the shape, else the WMMA kernels, which
// always run sinks): model/ops_cuda.h. The WMMA kernels take every 0 < hd, hd_v ≤ 256, equal or
// not, multiples of 16 or not (zero-padded in shared memory): no caller pads.
extern "C" void attention_forward_cuda(mt_backend *be, mt_bf16 *out_, float *lse, const mt_bf16 *q_,
                                       const mt_bf16 *k_, const mt_bf16 *v_, const mt_bf16 *sinks,
                                       const uint8_t *key_mask, const int32_t *kv_len, int B, int S, int nh, int nkv,
                                       int hd, int hd_v, float scale, int window) {
    // cuDNN's SDPA where it is loaded and takes the shape (model/attention_cudnn.h), else the kernel.
    if (!att_sinks_skip_cudnn(sinks) && attention_cudnn_forward(be, out_, lse, q_, k_, v_, key_mask, kv_len, B, S, nh,
                                                                nkv, hd, hd_v, scale, window))
        return;
    att_check(nh, nkv, hd, hd_v);
    if (B <= 0 || S <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const int nw = att_warps(hd, hd_v), ldq = att_hdp(hd) + 8, ldv = att_hdp(hd_v) + 8, ldo = att_hdp(hd_v) + 4;
    const size_t smem = (size_t)2 * ((nw * 16 + ATT_BK) * ldq + ATT_BK * ldv) + (size_t)4 * nw * 16 * (ATT_LDF + ldo) +
                        (size_t)2 * nw * 16 * ATT_LDP;
    att_smem(attention_forward_kernel, smem);
    dim3 grid((unsigned)((S + nw * 16 - 1) / (nw * 16)), (unsigned)nh, (unsigned)B);
    attention_forward_kernel<<<grid, 32 * nw, smem, s>>>((bf16 *)out_, lse, (const bf16 *)q_, (const bf16 *)k_,
                                                         (const bf16 *)v_, (const bf16 *)sinks, key_mask, S, nh,
                                                         nkv, hd, hd_v, window, scale);
    MT_CHECK_LAUNCH();
}

extern "C" void attention_backward_cuda(mt_backend *be, mt_bf16 *dq_, mt_bf16 *dk_, mt_bf16 *dv_, mt_bf16 *dsinks,
                                        const mt_bf16 *dout_, const mt_bf16 *q_, const mt_bf16 *k_,
                                        const mt_bf16 *v_, const mt_bf16 *out_, const float *lse,
                                        const mt_bf16 *sinks, const uint8_t *key_mask, const int32_t *kv_len, int B,
                                        int S, int nh, int nkv, int hd, int hd_v, float scale, int window) {
    if (dsinks && !sinks) mt_fatal(MT_EXIT_ERROR, "attention_backward_cuda: dsinks without sinks");
    if (!att_sinks_skip_cudnn(sinks) && attention_cudnn_backward(be, dq_, dk_, dv_, dout_, q_, k_, v_, out_, lse,
                                                                 key_mask, kv_len, B, S, nh, nkv, hd, hd_v, scale,
                                                                 window))
        return;
    att_check(nh, nkv, hd, hd_v);
    if (B <= 0 || S <= 0 || (!dq_ && !dk_ && !dv_ && !dsinks)) return;
    cudaStream_t s = mt_cuda_begin(be);
    bf16 *dq = (bf16 *)dq_, *dk = (bf16 *)dk_, *dv = (bf16 *)dv_;
    const bf16 *dout = (const bf16 *)dout_, *q = (const bf16 *)q_, *k = (const bf16 *)k_, *v = (const bf16 *)v_;
    const int64_t rows = (int64_t)B * S * nh;
    const size_t dbytes = mt_att_wmma_scratch_bytes(1, B, S, nh);
    float *D = (float *)mt_work_alloc(be, dbytes);
    attention_d_kernel<<<mt_cuda_blocks(rows * 32, THREADS, 0x7fffffffu), THREADS, 0, s>>>(D, dout, (const bf16 *)out_,
                                                                                          rows, hd_v);
    MT_CHECK_LAUNCH();
    if (dsinks) {  // lse includes the sinks, so dq, dk, dv below need nothing more
        attention_dsinks_kernel<<<(unsigned)nh, THREADS, 0, s>>>((bf16 *)dsinks, (const bf16 *)sinks, lse, D,
                                                                 (int64_t)B * S, nh);
        MT_CHECK_LAUNCH();
    }
    const int nw = att_warps(hd, hd_v), ldq = att_hdp(hd) + 8, ldv = att_hdp(hd_v) + 8;
    const int ldok = att_hdp(hd) + 4, ldov = att_hdp(hd_v) + 4;
    const unsigned tiles = (unsigned)((S + nw * 16 - 1) / (nw * 16));
    const size_t tiles_bf16 = (size_t)2 * (nw * 16 + ATT_BK) * (ldq + ldv);  // q or k, and v or dout, tiles
    if (dq) {
        const size_t smem = tiles_bf16 + (size_t)4 * nw * 16 * (2 * ATT_LDF + ldok) + (size_t)2 * nw * 16 * ATT_LDP;
        att_smem(attention_dq_kernel, smem);
        attention_dq_kernel<<<dim3(tiles, (unsigned)nh, (unsigned)B), 32 * nw, smem, s>>>(
            dq, dout, q, k, v, lse, D, key_mask, S, nh, nkv, hd, hd_v, window, scale);
        MT_CHECK_LAUNCH();
    }
    if (dk || dv) {
        const size_t smem = tiles_bf16 + (size_t)4 * 2 * ATT_BK + (size_t)4 * nw * 16 * (2 * ATT_LDF + ldok + ldov) +
                            (size_t)2 * nw * 32 * ATT_LDP;
        att_smem(attention_dkv_kernel, smem);
        attention_dkv_kernel<<<dim3(tiles, (unsigned)nkv, (unsigned)B), 32 * nw, smem, s>>>(
            dk, dv, dout, q, k, v, lse, D, key_mask, S, nh, nkv, hd, hd_v, window, scale);
        MT_CHECK_LAUNCH();
    }
    mt_work_free(be, D, dbytes);
}

// Cross-entropy

struct ce_result {
    double loss;
    long long count;
    int bad_row;  // the first row with a target outside [0, V), or CE_NO_BAD_ROW
};
#define CE_NO_BAD_ROW 0x7f7f7f7f  // what a memset of 0x7f bytes leaves

// One block per row: max, Σ exp, lse, the row's loss, and the gradient written in the same
// kernel (in place when dlogits == logits: every read of the row precedes the block's barriers).
// row0: the first row's index in the step, for the bad-row report of a chunk.
static __global__ void cross_entropy_kernel(float *dlogits, float dscale, const float *logits, const int32_t *targets,
                                            int T, int V, int ignore_index, double *row_loss, ce_result *res,
                                            int64_t row0) {
    __shared__ float red[32];
    const int in_place = dlogits == logits;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int tgt = targets[t];
        if (tgt == ignore_index) {
            if (threadIdx.x == 0) row_loss[t] = 0.0;
            if (in_place)  // the row's gradient is 0, and the logits it held must not pass for one
                for (int i = threadIdx.x; i < V; i += blockDim.x) dlogits[t * V + i] = 0.0f;
            continue;
        }
        if (tgt < 0 || tgt >= V) {
            if (threadIdx.x == 0) {
                row_loss[t] = 0.0;
                atomicMin(&res->bad_row, (int)(row0 + t));  // reported on the host after the sync
            }
            continue;
        }
        const float *lt = logits + t * V;
        const float l_tgt = lt[tgt];
        float m = -INFINITY;
        for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, lt[i]);
        m = mt_block_max(m, red);
        float sum = 0.0f;
        for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(lt[i] - m);
        sum = mt_block_sum(sum, red);  // ends synchronised: every read of the row is done
        float lse = m + logf(sum);
        if (threadIdx.x == 0) row_loss[t] = (double)lse - l_tgt;
        if (!dlogits) continue;
        float inv = 1.0f / sum, *dt = dlogits + t * V;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            float g = dscale * (expf(lt[i] - m) * inv);
            float d = in_place ? g : dt[i] + g;
            dt[i] = i == tgt ? d - dscale : d;
        }
    }
}

// res->loss = Σ row_loss in a fixed order, res->count = counted rows (added to them when
// `accumulate`: the chunks of the fused loss, one after another on the stream); one block.
static __global__ void cross_entropy_sum_kernel(const double *row_loss, const int32_t *targets, int T, int V,
                                                int ignore_index, ce_result *res, int accumulate) {
    __shared__ double red[32];
    __shared__ long long redc[32];
    double s = 0.0;
    long long c = 0;
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        s += row_loss[t];
        c += targets[t] != ignore_index && targets[t] >= 0 && targets[t] < V;
    }
    s = mt_block_sum(s, red);
    c = mt_block_sum(c, redc);
    if (threadIdx.x == 0) {
        if (accumulate) res->loss += s, res->count += c;
        else res->loss = s, res->count = c;
    }
}

// The result to the host: the one synchronisation (the host wants the sum); a target outside
// [0, V) is fatal, named by its row in the step (targets: the step's).
static ce_result ce_result_to_host(mt_backend *be, const ce_result *res, const int32_t *targets, int V,
                                   int ignore_index) {
    ce_result h;
    MT_CHECK_CUDA(cudaMemcpyAsync(&h, res, sizeof h, cudaMemcpyDeviceToHost, mt_cuda_begin(be)));
    mt_cuda_backend_sync(be);
    if (h.bad_row != CE_NO_BAD_ROW) {
        int32_t bad = 0;
        MT_CHECK_CUDA(cudaMemcpy(&bad, targets + h.bad_row, sizeof bad, cudaMemcpyDeviceToHost));
        mt_fatal(MT_EXIT_ERROR, "cross_entropy: row %d has target %d outside [0, %d) (ignore_index %d)", h.bad_row,
                 bad, V, ignore_index);
    }
    return h;
}

extern "C" double cross_entropy_cuda(mt_backend *be, float *dlogits, float dscale, int64_t *count,
                                     const float *logits, const int32_t *targets, int T, int V, int ignore_index) {
    if (count) *count = 0;
    if (T <= 0) return 0.0;
    cudaStream_t s = mt_cuda_begin(be);
    size_t bytes = (size_t)T * sizeof(double) + sizeof(ce_result);
    double *row_loss = (double *)mt_work_alloc(be, bytes);
    ce_result *res = (ce_result *)(row_loss + T);
    MT_CHECK_CUDA(cudaMemsetAsync(res, 0x7f, sizeof *res, s));
    cross_entropy_kernel<<<mt_cuda_blocks(T, 1, 0x7fffffffu), 512, 0, s>>>(dlogits, dscale, logits, targets, T, V,
                                                                            ignore_index, row_loss, res, 0);
    MT_CHECK_LAUNCH();
    if (dlogits && !count) {  // the gradient alone (the backward's pass): no sum, no host wait
        mt_work_free(be, row_loss, bytes);
        return 0.0;
    }
    cross_entropy_sum_kernel<<<1, 1024, 0, s>>>(row_loss, targets, T, V, ignore_index, res, 0);
    MT_CHECK_LAUNCH();
    ce_result h = ce_result_to_host(be, res, targets, V, ignore_index);
    mt_work_free(be, row_loss, bytes);
    if (count) *count = h.count;
    return h.loss;
}

// ---------------------------------------------------------------------------------------------
// The fused loss's forward: chunks accumulated on the device, one host wait at the end

static_assert(sizeof(ce_result) <= MT_CE_ACC_BYTES(0), "the accumulator's result slot");

static ce_result *ce_acc_result(void *acc, int rows) { return (ce_result *)((double *)acc + rows); }

extern "C" void cross_entropy_acc_start(mt_backend *be, void *acc, int rows) {
    cudaStream_t s = mt_cuda_begin(be);
    ce_result *res = ce_acc_result(acc, rows);
    MT_CHECK_CUDA(cudaMemsetAsync(res, 0, offsetof(ce_result, bad_row), s));  // loss 0.0, count 0
    MT_CHECK_CUDA(cudaMemsetAsync(&res->bad_row, 0x7f, sizeof res->bad_row, s));
}

extern "C" void cross_entropy_acc_add(mt_backend *be, void *acc, int rows, const float *logits,
                                      const int32_t *targets, int64_t row0, int n, int V, int ignore_index) {
    if (n <= 0) return;
    if (n > rows) mt_fatal(MT_EXIT_ERROR, "cross_entropy_acc_add: %d rows in an accumulator of %d", n, rows);
    cudaStream_t s = mt_cuda_begin(be);
    double *row_loss = (double *)acc;
    ce_result *res = ce_acc_result(acc, rows);
    cross_entropy_kernel<<<mt_cuda_blocks(n, 1, 0x7fffffffu), 512, 0, s>>>((float *)nullptr, 0.0f, logits, targets,
                                                                            n, V, ignore_index, row_loss, res, row0);
    MT_CHECK_LAUNCH();
    // in stream order: this chunk's row losses are summed before the next chunk overwrites them
    cross_entropy_sum_kernel<<<1, 1024, 0, s>>>(row_loss, targets, n, V, ignore_index, res, 1);
    MT_CHECK_LAUNCH();
}

extern "C" double cross_entropy_acc_finish(mt_backend *be, void *acc, int rows, const int32_t *targets, int V,
                                           int ignore_index, int64_t *count) {
    ce_result h = ce_result_to_host(be, ce_acc_result(acc, rows), targets, V, ignore_index);
    *count = h.count;
    return h.loss;
}

// ---------------------------------------------------------------------------------------------
// Elementwise: y = a + b (the residual add), and the f32 → bf16 cast

// y [n] bf16 = a + b, added in fp32 and rounded once; a thread per chunk of 8.
template <bool VEC> static __global__ void add_kernel(bf16 *y, const bf16 *a, const bf16 *b, int64_t n) {
    const int64_t chunks = (n + 7) / 8;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < chunks; c += (int64_t)gridDim.x * blockDim.x) {
        const int m = (int)MT_MIN((int64_t)8, n - 8 * c);
        float fa[8], fb[8];
        load8<VEC>(fa, a + 8 * c, m);
        load8<VEC>(fb, b + 8 * c, m);
#pragma unroll
        for (int i = 0; i < 8; i++) fa[i] += fb[i];
        store8<VEC>(y + 8 * c, fa, m);
    }
}

// dst [n] bf16 = src [n] f32 rounded to nearest even (NaN stays NaN); a thread per chunk of 8.
template <bool VEC> static __global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, int64_t n) {
    const int64_t chunks = (n + 7) / 8;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < chunks; c += (int64_t)gridDim.x * blockDim.x) {
        const int m = (int)MT_MIN((int64_t)8, n - 8 * c);
        float f[8];
        load8<VEC>(f, src + 8 * c, m);
        store8<VEC>(dst + 8 * c, f, m);
    }
}

extern "C" void mt_add_cuda(mt_backend *be, mt_bf16 *y, const mt_bf16 *a, const mt_bf16 *b, int64_t n) {
    if (n <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const unsigned blocks = mt_cuda_blocks((n + 7) / 8, 256, 8192);
#define LAUNCH(V) add_kernel<V><<<blocks, 256, 0, s>>>((bf16 *)y, (const bf16 *)a, (const bf16 *)b, n)
    VEC_DISPATCH(vec_ok(8, y, a, b), LAUNCH);
#undef LAUNCH
    MT_CHECK_LAUNCH();
}

extern "C" void mt_f32_to_bf16_cuda(mt_backend *be, mt_bf16 *dst, const float *src, int64_t n) {
    if (n <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const unsigned blocks = mt_cuda_blocks((n + 7) / 8, 256, 8192);
#define LAUNCH(V) f32_to_bf16_kernel<V><<<blocks, 256, 0, s>>>((bf16 *)dst, src, n)
    VEC_DISPATCH(vec_ok(8, dst, src), LAUNCH);
#undef LAUNCH
    MT_CHECK_LAUNCH();
}
