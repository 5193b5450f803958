// moe/moe_cuda.cu — CUDA twins of moe/moe.h: router, aux loss, z-loss (fp32 logits, double
// statistics), the expert permutation (a stable counting sort on the device), gather/combine and
// the fused SwiGLU (bf16 storage, fp32 arithmetic, one rounding per stored element). Contract in
// model/ops_cuda.h and moe/moe_cuda.h. Nothing here synchronises the host except
// moe_aux_stats_download_cuda, which returns the step's statistics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "moe/moe_cuda.h"
#include "moe/router_grouped_row.h"

enum {
    THREADS = 256,
    MOE_MAX_E = 1024,     // experts (moe_aux_stats holds 1024 too)
    MOE_MAX_K = 16,       // choices per token in the scatters' sort
    PERMUTE_CHUNK = 256,  // assignments per warp in the counting sort
    AUX_ROWS = 32,        // rows per partial sum of the aux statistics
    LOAD_ROWS = 32,       // rows per partial count of the router's load (short: many blocks)
    ZLOSS_ROWS = 256,     // rows (threads) per block of the z-loss partial sums
};

typedef __nv_bfloat16 bf16;

// ---------------------------------------------------------------------------------------------
// bf16 storage: V consecutive elements to and from fp32 registers. V = 8 is one 16-byte access
// (the address must be 16-byte aligned: the launchers check), V = 1 the scalar fallback.

template <int V> static __device__ __forceinline__ void bf16_load(float (&v)[V], const bf16 *p) {
    if constexpr (V == 8) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(p);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __bfloat1622float2(h[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = __bfloat162float(p[i]);
    }
}

// Rounds each value once (to nearest even).
template <int V> static __device__ __forceinline__ void bf16_store(bf16 *p, const float (&v)[V]) {
    if constexpr (V == 8) {
        uint4 raw;
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&raw);
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        *reinterpret_cast<uint4 *>(p) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) p[i] = __float2bfloat16_rn(v[i]);
    }
}

template <int V> static __device__ __forceinline__ void bf16_copy(bf16 *dst, const bf16 *src) {
    if constexpr (V == 8) *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
    else
        for (int i = 0; i < V; i++) dst[i] = src[i];
}

// 16-byte accesses: rows of `width` bf16 (a multiple of 8) from 16-byte aligned bases (NULL passes).
static bool vec8_ok(int64_t width, const void *p0, const void *p1 = NULL, const void *p2 = NULL,
                    const void *p3 = NULL) {
    return width % 8 == 0 && ((uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2 | (uintptr_t)p3) % 16 == 0;
}

// ---------------------------------------------------------------------------------------------
// Router: one thread per row, the CPU's algorithm step for step (E and k are small; ties and the
// NaN fallback then need no cross-thread agreement).

static __device__ __forceinline__ int router_better(const float *p, int a, int b) {
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

// logits [T, E] → probs [T, E], ids [T, k], weights [T, k]
static __global__ void router_forward_kernel(int32_t *ids, float *weights, float *probs, const float *logits, int T,
                                             int E, int k, int norm_topk) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *l = logits + t * E;
    float *p = probs + t * E, *w = weights + t * k;
    int32_t *id = ids + t * k;
    float maxv = -INFINITY;
    for (int e = 0; e < E; e++) maxv = fmaxf(maxv, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; e++) {
        p[e] = expf(l[e] - maxv);
        sum += p[e];
    }
    for (int e = 0; e < E; e++) p[e] /= sum;
    for (int j = 0; j < k; j++) {  // choice j = the best expert ranked strictly below choice j-1
        int best = -1;
        for (int e = 0; e < E; e++)
            if ((j == 0 || router_better(p, id[j - 1], e)) && (best < 0 || router_better(p, e, best))) best = e;
        if (best < 0) {  // NaN probabilities order nothing: the lowest expert unused
            for (int e = 0; e < E && best < 0; e++) {
                int used = 0;
                for (int i = 0; i < j; i++) used |= id[i] == e;
                if (!used) best = e;
            }
        }
        id[j] = best;
        w[j] = p[best];
    }
    if (norm_topk) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += w[j];
        for (int j = 0; j < k; j++) w[j] /= s;
    }
}

// dweights [T, k] → dlogits [T, E] += (model/moe/router.c for the formulas)
static __global__ void router_backward_kernel(float *dlogits, const float *dweights, const float *probs,
                                              const int32_t *ids, const float *weights, int T, int E, int k,
                                              int norm_topk) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *p = probs + t * E, *w = weights + t * k, *dw = dweights + t * k;
    const int32_t *id = ids + t * k;
    float *dl = dlogits + t * E;
    float S = 1.0f, wdw = 0.0f;
    if (norm_topk) {
        S = 0.0f;
        for (int j = 0; j < k; j++) {
            S += p[id[j]];
            wdw += dw[j] * w[j];
        }
    }
    float pdp = 0.0f;
    for (int j = 0; j < k; j++) pdp += (dw[j] - wdw) / S * p[id[j]];
    for (int e = 0; e < E; e++) dl[e] -= p[e] * pdp;
    for (int j = 0; j < k; j++) dl[id[j]] += p[id[j]] * (dw[j] - wdw) / S;
}

static void moe_check(const char *what, int E, int k) {
    if (E < 1 || E > MOE_MAX_E || k < 1 || k > E)
        mt_fatal(MT_EXIT_ERROR, "%s: E=%d k=%d out of range (1 <= k <= E <= %d)", what, E, k, (int)MOE_MAX_E);
}

extern "C" void router_forward_cuda(mt_backend *be, int32_t *ids, float *weights, float *probs, const float *logits,
                                    int T, int E, int k, int norm_topk) {
    moe_check("router_forward_cuda", E, k);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    router_forward_kernel<<<mt_cuda_blocks(T, 128, 0x7fffffffu), 128, 0, s>>>(ids, weights, probs, logits, T, E, k,
                                                                               norm_topk);
    MT_CHECK_LAUNCH();
}

