// model/grouped_cuda.cu — model/grouped.h's grouped GEMMs as one kernel launch each: every expert
// of a layer in the same grid, its W dequantized tile by tile inside the kernel (no dequantized W
// in device memory), tensor cores through nvcuda::wmma (16×16×16 bf16 fragments, fp32
// accumulators, as model/ops_cuda.cu's attention). Launchers: model/grouped_cuda.h; the checks
// of the arguments: model/grouped.c.
//
// DESIGN (not measured: no GPU timing has been taken of these kernels).
//   * Block tile 64 × 64 of the output, 4 warps, each 32 × 32 = 2 × 2 fragments kept in
//     registers across the K loop; K steps of 32.
//   * mt_grouped_gemm: grid (row tiles of all experts, column tiles of N). The host knows the
//     offsets, so it passes each expert's first row tile (a prefix sum over ceil(n_e / 64)) with
//     the offsets and every expert's W pointers in the launch's parameters (~24 KiB: sm_80+ with
//     CUDA >= 12.1 take up to 32 KiB); a block finds its expert by a binary search over them. An
//     expert without rows (or without a W) has no tile, hence no block.
//     The parameters are __grid_constant__: read in place from the constant bank (without it,
//     indexing them by expert made nvcc copy all 24 KiB into every thread's local memory).
//   * Per K step the block stages A's 64 × 32 tile and op(W)'s 32 × 64 tile in shared memory as
//     bf16, zero-padded past n_e, K and N. A 4-bit W is dequantized there (quant/dequant_cuda.cuh,
//     the same device definition as quant/quant.cu's), once per block and K step: a weight byte
//     is read once per row tile of its expert, never written back dequantized. trans (W [N, K])
//     keeps W's rows as the tile's rows (a col_major matrix_b), so the threads of a warp read
//     consecutive codes in both layouts.
//   * The epilogue goes through shared memory (the fragment layout is opaque): dropout on C,
//     alpha, + beta·C, one rounding to C's dtype. Dropout on A (drop_a) is applied while staging
//     A, rounded to bf16 as mt_lora_dropout_cuda rounds it.
//   * mt_grouped_gemm_tn: grid (tiles of the [M, N] gradient, experts); each block loops over its
//     expert's rows 32 at a time (X's rows staged as a col_major matrix_a, drop(Y)'s as matrix_b).
//   * Not done yet: 16-byte vector loads, double-buffered (cp.async) staging, a per-run scale in
//     the dequantization instead of one per element, and larger tiles for large n_e.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>
#include <string.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "lora/lora_dropout.h"
#include "model/grouped_cuda.h"
#include "quant/dequant_cuda.cuh"

namespace wmma = nvcuda::wmma;
typedef __nv_bfloat16 bf16;

enum {
    BM = 64, BN = 64, BK = 32, WARPS = 4, THREADS = 32 * WARPS,
    LDK = BK + 8,   // pitch of a tile stored k-fastest ([64][32]): 80 bytes, off the bank period
    LDN = BN + 8,   // pitch of a tile stored n- or m-fastest ([32][64])
    LDC = BN + 4,   // pitch of the fp32 output tile
};

static __device__ __forceinline__ float bf(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 rn(float x) { return __float2bfloat16_rn(x); }
static __device__ __forceinline__ float load_out(const float *p) { return *p; }
static __device__ __forceinline__ float load_out(const bf16 *p) { return bf(*p); }
static __device__ __forceinline__ void store_out(float *p, float v) { *p = v; }
static __device__ __forceinline__ void store_out(bf16 *p, float v) { *p = rn(v); }

// Expert e's W: 4-bit (q.packed set) or dense bf16 (w, row stride ldw).
struct gg_weight {
    mt_deq_args q;
    const bf16 *w;
    int64_t ldw;
};

struct gg_params {                        // mt_grouped_gemm, by value in the launch
    const bf16 *a;
    void *c;
    int64_t lda, ldc;
    int experts, K, N, drop;              // drop: 0 none, 1 on A, 2 on C
    float alpha, beta, p;
    int64_t off[MT_GROUPED_MAX + 1];
    int tile0[MT_GROUPED_MAX + 1];        // expert e's first row tile; tile0[E]: all of them
    gg_weight w[MT_GROUPED_MAX];
    uint64_t seed[MT_GROUPED_MAX];
};

struct gt_params {                        // mt_grouped_gemm_tn
    const bf16 *x, *y;
    int64_t ldx, ldy;
    int experts, M, N, drop;
    float alpha, beta, p;
    int64_t off[MT_GROUPED_MAX + 1];
    void *g[MT_GROUPED_MAX];
    uint64_t seed[MT_GROUPED_MAX];
};

// Two adjacent bf16 of a shared tile as one 4-byte store: threads never share a 32-bit word
// (nor a bank word) of what they stage.
static __device__ __forceinline__ void store2(bf16 *p, bf16 lo, bf16 hi) {
    __nv_bfloat162 v;
    v.x = lo;
    v.y = hi;
    *(__nv_bfloat162 *)p = v;
}

// op(W_e) element (k, n) as the tile stages it (0 past K or N): W[n][k] (TRANS) or W[k][n].
template <bool TRANS>
static __device__ __forceinline__ bf16 w_at(const gg_weight &W, const float *lut, int K, int N, int k, int n) {
    if (k >= K || n >= N) return rn(0.0f);
    const int64_t wr = TRANS ? n : k, wc = TRANS ? k : n;  // W's row and column
    if (!W.q.packed) return W.w[wr * W.ldw + wc];
    const int64_t i = wr * (TRANS ? K : N) + wc;
    float m = 0.0f, sc = mt_deq_block_scale(W.q, i / W.q.bs, &m);
    return rn(mt_deq_value(W.q, lut, mt_deq_code(W.q.packed, i), sc, m));
}

static_assert(sizeof(gg_params) <= 32764 && sizeof(gt_params) <= 32764, "kernel parameters are at most 32764 bytes");

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

// The warp's 32 × 32 part of the block tile += A_s · B_s over one K step of 32. A_s element
// (m, k) at a[m·sam + k·sak], B_s element (k, n) at b[k·sbk + n·sbn]; LA / LB the matching
// fragment layouts (row_major: the second index is the fast one).
template <typename LA, typename LB>
static __device__ __forceinline__ void warp_mma(frag_c (&acc)[2][2], const bf16 *a, int sam, int sak, int lda,
                                                const bf16 *b, int sbk, int sbn, int ldb) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LA> fa[2];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> fb[2];
    for (int kk = 0; kk < BK; kk += 16) {
        for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], a + 16 * i * sam + kk * sak, (unsigned)lda);
        for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], b + kk * sbk + 16 * j * sbn, (unsigned)ldb);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
}

// The warp's accumulators into the block's fp32 output tile (a warp whose rows are all past the
// tile's holds nothing to keep), then the whole block waits for the tile.
static __device__ __forceinline__ void store_acc(float *cs, frag_c (&acc)[2][2], int wm, int wn, int rows) {
    if (32 * wm < rows)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                wmma::store_matrix_sync(cs + (32 * wm + 16 * i) * LDC + 32 * wn + 16 * j, acc[i][j], LDC,
                                        wmma::mem_row_major);
    __syncthreads();
}

// out[r·ldo + n] for r < rows, n < cols = alpha · drop(cs[r][n]) + beta · out; dropout (seed
// set) on the element (row0 + r, n0 + n) of a row-major matrix `width` wide.
template <typename OUT>
static __device__ void epilogue(OUT *out, int64_t ldo, const float *cs, int rows, int cols, float alpha, float beta,
                                const uint64_t *seed, float p, int64_t row0, int64_t width, int n0) {
    for (int idx = threadIdx.x; idx < BM * BN; idx += blockDim.x) {
        const int r = idx / BN, n = idx % BN;
        if (r >= rows || n >= cols) continue;
        float v = cs[r * LDC + n];
        if (seed) v *= mt_lora_dropout_factor(*seed, p, (uint64_t)((row0 + r) * width + n0 + n));
        v *= alpha;
        OUT *o = out + r * ldo + n;
        if (beta != 0.0f) v += beta * load_out(o);
        store_out(o, v);
    }
}