extern "C" void router_backward_cuda(mt_backend *be, float *dlogits, const float *dweights, const float *probs,
                                     const int32_t *ids, const float *weights, int T, int E, int k, int norm_topk) {
    moe_check("router_backward_cuda", E, k);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    router_backward_kernel<<<mt_cuda_blocks(T, 128, 0x7fffffffu), 128, 0, s>>>(dlogits, dweights, probs, ids,
                                                                                weights, T, E, k, norm_topk);
    MT_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// The DeepSeek-style router: one thread per row running moe/router_grouped_row.h, the CPU twin's
// own code (E, k and the groups are small; ties and NaN need no cross-thread agreement).

static __global__ void router_grouped_forward_kernel(int32_t *ids, float *weights, float *scores,
                                                     const float *logits, const float *bias, int T, int E, int k,
                                                     moe_route_rule r) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t < T) rg_forward(ids + t * k, weights + t * k, scores + t * E, logits + t * E, bias, E, k, r);
}

static __global__ void router_grouped_backward_kernel(float *dlogits, const float *dweights, const float *scores,
                                                      const int32_t *ids, const float *weights, int T, int E, int k,
                                                      moe_route_rule r) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t < T) rg_backward(dlogits + t * E, dweights + t * k, scores + t * E, ids + t * k, weights + t * k, E, k, r);
}

static __global__ void router_grouped_weights_kernel(float *weights, const float *scores, const int32_t *ids, int T,
                                                     int E, int k, moe_route_rule r) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t < T) rg_weights(weights + t * k, scores + t * E, ids + t * k, k, r);
}

extern "C" void router_grouped_forward_cuda(mt_backend *be, int32_t *ids, float *weights, float *scores,
                                            const float *logits, const float *bias, int T, int E, int k,
                                            moe_route_rule rule) {
    moe_route_rule_check("router_grouped_forward_cuda", rule, E, k);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    router_grouped_forward_kernel<<<mt_cuda_blocks(T, 128, 0x7fffffffu), 128, 0, s>>>(ids, weights, scores, logits,
                                                                                       bias, T, E, k, rule);
    MT_CHECK_LAUNCH();
}

extern "C" void router_grouped_backward_cuda(mt_backend *be, float *dlogits, const float *dweights,
                                             const float *scores, const int32_t *ids, const float *weights, int T,
                                             int E, int k, moe_route_rule rule) {
    moe_check("router_grouped_backward_cuda", E, k);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    router_grouped_backward_kernel<<<mt_cuda_blocks(T, 128, 0x7fffffffu), 128, 0, s>>>(dlogits, dweights, scores,
                                                                                        ids, weights, T, E, k, rule);
    MT_CHECK_LAUNCH();
}

extern "C" void router_grouped_weights_of_choices_cuda(mt_backend *be, float *weights, const float *scores,
                                                       const int32_t *ids, int T, int E, int k, moe_route_rule rule) {
    moe_check("router_grouped_weights_of_choices_cuda", E, k);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    router_grouped_weights_kernel<<<mt_cuda_blocks(T, THREADS, 0x7fffffffu), THREADS, 0, s>>>(weights, scores, ids,
                                                                                               T, E, k, rule);
    MT_CHECK_LAUNCH();
}

// out[idx] += Σ_c part[c, idx] over part [nchunks, L]: a block per column, mt_block_sum's fixed
// tree over the chunks (the aux statistics' doubles; the load's integers, exact in any order).
template <typename T>
static __global__ void chunk_sum_kernel(double *out, const T *part, int nchunks, int L) {
    __shared__ double red[32];
    const int idx = blockIdx.x;
    double s = 0.0;
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) s += part[(int64_t)c * L + idx];
    s = mt_block_sum(s, red);
    if (threadIdx.x == 0) out[idx] += s;
}

// The load for the bias update. part [nchunks, E]: a chunk's LOAD_ROWS rows counted per expert,
// thread per expert (no atomics: the aux statistics' scheme); then counts [E] += the chunks' sum
// (chunk_sum_kernel).
static __global__ void load_partial_kernel(int32_t *part, const int32_t *ids, const uint8_t *mask, int T, int E,
                                           int k) {
    const int64_t t0 = (int64_t)blockIdx.x * LOAD_ROWS, t1 = MT_MIN((int64_t)T, t0 + LOAD_ROWS);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t n = 0;
        for (int64_t t = t0; t < t1; t++) {
            if (mask && !mask[t]) continue;
            for (int j = 0; j < k; j++) n += ids[t * k + j] == e;
        }
        part[(int64_t)blockIdx.x * E + e] = n;
    }
}

// One block: the total load, then each bias moved by ±rate or left (router_bias_update_cpu).
static __global__ void bias_update_kernel(float *bias, const double *counts, int E, float rate) {
    __shared__ double red[32];
    double s = 0.0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) s += counts[e];
    const double total = mt_block_sum(s, red);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const double c = E * counts[e];
        bias[e] += rate * (float)((c < total) - (c > total));
    }
}

extern "C" void router_load_accumulate_cuda(mt_backend *be, double *counts, const int32_t *ids,
                                            const uint8_t *row_mask, int T, int E, int k) {
    moe_check("router_load_accumulate_cuda", E, k);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const int nchunks = (int)(((int64_t)T + LOAD_ROWS - 1) / LOAD_ROWS);
    const size_t bytes = (size_t)nchunks * E * sizeof(int32_t);
    int32_t *part = (int32_t *)mt_work_alloc(be, bytes);
    load_partial_kernel<<<nchunks, MT_MIN(THREADS, (E + 31) / 32 * 32), 0, s>>>(part, ids, row_mask, T, E, k);
    MT_CHECK_LAUNCH();
    chunk_sum_kernel<int32_t><<<E, 128, 0, s>>>(counts, part, nchunks, E);
    MT_CHECK_LAUNCH();
    mt_work_free(be, part, bytes);
}

extern "C" void router_bias_update_cuda(mt_backend *be, float *bias, const double *counts, int E, float rate) {
    moe_check("router_bias_update_cuda", E, 1);
    cudaStream_t s = mt_cuda_begin(be);
    bias_update_kernel<<<1, THREADS, 0, s>>>(bias, counts, E, rate);
    MT_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// The sequence-wise balance loss (router_seq_aux_*_cpu's sums in their orders): a block per
// sequence counts its choices (thread per expert, no atomics) and rows; the forward adds each
// sequence's Σ_e f_e·P_e into part [B], which one block sums into acc; the backward runs a
// thread per row.

// cnt [B, E], rows [B]
static __global__ void seq_counts_kernel(int32_t *cnt, int32_t *rows, const int32_t *ids, const uint8_t *mask, int S,
                                         int E, int k) {
    const int64_t t0 = (int64_t)blockIdx.x * S;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t c = 0, n = 0;
        for (int64_t t = t0; t < t0 + S; t++) {
            if (mask && !mask[t]) continue;
            n++;
            for (int j = 0; j < k; j++) c += ids[t * k + j] == e;
        }
        cnt[(int64_t)blockIdx.x * E + e] = c;
        if (e == 0) rows[blockIdx.x] = n;
    }
}

// z [T] = Σ_e scores[t, e], in e order
static __global__ void row_sum_kernel(float *z, const float *scores, int64_t T, int E) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T) return;
    float s = 0.0f;
    for (int e = 0; e < E; e++) s += scores[t * E + e];
    z[t] = s;
}

// part [B] = Σ_e f_e·P_e of sequence b (0 without rows); thread per expert, P over rows in order.
static __global__ void seq_aux_partial_kernel(double *part, const int32_t *cnt, const int32_t *rows,
                                              const float *scores, const float *z, const uint8_t *mask, int S, int E,
                                              int k) {
    __shared__ double red[32];
    const int b = blockIdx.x, n = rows[b];
    const int64_t t0 = (int64_t)b * S;
    double L = 0.0;
    for (int e = threadIdx.x; e < E && n > 0; e += blockDim.x) {
        double P = 0.0;
        for (int64_t t = t0; t < t0 + S; t++)
            if ((!mask || mask[t]) && z[t] > 0.0f) P += scores[t * E + e] / z[t];
        L += (double)E * cnt[(int64_t)b * E + e] / ((double)k * n) * (P / n);
    }
    L = mt_block_sum(L, red);
    if (threadIdx.x == 0) part[b] = L;
}

// acc[0] += Σ_b part[b], acc[1] += the sequences with a row; one block, a fixed tree.
static __global__ void seq_aux_sum_kernel(double *acc, const double *part, const int32_t *rows, int B) {
    __shared__ double red[32];
    double L = 0.0, c = 0.0;
    for (int b = threadIdx.x; b < B; b += blockDim.x) L += part[b], c += rows[b] > 0;
    L = mt_block_sum(L, red);
    c = mt_block_sum(c, red);
    if (threadIdx.x == 0) acc[0] += L, acc[1] += c;
}

// dlogits [T, E] += the row's share (router_seq_aux_backward_cpu's formulas); thread per row.
static __global__ void seq_aux_backward_kernel(float *dlogits, float dscale, const int32_t *cnt, const int32_t *rows,
                                               const float *scores, const uint8_t *mask, int64_t T, int S, int E,
                                               int k, int sigmoid) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T || (mask && !mask[t])) return;
    const int64_t b = t / S;
    const int n = rows[b];
    const int32_t *c = cnt + b * E;
    const float *s = scores + t * E;
    float *dl = dlogits + t * E;
    float z = 0.0f, gs = 0.0f, sds = 0.0f;
    for (int e = 0; e < E; e++) z += s[e];
    if (n == 0 || !(z > 0.0f)) return;
    const double gk = (double)k * n * n;
    for (int e = 0; e < E; e++) gs += (float)(dscale * (double)E * c[e] / gk) * s[e];
    gs /= z;
    if (sigmoid) {
        for (int e = 0; e < E; e++) {
            const float g = (float)(dscale * (double)E * c[e] / gk);
            dl[e] += (g - gs) / z * (s[e] * (1.0f - s[e]));
        }
        return;
    }
    for (int e = 0; e < E; e++) sds += ((float)(dscale * (double)E * c[e] / gk) - gs) / z * s[e];
    for (int e = 0; e < E; e++) dl[e] += s[e] * (((float)(dscale * (double)E * c[e] / gk) - gs) / z - sds);
}

// Scratch for the counts: cnt [B, E] and rows [B], one allocation.
static int32_t *seq_counts(mt_backend *be, cudaStream_t s, const int32_t *ids, const uint8_t *mask, int B, int S,
                           int E, int k, size_t *bytes) {
    *bytes = (size_t)B * (E + 1) * sizeof(int32_t);
    int32_t *cnt = (int32_t *)mt_work_alloc(be, *bytes);
    seq_counts_kernel<<<B, THREADS, 0, s>>>(cnt, cnt + (size_t)B * E, ids, mask, S, E, k);
    MT_CHECK_LAUNCH();
    return cnt;
}