// The last expert whose first tile is <= t (an expert without tiles never is the answer: the
// next one starts at the same tile).
static __device__ __forceinline__ int find_expert(const int *tile0, int experts, int t) {
    int lo = 0, hi = experts - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tile0[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// C [R, N] (rows of expert e) = alpha · drop(A · op(W_e)) + beta · C. Grid (row tiles, N tiles).
// TRANS: W [N, K], staged as ws[n][k]; else W [K, N], staged as ws[k][n].
template <typename OUT, bool TRANS>
static __global__ void __launch_bounds__(THREADS) grouped_gemm_kernel(const __grid_constant__ gg_params P) {
    __shared__ __align__(128) bf16 as[BM * LDK];
    __shared__ __align__(128) bf16 ws[TRANS ? BN * LDK : BK * LDN];
    __shared__ __align__(128) float cs[BM * LDC];
    __shared__ float lut[16];
    const int e = find_expert(P.tile0, P.experts, (int)blockIdx.x);
    const int64_t r0 = (int64_t)(blockIdx.x - P.tile0[e]) * BM;  // first row of the tile, within the expert
    const int rows = (int)MT_MIN((int64_t)BM, P.off[e + 1] - P.off[e] - r0), n0 = (int)blockIdx.y * BN;
    const int cols = MT_MIN(BN, P.N - n0), K = P.K, warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
    const gg_weight &W = P.w[e];
    const uint64_t *seed = P.drop ? &P.seed[e] : NULL;
    const bf16 *a = P.a + (P.off[e] + r0) * P.lda;
    if (W.q.packed && threadIdx.x < 16) lut[threadIdx.x] = mt_deq_lut(W.q.type, threadIdx.x);

    frag_c acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < K; k0 += BK) {
        __syncthreads();  // the previous step's tiles are consumed (and lut written, the first time)
        for (int idx = threadIdx.x; idx < BM * BK / 2; idx += blockDim.x) {  // pairs along k
            const int r = idx / (BK / 2), kk = 2 * (idx % (BK / 2));
            bf16 v[2];
            for (int h = 0; h < 2; h++) {
                const int k = k0 + kk + h;
                v[h] = rn(0.0f);
                if (r < rows && k < K) {
                    v[h] = a[r * P.lda + k];
                    if (P.drop == 1)
                        v[h] = rn(bf(v[h]) * mt_lora_dropout_factor(*seed, P.p, (uint64_t)((r0 + r) * K + k)));
                }
            }
            store2(as + r * LDK + kk, v[0], v[1]);
        }
        // Pairs along W's rows (its contiguous index): ws[n][k] (TRANS) or ws[k][n].
        for (int idx = threadIdx.x; idx < BK * BN / 2; idx += blockDim.x) {
            const int fast = TRANS ? BK : BN, f = 2 * (idx % (fast / 2)), sl = idx / (fast / 2);
            if (TRANS)
                store2(ws + sl * LDK + f, w_at<true>(W, lut, K, P.N, k0 + f, n0 + sl),
                       w_at<true>(W, lut, K, P.N, k0 + f + 1, n0 + sl));
            else
                store2(ws + sl * LDN + f, w_at<false>(W, lut, K, P.N, k0 + sl, n0 + f),
                       w_at<false>(W, lut, K, P.N, k0 + sl, n0 + f + 1));
        }
        __syncthreads();
        if (32 * wm >= rows) continue;  // this warp's rows are all past the expert's (uniform per warp)
        if (TRANS)
            warp_mma<wmma::row_major, wmma::col_major>(acc, as + 32 * wm * LDK, LDK, 1, LDK, ws + 32 * wn * LDK, 1, LDK,
                                                       LDK);
        else
            warp_mma<wmma::row_major, wmma::row_major>(acc, as + 32 * wm * LDK, LDK, 1, LDK, ws + 32 * wn, LDN, 1, LDN);
    }
    store_acc(cs, acc, wm, wn, rows);
    OUT *c = (OUT *)P.c + (P.off[e] + r0) * P.ldc + n0;
    epilogue<OUT>(c, P.ldc, cs, rows, cols, P.alpha, P.beta, P.drop == 2 ? seed : NULL, P.p, r0, P.N, n0);
}

// G_e [M, N] = alpha · X_eᵀ · drop(Y_e) + beta · G_e. Grid (tiles of G, experts).
static_assert(BM == BN, "the tn kernel stages X's and Y's rows of a K step in one loop");
template <typename OUT>
static __global__ void __launch_bounds__(THREADS) grouped_gemm_tn_kernel(const __grid_constant__ gt_params P) {
    __shared__ __align__(128) bf16 xs[BK * LDN];  // xs[k][m]: X_eᵀ as a col_major matrix_a
    __shared__ __align__(128) bf16 ys[BK * LDN];  // ys[k][n]
    __shared__ __align__(128) float cs[BM * LDC];
    const int e = (int)blockIdx.y;
    const int64_t n_e = P.off[e + 1] - P.off[e];
    if (!P.g[e] || (n_e == 0 && P.beta != 0.0f)) return;  // not wanted, or beta·G_e = G_e
    const int tiles_n = (P.N + BN - 1) / BN, m0 = (int)blockIdx.x / tiles_n * BM, n0 = (int)blockIdx.x % tiles_n * BN;
    const int rows = MT_MIN(BM, P.M - m0), cols = MT_MIN(BN, P.N - n0), warp = threadIdx.x >> 5;
    const int wm = warp >> 1, wn = warp & 1;
    const bf16 *x = P.x + P.off[e] * P.ldx, *y = P.y + P.off[e] * P.ldy;

    frag_c acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int64_t k0 = 0; k0 < n_e; k0 += BK) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < BK * BM / 2; idx += blockDim.x) {  // pairs along m and n
            const int kk = idx / (BM / 2), f = 2 * (idx % (BM / 2));
            const int64_t k = k0 + kk;
            bf16 xv[2], yv[2];
            for (int h = 0; h < 2; h++) {
                xv[h] = k < n_e && f + h < rows ? x[k * P.ldx + m0 + f + h] : rn(0.0f);
                yv[h] = rn(0.0f);
                if (k < n_e && f + h < cols) {
                    yv[h] = y[k * P.ldy + n0 + f + h];
                    if (P.drop)
                        yv[h] = rn(bf(yv[h]) *
                                   mt_lora_dropout_factor(P.seed[e], P.p, (uint64_t)(k * P.N + n0 + f + h)));
                }
            }
            store2(xs + kk * LDN + f, xv[0], xv[1]);
            store2(ys + kk * LDN + f, yv[0], yv[1]);
        }
        __syncthreads();
        if (32 * wm >= rows) continue;
        warp_mma<wmma::col_major, wmma::row_major>(acc, xs + 32 * wm, 1, LDN, LDN, ys + 32 * wn, LDN, 1, LDN);
    }
    store_acc(cs, acc, wm, wn, rows);
    OUT *g = (OUT *)P.g[e] + (int64_t)m0 * P.N + n0;
    epilogue<OUT>(g, P.N, cs, rows, cols, P.alpha, P.beta, NULL, 0.0f, 0, 0, 0);
}