extern "C" void router_seq_aux_accumulate_cuda(mt_backend *be, double *acc, const float *scores, const int32_t *ids,
                                               const uint8_t *row_mask, int B, int S, int E, int k) {
    moe_check("router_seq_aux_accumulate_cuda", E, k);
    if (B <= 0 || S <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const int64_t T = (int64_t)B * S;
    size_t cbytes, zbytes = (size_t)T * sizeof(float), pbytes = (size_t)B * sizeof(double);
    int32_t *cnt = seq_counts(be, s, ids, row_mask, B, S, E, k, &cbytes);
    float *z = (float *)mt_work_alloc(be, zbytes);
    double *part = (double *)mt_work_alloc(be, pbytes);
    row_sum_kernel<<<mt_cuda_blocks(T, THREADS, 0x7fffffffu), THREADS, 0, s>>>(z, scores, T, E);
    MT_CHECK_LAUNCH();
    seq_aux_partial_kernel<<<B, THREADS, 0, s>>>(part, cnt, cnt + (size_t)B * E, scores, z, row_mask, S, E, k);
    MT_CHECK_LAUNCH();
    seq_aux_sum_kernel<<<1, THREADS, 0, s>>>(acc, part, cnt + (size_t)B * E, B);
    MT_CHECK_LAUNCH();
    mt_work_free(be, part, pbytes);
    mt_work_free(be, z, zbytes);
    mt_work_free(be, cnt, cbytes);
}

extern "C" void router_seq_aux_backward_cuda(mt_backend *be, float *dlogits, float dscale, const float *scores,
                                             const int32_t *ids, const uint8_t *row_mask, int B, int S, int E, int k,
                                             int sigmoid) {
    moe_check("router_seq_aux_backward_cuda", E, k);
    if (B <= 0 || S <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const int64_t T = (int64_t)B * S;
    size_t cbytes;
    int32_t *cnt = seq_counts(be, s, ids, row_mask, B, S, E, k, &cbytes);
    seq_aux_backward_kernel<<<mt_cuda_blocks(T, 128, 0x7fffffffu), 128, 0, s>>>(
        dlogits, dscale, cnt, cnt + (size_t)B * E, scores, row_mask, T, S, E, k, sigmoid);
    MT_CHECK_LAUNCH();
    mt_work_free(be, cnt, cbytes);
}

// ---------------------------------------------------------------------------------------------
// Aux loss statistics on the device: the first 2E+1 of stats [MT_AUX_STATS_LEN(E)] = counts [E],
// prob_sums [E], rows (the z-loss pair after them is moe_zloss_accumulate_cuda's).

// part [nchunks, 2E+1]: the chunk's AUX_ROWS rows summed in order, thread per statistic. Short
// chunks, many blocks: on the H200 (2026-11-27) 256-row chunks (16 blocks at T = 4096) took
// ~115 us a layer, latency-bound; the chunk sums are combined by chunk_sum_kernel's tree.
static __global__ void aux_partial_kernel(double *part, const float *probs, const int32_t *ids, const uint8_t *mask,
                                          int T, int E, int k) {
    const int c = blockIdx.x, t0 = c * AUX_ROWS, t1 = MT_MIN(T, t0 + AUX_ROWS), L = 2 * E + 1;
    for (int idx = threadIdx.x; idx < L; idx += blockDim.x) {
        double s = 0.0;
        for (int64_t t = t0; t < t1; t++) {
            if (mask && !mask[t]) continue;
            if (idx < E) {  // counts
                for (int j = 0; j < k; j++) s += ids[t * k + j] == idx;
            } else if (idx < 2 * E) {  // prob sums
                s += probs[t * E + (idx - E)];
            } else {  // rows
                s += 1.0;
            }
        }
        part[(int64_t)c * L + idx] = s;
    }
}

// dlogits [T, E] += coef · p_e · (g_e − Σ g_i p_i), g_e = coef-free E·counts[e]/rows² (as the CPU)
static __global__ void aux_backward_kernel(float *dlogits, float coef, const double *stats, const float *probs,
                                           const uint8_t *mask, int T, int E) {
    __shared__ float g[MOE_MAX_E];
    const double n = stats[2 * E];
    if (n == 0.0) return;  // uniform over the grid: no row counted, no gradient
    for (int e = threadIdx.x; e < E; e += blockDim.x) g[e] = (float)(coef * E * stats[e] / (n * n));
    __syncthreads();
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T || (mask && !mask[t])) return;
    const float *p = probs + t * E;
    float *dl = dlogits + t * E;
    float gp = 0.0f;
    for (int e = 0; e < E; e++) gp += g[e] * p[e];
    for (int e = 0; e < E; e++) dl[e] += p[e] * (g[e] - gp);
}

extern "C" void moe_aux_accumulate_cuda(mt_backend *be, double *stats, const float *probs, const int32_t *ids,
                                        const uint8_t *row_mask, int T, int E, int k) {
    moe_check("moe_aux_accumulate_cuda", E, k);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const int nchunks = (T + AUX_ROWS - 1) / AUX_ROWS, L = 2 * E + 1;
    size_t bytes = (size_t)nchunks * L * sizeof(double);
    double *part = (double *)mt_work_alloc(be, bytes);
    aux_partial_kernel<<<nchunks, MT_MIN(256, (L + 31) / 32 * 32), 0, s>>>(part, probs, ids, row_mask, T, E, k);
    MT_CHECK_LAUNCH();
    chunk_sum_kernel<double><<<L, 128, 0, s>>>(stats, part, nchunks, L);
    MT_CHECK_LAUNCH();
    mt_work_free(be, part, bytes);
}

extern "C" void moe_aux_stats_download_cuda(mt_backend *be, moe_aux_stats *st, const double *stats, double *z_sum,
                                            int64_t *z_rows, double *seq, void *extra_dst, const void *extra_src,
                                            size_t extra_bytes) {
    const int E = st->E;
    moe_check("moe_aux_stats_download_cuda", E, 1);
    double h[MT_AUX_STATS_LEN(MOE_MAX_E)];
    cudaStream_t s = mt_cuda_begin(be);
    MT_CHECK_CUDA(cudaMemcpyAsync(h, stats, (size_t)MT_AUX_STATS_LEN(E) * sizeof(double), cudaMemcpyDeviceToHost, s));
    if (extra_bytes) MT_CHECK_CUDA(cudaMemcpyAsync(extra_dst, extra_src, extra_bytes, cudaMemcpyDeviceToHost, s));
    mt_cuda_backend_sync(be);  // the one synchronisation: the host wants the totals
    for (int e = 0; e < E; e++) {
        st->counts[e] = h[e];
        st->prob_sums[e] = h[E + e];
    }
    st->rows = (int64_t)h[2 * E];
    if (z_sum) *z_sum = h[2 * E + 1];
    if (z_rows) *z_rows = (int64_t)h[2 * E + 2];  // a count held exactly in a double (< 2^53)
    if (seq) seq[0] = h[MT_AUX_STATS_SEQ(E)], seq[1] = h[MT_AUX_STATS_SEQ(E) + 1];
}

extern "C" void moe_aux_backward_cuda(mt_backend *be, float *dlogits, float coef, const double *stats,
                                      const float *probs, const uint8_t *row_mask, int T, int E) {
    moe_check("moe_aux_backward_cuda", E, 1);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    aux_backward_kernel<<<mt_cuda_blocks(T, 128, 0x7fffffffu), 128, 0, s>>>(dlogits, coef, stats, probs, row_mask,
                                                                             T, E);
    MT_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Router z-loss

// logsumexp of a row in double, as moe/aux_loss.c's row_lse.
static __device__ double row_lse(const float *l, int E) {
    float maxv = -INFINITY;
    for (int e = 0; e < E; e++) maxv = fmaxf(maxv, l[e]);
    if (isinf(maxv)) return maxv;
    double sum = 0.0;
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - maxv);
    return maxv + log(sum);
}

// part [nblocks, 2] = (Σ lse², unmasked rows) over block b's ZLOSS_ROWS rows: thread per row,
// combined in mt_block_sum's fixed tree.
static __global__ void zloss_partial_kernel(double *part, const float *logits, const uint8_t *mask, int T, int E) {
    __shared__ double red[32];
    const int64_t t = (int64_t)blockIdx.x * ZLOSS_ROWS + threadIdx.x;
    double z = 0.0, c = 0.0;
    if (t < T && (!mask || mask[t])) {
        const double lse = row_lse(logits + t * E, E);
        z = lse * lse, c = 1.0;
    }
    z = mt_block_sum(z, red);
    c = mt_block_sum(c, red);
    if (threadIdx.x == 0) part[2 * blockIdx.x] = z, part[2 * blockIdx.x + 1] = c;
}

// stats[zi] += Σ_b part[b, 0], stats[zi + 1] += Σ_b part[b, 1]; one block, fixed order.
static __global__ void zloss_sum_kernel(double *stats, int zi, const double *part, int nblocks) {
    __shared__ double red[32];
    double z = 0.0, c = 0.0;
    for (int b = threadIdx.x; b < nblocks; b += blockDim.x) z += part[2 * b], c += part[2 * b + 1];
    z = mt_block_sum(z, red);
    c = mt_block_sum(c, red);
    if (threadIdx.x == 0) stats[zi] += z, stats[zi + 1] += c;
}

// dlogits [T, E] += dscale · 2 · lse · softmax(logits) on unmasked rows
static __global__ void zloss_backward_kernel(float *dlogits, float dscale, const float *logits, const uint8_t *mask,
                                             int T, int E) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T || (mask && !mask[t])) return;
    const float *l = logits + t * E;
    float *dl = dlogits + t * E;
    double lse = row_lse(l, E), c = 2.0 * dscale * lse;
    for (int e = 0; e < E; e++) dl[e] += (float)(c * exp((double)l[e] - lse));
}

extern "C" void moe_zloss_accumulate_cuda(mt_backend *be, double *stats, const float *logits,
                                          const uint8_t *row_mask, int T, int E) {
    moe_check("moe_zloss_accumulate_cuda", E, 1);
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    const int nblocks = (int)(((int64_t)T + ZLOSS_ROWS - 1) / ZLOSS_ROWS);
    const size_t bytes = (size_t)nblocks * 2 * sizeof(double);
    double *part = (double *)mt_work_alloc(be, bytes);
    zloss_partial_kernel<<<nblocks, ZLOSS_ROWS, 0, s>>>(part, logits, row_mask, T, E);
    MT_CHECK_LAUNCH();
    zloss_sum_kernel<<<1, THREADS, 0, s>>>(stats, 2 * E + 1, part, nblocks);
    MT_CHECK_LAUNCH();
    mt_work_free(be, part, bytes);
}

extern "C" void moe_zloss_backward_cuda(mt_backend *be, float *dlogits, float dscale, const float *logits,
                                        const uint8_t *row_mask, int T, int E) {
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    zloss_backward_kernel<<<mt_cuda_blocks(T, 128, 0x7fffffffu), 128, 0, s>>>(dlogits, dscale, logits, row_mask, T,
                                                                               E);
    MT_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Permute: a stable counting sort in three launches, one warp per chunk of PERMUTE_CHUNK
// assignments. 1) each chunk's histogram; 2) one block turns them into each chunk's first slot
// per expert (experts' offsets + earlier chunks' counts) and writes counts and offsets; 3) each
// chunk scatters its assignments, 32 at a time: lanes with the same expert (__match_any_sync)
// take consecutive slots in lane order, so the order within an expert is the assignment order.

static __device__ __forceinline__ int32_t permute_id(const int32_t *ids, int a, int n, int E) {
    if (a >= n) return -1;  // past the end: a group of its own, skipped
    int32_t e = ids[a];
    if ((unsigned)e >= (unsigned)E) {
        printf("moe_permute_cuda: expert id %d of assignment %d out of [0, %d)\n", e, a, E);
        __trap();
    }
    return e;
}

// chunk_counts [nchunks, E]
static __global__ void permute_count_kernel(int32_t *chunk_counts, const int32_t *ids, int n, int E) {
    __shared__ int32_t cnt[MOE_MAX_E];
    const int lane = threadIdx.x, a0 = blockIdx.x * PERMUTE_CHUNK, a1 = MT_MIN(n, a0 + PERMUTE_CHUNK);
    for (int e = lane; e < E; e += 32) cnt[e] = 0;
    __syncwarp();
    for (int base = a0; base < a1; base += 32) {
        int32_t e = permute_id(ids, base + lane, a1, E);
        unsigned same = __match_any_sync(0xffffffffu, e);
        if (e >= 0 && lane == __ffs(same) - 1) cnt[e] += __popc(same);
        __syncwarp();
    }
    for (int e = lane; e < E; e += 32) chunk_counts[(int64_t)blockIdx.x * E + e] = cnt[e];
}

// chunk_counts → each chunk's first slot per expert; counts [E] (or NULL), offsets [E+1]. One block.
static __global__ void permute_scan_kernel(int32_t *chunk_counts, int32_t *offsets, int32_t *counts, int nchunks,
                                           int E) {
    __shared__ int32_t total[MOE_MAX_E], off[MOE_MAX_E + 1];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t run = 0;
        for (int c = 0; c < nchunks; c++) {
            int32_t v = chunk_counts[(int64_t)c * E + e];
            chunk_counts[(int64_t)c * E + e] = run;
            run += v;
        }
        total[e] = run;
        if (counts) counts[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // E ≤ 1024 additions: not worth a parallel scan
        off[0] = 0;
        for (int e = 0; e < E; e++) off[e + 1] = off[e] + total[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = off[e];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int c = 0; c < nchunks; c++) chunk_counts[(int64_t)c * E + e] += off[e];
}

static __global__ void permute_scatter_kernel(int32_t *order, const int32_t *chunk_first, const int32_t *ids, int n,
                                              int E) {
    __shared__ int32_t cursor[MOE_MAX_E];
    const int lane = threadIdx.x, a0 = blockIdx.x * PERMUTE_CHUNK, a1 = MT_MIN(n, a0 + PERMUTE_CHUNK);
    for (int e = lane; e < E; e += 32) cursor[e] = chunk_first[(int64_t)blockIdx.x * E + e];
    __syncwarp();
    for (int base = a0; base < a1; base += 32) {
        int a = base + lane;
        int32_t e = permute_id(ids, a, a1, E);
        unsigned same = __match_any_sync(0xffffffffu, e);
        if (e >= 0) order[cursor[e] + __popc(same & ((1u << lane) - 1u))] = a;
        __syncwarp();  // every lane has read its cursor before the group's leader moves it
        if (e >= 0 && lane == __ffs(same) - 1) cursor[e] += __popc(same);
        __syncwarp();
    }
}

extern "C" void moe_permute_cuda(mt_backend *be, int32_t *order, int32_t *offsets, int32_t *counts,
                                 const int32_t *ids, int T, int E, int k) {
    moe_check("moe_permute_cuda", E, k);
    cudaStream_t s = mt_cuda_begin(be);
    const int n = T > 0 ? T * k : 0, nchunks = (n + PERMUTE_CHUNK - 1) / PERMUTE_CHUNK;
    size_t bytes = (size_t)MT_MAX(nchunks, 1) * E * sizeof(int32_t);
    int32_t *cc = (int32_t *)mt_work_alloc(be, bytes);
    if (nchunks > 0) {
        permute_count_kernel<<<nchunks, 32, 0, s>>>(cc, ids, n, E);
        MT_CHECK_LAUNCH();
    }
    permute_scan_kernel<<<1, 1024, 0, s>>>(cc, offsets, counts, nchunks, E);
    MT_CHECK_LAUNCH();
    if (nchunks > 0) {
        permute_scatter_kernel<<<nchunks, 32, 0, s>>>(order, cc, ids, n, E);
        MT_CHECK_LAUNCH();
    }
    mt_work_free(be, cc, bytes);
}

// ---------------------------------------------------------------------------------------------
// Gather and combine

// xs [n, H], row i = x [order[i] / k]; one block per row, V elements per thread and access.
template <int V>
static __global__ void gather_kernel(bf16 *xs, int64_t ldo, const bf16 *x, const int32_t *order, int n, int H, int k) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const bf16 *src = x + (int64_t)(order[i] / k) * H;
        for (int h = threadIdx.x * V; h < H; h += blockDim.x * V) bf16_copy<V>(xs + i * ldo + h, src + h);
    }
}