// ---------------------------------------------------------------------------------------------
// Launchers (arguments checked by model/grouped.c)

extern "C" void mt_grouped_gemm_cuda(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_grouped *g) {
    gg_params P;  // ~24 KiB, copied by the launch
    memset(&P, 0, sizeof P);
    const int E = g->experts;
    P.a = (const bf16 *)a->data;
    P.c = c->data;
    P.lda = mt_tensor_ld(a);
    P.ldc = mt_tensor_ld(c);
    P.experts = E;
    P.K = (int)a->shape[1];
    P.N = (int)c->shape[1];
    P.drop = g->seed ? (g->drop_a ? 1 : 2) : 0;
    P.alpha = g->alpha;
    P.beta = g->beta;
    P.p = g->p;
    int64_t tiles = 0;
    for (int e = 0; e < E; e++) {
        const mt_qweight *q = g->q ? g->q[e] : NULL;
        const mt_tensor *w = g->w ? g->w[e] : NULL;
        P.off[e] = g->off[e];
        P.tile0[e] = (int)tiles;
        if (q) P.w[e].q = mt_deq_args_of(q);
        if (w) {
            P.w[e].w = (const bf16 *)w->data;
            P.w[e].ldw = mt_tensor_ld(w);
        }
        if (g->seed) P.seed[e] = g->seed[e];
        if (q || w) tiles += (g->off[e + 1] - g->off[e] + BM - 1) / BM;  // neither: skipped, no tile
    }
    P.off[E] = g->off[E];
    P.tile0[E] = (int)tiles;
    if (tiles > 0x7fffffff) mt_fatal(MT_EXIT_ERROR, "mt_grouped_gemm: %lld row tiles", (long long)tiles);
    if (tiles == 0 || P.N == 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    dim3 grid((unsigned)tiles, (unsigned)((P.N + BN - 1) / BN));
    const bool f32 = c->dtype == MT_F32;
    if (g->trans) {
        if (f32) grouped_gemm_kernel<float, true><<<grid, THREADS, 0, s>>>(P);
        else grouped_gemm_kernel<bf16, true><<<grid, THREADS, 0, s>>>(P);
    } else {
        if (f32) grouped_gemm_kernel<float, false><<<grid, THREADS, 0, s>>>(P);
        else grouped_gemm_kernel<bf16, false><<<grid, THREADS, 0, s>>>(P);
    }
    MT_CHECK_LAUNCH();
}

extern "C" void mt_grouped_gemm_tn_cuda(mt_backend *be, mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y,
                                        const mt_grouped *gr) {
    gt_params P;
    memset(&P, 0, sizeof P);
    const int E = gr->experts;
    P.x = (const bf16 *)x->data;
    P.y = (const bf16 *)y->data;
    P.ldx = mt_tensor_ld(x);
    P.ldy = mt_tensor_ld(y);
    P.experts = E;
    P.M = (int)x->shape[1];
    P.N = (int)y->shape[1];
    P.drop = gr->seed != NULL;
    P.alpha = gr->alpha;
    P.beta = gr->beta;
    P.p = gr->p;
    mt_dtype dt = MT_F32;
    bool any = false;
    for (int e = 0; e < E; e++) {
        P.off[e] = gr->off[e];
        P.g[e] = g[e] ? g[e]->data : NULL;
        if (gr->seed) P.seed[e] = gr->seed[e];
        if (g[e]) {  // one dtype for all (model/grouped.c checked)
            dt = g[e]->dtype;
            any = true;
        }
    }
    P.off[E] = gr->off[E];
    if (!any || P.M == 0 || P.N == 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    dim3 grid((unsigned)(((P.M + BM - 1) / BM) * ((P.N + BN - 1) / BN)), (unsigned)E);
    if (dt == MT_F32) grouped_gemm_tn_kernel<float><<<grid, THREADS, 0, s>>>(P);
    else grouped_gemm_tn_kernel<bf16><<<grid, THREADS, 0, s>>>(P);
    MT_CHECK_LAUNCH();
}