// inv [n]: inv[order[i]] = i (where each assignment sits in expert order)
static __global__ void invert_kernel(int32_t *inv, const int32_t *order, int n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) inv[order[i]] = (int32_t)i;
}

// Token t's k positions in expert order, ascending (the order the CPU adds them in); pos[j] is a
// position, asg[j] its assignment.
static __device__ __forceinline__ void token_positions(const int32_t *inv, int64_t t, int k, int32_t *pos,
                                                       int32_t *asg) {
    for (int j = 0; j < k; j++) {
        int32_t a = (int32_t)(t * k + j), p = inv[a];
        int q = j;
        for (; q > 0 && pos[q - 1] > p; q--) pos[q] = pos[q - 1], asg[q] = asg[q - 1];
        pos[q] = p, asg[q] = a;
    }
}

// dx [T, H] = Σ over token t's rows of dxs (written, the sums starting at 0); block per token,
// rows added in ascending position in fp32, one rounding.
template <int V>
static __global__ void gather_backward_kernel(bf16 *dx, const bf16 *dxs, int64_t ldi, const int32_t *inv, int T, int H,
                                              int k) {
    int32_t pos[MOE_MAX_K], asg[MOE_MAX_K];
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        token_positions(inv, t, k, pos, asg);
        for (int h = threadIdx.x * V; h < H; h += blockDim.x * V) {
            float v[V], d[V];
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = 0.0f;  // dx written, not added to
            for (int j = 0; j < k; j++) {
                bf16_load<V>(d, dxs + (int64_t)pos[j] * ldi + h);
#pragma unroll
                for (int e = 0; e < V; e++) v[e] += d[e];
            }
            bf16_store<V>(dx + t * H + h, v);
        }
    }
}

// out [T, H] += weights[a] · ys[i] over token t's assignments, in ascending i, in fp32 rounded as
// the CPU rounds (product, then sum: no FMA), then once to bf16.
template <int V>
static __global__ void combine_kernel(bf16 *out, const bf16 *ys, const float *weights, const int32_t *inv, int T,
                                      int H, int k) {
    int32_t pos[MOE_MAX_K], asg[MOE_MAX_K];
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        token_positions(inv, t, k, pos, asg);
        for (int h = threadIdx.x * V; h < H; h += blockDim.x * V) {
            float v[V], y[V];
            bf16_load<V>(v, out + t * H + h);
            for (int j = 0; j < k; j++) {
                const float w = weights[asg[j]];
                bf16_load<V>(y, ys + (int64_t)pos[j] * H + h);
#pragma unroll
                for (int e = 0; e < V; e++) v[e] = __fadd_rn(v[e], __fmul_rn(w, y[e]));
            }
            bf16_store<V>(out + t * H + h, v);
        }
    }
}

// dys [n, H] = weights[a] · dout[t] in fp32 as the CPU rounds it, then once to bf16 (written
// only: a zeroed dys read back and added to would cost two more passes over [n, H]);
// dweights [n] += <dout[t], ys[i]> in fp32 (a block sum: the CPU's order differs); block per row i.
template <int V>
static __global__ void combine_backward_kernel(bf16 *dys, int64_t ldd, float *dweights, const bf16 *dout,
                                               const bf16 *ys, const float *weights, const int32_t *order, int n,
                                               int H, int k) {
    __shared__ float red[32];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int32_t a = order[i];
        const float w = weights[a];
        const bf16 *d = dout + (int64_t)(a / k) * H, *y = ys + i * H;
        float dot = 0.0f;
        for (int h = threadIdx.x * V; h < H; h += blockDim.x * V) {
            float dv[V], g[V], yv[V];
            bf16_load<V>(dv, d + h);
            if (dys) {
#pragma unroll
                for (int e = 0; e < V; e++) g[e] = __fmul_rn(w, dv[e]);  // as the CPU
                bf16_store<V>(dys + i * ldd + h, g);
            }
            if (dweights) {
                bf16_load<V>(yv, y + h);
#pragma unroll
                for (int e = 0; e < V; e++) dot += dv[e] * yv[e];
            }
        }
        if (dweights) {  // uniform over the block
            dot = mt_block_sum(dot, red);
            if (threadIdx.x == 0) dweights[a] += dot;
        }
    }
}

extern "C" void moe_gather_cuda(mt_backend *be, mt_bf16 *xs_, int64_t ldo, const mt_bf16 *x_, const int32_t *order,
                                int n, int H, int k) {
    if (n <= 0 || H <= 0) return;
    bf16 *xs = (bf16 *)xs_;
    const bf16 *x = (const bf16 *)x_;
    cudaStream_t s = mt_cuda_begin(be);
    const unsigned grid = mt_cuda_blocks(n, 1);
    if (vec8_ok(H, xs, x) && ldo % 8 == 0) gather_kernel<8><<<grid, THREADS, 0, s>>>(xs, ldo, x, order, n, H, k);
    else gather_kernel<1><<<grid, THREADS, 0, s>>>(xs, ldo, x, order, n, H, k);
    MT_CHECK_LAUNCH();
}

// The inverse of `order` in work scratch [n]; the caller frees it.
static int32_t *invert_order(mt_backend *be, cudaStream_t s, const int32_t *order, int n, int k, const char *what) {
    if (k < 1 || k > MOE_MAX_K || n % k != 0)
        mt_fatal(MT_EXIT_ERROR, "%s: k=%d must be in [1, %d] and divide n=%d", what, k, (int)MOE_MAX_K, n);
    int32_t *inv = (int32_t *)mt_work_alloc(be, (size_t)n * sizeof(int32_t));
    invert_kernel<<<mt_cuda_blocks(n, THREADS, 0x7fffffffu), THREADS, 0, s>>>(inv, order, n);
    MT_CHECK_LAUNCH();
    return inv;
}

extern "C" void moe_gather_backward_cuda(mt_backend *be, mt_bf16 *dx_, const mt_bf16 *dxs_, int64_t ldi,
                                         const int32_t *order, int n, int H, int k) {
    if (n <= 0 || H <= 0) return;
    bf16 *dx = (bf16 *)dx_;
    const bf16 *dxs = (const bf16 *)dxs_;
    cudaStream_t s = mt_cuda_begin(be);
    int32_t *inv = invert_order(be, s, order, n, k, "moe_gather_backward_cuda");
    const unsigned grid = mt_cuda_blocks(n / k, 1);
    if (vec8_ok(H, dx, dxs) && ldi % 8 == 0) gather_backward_kernel<8><<<grid, THREADS, 0, s>>>(dx, dxs, ldi, inv, n / k, H, k);
    else gather_backward_kernel<1><<<grid, THREADS, 0, s>>>(dx, dxs, ldi, inv, n / k, H, k);
    MT_CHECK_LAUNCH();
    mt_work_free(be, inv, (size_t)n * sizeof(int32_t));
}

extern "C" void moe_combine_cuda(mt_backend *be, mt_bf16 *out_, const mt_bf16 *ys_, const float *weights,
                                 const int32_t *order, int n, int H, int k) {
    if (n <= 0 || H <= 0) return;
    bf16 *out = (bf16 *)out_;
    const bf16 *ys = (const bf16 *)ys_;
    cudaStream_t s = mt_cuda_begin(be);
    int32_t *inv = invert_order(be, s, order, n, k, "moe_combine_cuda");
    const unsigned grid = mt_cuda_blocks(n / k, 1);
    if (vec8_ok(H, out, ys)) combine_kernel<8><<<grid, THREADS, 0, s>>>(out, ys, weights, inv, n / k, H, k);
    else combine_kernel<1><<<grid, THREADS, 0, s>>>(out, ys, weights, inv, n / k, H, k);
    MT_CHECK_LAUNCH();
    mt_work_free(be, inv, (size_t)n * sizeof(int32_t));
}

extern "C" void moe_combine_backward_cuda(mt_backend *be, mt_bf16 *dys_, int64_t ldd, float *dweights,
                                          const mt_bf16 *dout_, const mt_bf16 *ys_, const float *weights,
                                          const int32_t *order, int n, int H, int k) {
    if (n <= 0 || H <= 0 || (!dys_ && !dweights)) return;
    bf16 *dys = (bf16 *)dys_;
    const bf16 *dout = (const bf16 *)dout_, *ys = (const bf16 *)ys_;
    cudaStream_t s = mt_cuda_begin(be);
    const unsigned grid = mt_cuda_blocks(n, 1);
    if (vec8_ok(H, dys, dout, ys) && ldd % 8 == 0)
        combine_backward_kernel<8><<<grid, THREADS, 0, s>>>(dys, ldd, dweights, dout, ys, weights, order, n, H, k);
    else combine_backward_kernel<1><<<grid, THREADS, 0, s>>>(dys, ldd, dweights, dout, ys, weights, order, n, H, k);
    MT_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// SwiGLU over the fused w1‖w3 output: row r of gu [rows, 2f] = [g_r | u_r].

// One element's activation and its gradients: the plain SwiGLU, silu'(g) = s·(1 + g·(1 − s)),
// s = sigmoid(g); or gpt-oss's clamped one (swiglu_clamped_fused_*_cpu's expressions):
// g' = min(g, limit), u' = clamp(u, ±limit), a = (u' + 1)·g'·σ(alpha·g'), dg passing where
// g ≤ limit and du where −limit ≤ u ≤ limit (torch.clamp's bounds), 0 elsewhere.
struct swiglu_plain {
    __device__ float forward(float g, float u) const { return g * mt_sigmoid(g) * u; }
    __device__ void backward(float d, float g, float u, float *dg, float *du) const {
        const float sg = mt_sigmoid(g);
        *dg = d * u * sg * (1.0f + g * (1.0f - sg));
        *du = d * g * sg;
    }
};
struct swiglu_clamped {
    float alpha, limit;
    __device__ float forward(float g, float u) const {
        const float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
        return (uc + 1.0f) * (gc * mt_sigmoid(gc * alpha));
    }
    __device__ void backward(float d, float g, float u, float *dg, float *du) const {
        const float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit), s = mt_sigmoid(gc * alpha);
        *dg = g <= limit ? d * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
        *du = u >= -limit && u <= limit ? d * gc * s : 0.0f;
    }
};

// gu [rows, 2f] → a [rows, f] (row stride lda); thread per V consecutive columns of a row (f % V == 0).
template <int V, typename Act>
static __global__ void swiglu_fused_forward_kernel(bf16 *a, int64_t lda, const bf16 *gu, int64_t rows, int64_t f,
                                                   const Act act) {
    const int64_t nv = rows * (f / V);
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < nv; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = q / (f / V), c = (q % (f / V)) * V;
        float g[V], u[V];
        bf16_load<V>(g, gu + r * 2 * f + c);
        bf16_load<V>(u, gu + r * 2 * f + f + c);
#pragma unroll
        for (int e = 0; e < V; e++) g[e] = act.forward(g[e], u[e]);
        bf16_store<V>(a + r * lda + c, g);
    }
}

// da [rows, f] (row stride ldda) → dgu [rows, 2f] = [dg | du]. Each thread reads its g, u and da
// before it writes the same places of dgu: dgu may be gu itself.
template <int V, typename Act>
static __global__ void swiglu_fused_backward_kernel(bf16 *dgu, const bf16 *da, int64_t ldda, const bf16 *gu,
                                                    int64_t rows, int64_t f, const Act act) {
    const int64_t nv = rows * (f / V);
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < nv; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = q / (f / V), c = (q % (f / V)) * V;
        float g[V], u[V], d[V], dg[V], du[V];
        bf16_load<V>(g, gu + r * 2 * f + c);
        bf16_load<V>(u, gu + r * 2 * f + f + c);
        bf16_load<V>(d, da + r * ldda + c);
#pragma unroll
        for (int e = 0; e < V; e++) act.backward(d[e], g[e], u[e], &dg[e], &du[e]);
        bf16_store<V>(dgu + r * 2 * f + c, dg);
        bf16_store<V>(dgu + r * 2 * f + f + c, du);
    }
}

// The 16-byte path wants f and the strided rows (lda, ldda) multiples of 8 as well as 16-byte bases.
template <typename Act>
static void swiglu_fused_forward(mt_backend *be, mt_bf16 *a_, int64_t lda, const mt_bf16 *gu_, int64_t rows, int64_t f,
                                 Act act) {
    if (rows <= 0 || f <= 0) return;
    bf16 *a = (bf16 *)a_;
    const bf16 *gu = (const bf16 *)gu_;
    cudaStream_t s = mt_cuda_begin(be);
    if (vec8_ok(f, a, gu) && lda % 8 == 0)
        swiglu_fused_forward_kernel<8, Act><<<mt_cuda_blocks(rows * f / 8, THREADS, 8192), THREADS, 0, s>>>(a, lda, gu,
                                                                                                         rows, f, act);
    else swiglu_fused_forward_kernel<1, Act><<<mt_cuda_blocks(rows * f, THREADS, 8192), THREADS, 0, s>>>(a, lda, gu, rows,
                                                                                                       f, act);
    MT_CHECK_LAUNCH();
}

template <typename Act>
static void swiglu_fused_backward(mt_backend *be, mt_bf16 *dgu_, const mt_bf16 *da_, int64_t ldda, const mt_bf16 *gu_,
                                  int64_t rows, int64_t f, Act act) {
    if (rows <= 0 || f <= 0 || !dgu_) return;
    bf16 *dgu = (bf16 *)dgu_;
    const bf16 *da = (const bf16 *)da_, *gu = (const bf16 *)gu_;
    cudaStream_t s = mt_cuda_begin(be);
    if (vec8_ok(f, dgu, da, gu) && ldda % 8 == 0)
        swiglu_fused_backward_kernel<8, Act><<<mt_cuda_blocks(rows * f / 8, THREADS, 8192), THREADS, 0, s>>>(
            dgu, da, ldda, gu, rows, f, act);
    else swiglu_fused_backward_kernel<1, Act><<<mt_cuda_blocks(rows * f, THREADS, 8192), THREADS, 0, s>>>(
            dgu, da, ldda, gu, rows, f, act);
    MT_CHECK_LAUNCH();
}

extern "C" void swiglu_fused_forward_cuda(mt_backend *be, mt_bf16 *a, int64_t lda, const mt_bf16 *gu, int64_t rows,
                                          int64_t f) {
    swiglu_fused_forward(be, a, lda, gu, rows, f, swiglu_plain{});
}

extern "C" void swiglu_fused_backward_cuda(mt_backend *be, mt_bf16 *dgu, const mt_bf16 *da, int64_t ldda,
                                           const mt_bf16 *gu, int64_t rows, int64_t f) {
    swiglu_fused_backward(be, dgu, da, ldda, gu, rows, f, swiglu_plain{});
}

extern "C" void swiglu_clamped_fused_forward_cuda(mt_backend *be, mt_bf16 *a, int64_t lda, const mt_bf16 *gu,
                                                  int64_t rows, int64_t f, float alpha, float limit) {
    swiglu_fused_forward(be, a, lda, gu, rows, f, swiglu_clamped{alpha, limit});
}

extern "C" void swiglu_clamped_fused_backward_cuda(mt_backend *be, mt_bf16 *dgu, const mt_bf16 *da, int64_t ldda,
                                                   const mt_bf16 *gu, int64_t rows, int64_t f, float alpha,
                                                   float limit) {
    swiglu_fused_backward(be, dgu, da, ldda, gu, rows, f, swiglu_clamped{alpha, limit});
}

// ---------------------------------------------------------------------------------------------
// Replay: the recorded choices' weights from fresh probabilities (model/forward.c's twin).

static __global__ void weights_of_choices_kernel(float *weights, const float *probs, const int32_t *ids, int T,
                                                 int E, int k, int norm) {
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *p = probs + t * E;
    const int32_t *id = ids + t * k;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += p[id[j]];
    if (!norm) sum = 1.0f;  // norm_topk_prob false: the chosen probabilities as they are
    for (int j = 0; j < k; j++) weights[t * k + j] = p[id[j]] / sum;
}

extern "C" void moe_weights_of_choices_cuda(mt_backend *be, float *weights, const float *probs, const int32_t *ids,
                                            int T, int E, int k, int norm) {
    if (T <= 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    weights_of_choices_kernel<<<mt_cuda_blocks(T, THREADS), THREADS, 0, s>>>(weights, probs, ids, T, E, k, norm);
    MT_CHECK_LAUNCH();
}
