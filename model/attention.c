// model/attention.c — causal grouped-query attention with sliding window and key padding mask,
// CPU, fp32, as tiled flash attention. Forward keeps only lse [T, nh]; backward recomputes the
// probabilities tile by tile, so no S×S matrix exists at any time. The scalar reference these
// are tested against is model/attention_ref.c.
//
// Visibility (the one rule every kernel here and in attention_ref.c uses): key j is visible to
// query i of sequence b iff
//   j ≤ i  and  (window == 0 or i − j < window)  and  (key_mask == NULL or key_mask[b·S + j]).
// This is transformers' sliding-window mask (masking_utils.sliding_window_overlay:
// kv_idx > q_idx − sliding_window), so a query sees itself and the window − 1 keys before it;
// window = 1 sees only itself. (flash-attn's window_size = (w, 0) means i − j ≤ w: one more key.)
//
// Tiles: queries in blocks of ATT_BQ rows, keys in blocks of ATT_BK on a grid from 0. Each block
// product (Q_i K_jᵀ, P V_j, and the backward's four) is one sgemm on strided rows of q, k, v (no
// copies); mt_sgemm runs it on the calling thread inside the parallel regions here. A block pair
// with no visible element (above the diagonal, outside the window, or all keys masked) is never
// computed; the mask is applied element by element only on the blocks it cuts.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/gemm.h"
#include "core/vmath.h"
#include "model/ops.h"

// Forward: a task is (sequence, head, block of ATT_BQ queries); keys come in chunks of up to
// ATT_KC, so that P·V is one product with a long inner dimension. Backward: a task is (sequence,
// head); key blocks of ATT_BK, each against the queries that can see it in chunks of up to ATT_QC,
// so that the dK and dV products have the long inner dimension. Short inner dimensions (64 × 64 ×
// 64 tiles) ran at half the machine's sgemm rate; these shapes let OpenBLAS amortise its packing.
enum { ATT_BQ = 64, ATT_KC = 512, ATT_BK = 64, ATT_QC = 512 };

static void attn_check_shape(int nh, int nkv, int hd, int hd_v) {
    if (nkv <= 0 || nh % nkv != 0 || hd <= 0 || hd_v <= 0)
        mt_fatal(MT_EXIT_ERROR, "attention: nh=%d must be a multiple of nkv=%d, hd=%d and hd_v=%d > 0", nh, nkv, hd,
                 hd_v);
}

// The first key inside the window of query i (0 without a window).
static inline int attn_first_key(int i, int window) { return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0; }

// 1 if keys [j0, j0+nk) of sequence `km` (its key_mask row, or NULL) include a visible one.
static inline int attn_keys_any(const uint8_t *km, int j0, int nk) {
    if (!km) return 1;
    for (int c = 0; c < nk; c++)
        if (km[j0 + c]) return 1;
    return 0;
}

// s [nq, ld]: sets the entries of invisible (query i0 + r, key j0 + c) pairs to −inf; entries
// already visible are left alone, so a block wholly visible costs one pass over the key mask.
static void attn_mask_block(float *s, int ld, int nq, int nk, int i0, int j0, int window, const uint8_t *km) {
    for (int r = 0; r < nq; r++) {
        int i = i0 + r, lo = attn_first_key(i, window) - j0, hi = i - j0 + 1;  // visible: c in [lo, hi)
        float *sr = s + (int64_t)r * ld;
        for (int c = 0; c < MT_MIN(lo, nk); c++) sr[c] = -INFINITY;
        for (int c = MT_MAX(hi, 0); c < nk; c++) sr[c] = -INFINITY;
    }
    if (km)
        for (int c = 0; c < nk; c++)
            if (!km[j0 + c])
                for (int r = 0; r < nq; r++) s[(int64_t)r * ld + c] = -INFINITY;
}

// One query block's online-softmax update on its scores s [nq, ld] (masked entries −inf):
// m, l [nq] running max and sum, o [nq, hd] running output. s becomes P = exp(s − m_new) (0 where
// masked or where the row has no visible key yet) and o rows are rescaled by exp(m_old − m_new).
MT_HOT static void attn_online_softmax(float *restrict s, int ld, int nq, int nk, float *restrict m,
                                       float *restrict l, float *restrict o, int hd) {
    for (int r = 0; r < nq; r++) {
        float *restrict sr = s + (int64_t)r * ld;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int c = 0; c < nk; c++) mx = sr[c] > mx ? sr[c] : mx;
        float mnew = mx > m[r] ? mx : m[r];
        float base = mnew == -INFINITY ? 0.0f : mnew;  // all masked so far: P = exp(−inf) = 0
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < nk; c++) {
            float p = mt_vexpf(sr[c] - base);
            sr[c] = p;
            sum += p;
        }
        if (m[r] != mnew) {
            float alpha = mt_vexpf(m[r] - base);
            float *restrict orow = o + (int64_t)r * hd;
#pragma omp simd
            for (int d = 0; d < hd; d++) orow[d] *= alpha;
            l[r] *= alpha;
        }
        l[r] += sum;
        m[r] = mnew;
    }
}

// q [T, nh, hd], k [T, nkv, hd], v [T, nkv, hd_v], sinks [nh] or NULL, key_mask [T] or NULL
// → out [T, nh, hd_v], lse [T, nh]
void attention_forward_cpu(float *out, float *lse, const float *q, const float *k, const float *v, const float *sinks,
                           const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                           int window) {
    attn_check_shape(nh, nkv, hd, hd_v);
    const int group = nh / nkv, nqb = (S + ATT_BQ - 1) / ATT_BQ;
    const int ldq = nh * hd, ldk = nkv * hd, ldv = nkv * hd_v, ldo = nh * hd_v;
#pragma omp parallel
    {
        float *s = mt_xmalloc(sizeof(float) * ATT_BQ * ATT_KC), *o = mt_xmalloc(sizeof(float) * ATT_BQ * hd_v);
        float m[ATT_BQ], l[ATT_BQ];
        // Later query blocks have more keys: dynamic hands them out as threads free up.
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < nh; h++)
                for (int qb = 0; qb < nqb; qb++) {
                    int i0 = qb * ATT_BQ, nq = MT_MIN(ATT_BQ, S - i0), kvh = h / group;
                    const uint8_t *km = key_mask ? key_mask + (int64_t)b * S : NULL;
                    const float *qi = q + ((int64_t)b * S + i0) * ldq + (int64_t)h * hd;
                    for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0.0f;
                    memset(o, 0, sizeof(float) * nq * hd_v);
                    for (int j0 = attn_first_key(i0, window); j0 < i0 + nq; j0 += ATT_KC) {
                        int nk = MT_MIN(ATT_KC, i0 + nq - j0);
                        if (!attn_keys_any(km, j0, nk)) continue;
                        const int64_t kr = ((int64_t)b * S + j0) * ldk + (int64_t)kvh * hd;
                        const int64_t vr = ((int64_t)b * S + j0) * ldv + (int64_t)kvh * hd_v;
                        mt_sgemm(0, 1, nq, nk, hd, scale, qi, ldq, k + kr, ldk, 0.0f, s, ATT_KC);
                        attn_mask_block(s, ATT_KC, nq, nk, i0, j0, window, km);
                        attn_online_softmax(s, ATT_KC, nq, nk, m, l, o, hd_v);
                        mt_sgemm(0, 0, nq, hd_v, nk, 1.0f, s, ATT_KC, v + vr, ldv, 1.0f, o, hd_v);
                    }
                    for (int r = 0; r < nq; r++) {
                        int64_t row = ((int64_t)b * S + i0 + r) * nh + h;
                        float *orow = out + ((int64_t)b * S + i0 + r) * ldo + (int64_t)h * hd_v;
                        if (sinks) {  // the sink joins the denominator: l·e^m + e^z, over their max
                            const float z = sinks[h], mx = m[r] > z ? m[r] : z, a = expf(m[r] - mx);
                            const float den = l[r] * a + expf(z - mx), inv = a / den;  // no key: a = 0, out 0
                            for (int d = 0; d < hd_v; d++) orow[d] = o[(int64_t)r * hd_v + d] * inv;
                            lse[row] = mx + logf(den);
                            continue;
                        }
                        if (l[r] == 0.0f) {  // no visible key: out 0, lse −inf, and no 0/0
                            memset(orow, 0, sizeof(float) * hd_v);
                            lse[row] = -INFINITY;
                            continue;
                        }
                        float inv = 1.0f / l[r];
                        for (int d = 0; d < hd_v; d++) orow[d] = o[(int64_t)r * hd_v + d] * inv;
                        lse[row] = m[r] + logf(l[r]);
                    }
                }
        free(s);
        free(o);
    }
}

// Backward of one block pair, from its recomputed scores s = scale·Q_i K_jᵀ (masked −inf):
// P = exp(s − lse) into s; dp = dO_i V_jᵀ becomes dS = P ∘ (dp − D). lse_r = −inf (a row with
// no visible key) is passed as +inf, so its P row is exp(−inf) = 0.
MT_HOT static void attn_block_ds(float *restrict s, float *restrict dp, int ld, int nq, int nk,
                                 const float *restrict lse, const float *restrict D) {
    for (int r = 0; r < nq; r++) {
        float *restrict sr = s + (int64_t)r * ld, *restrict dr = dp + (int64_t)r * ld;
        const float lr = lse[r], dd = D[r];
#pragma omp simd
        for (int c = 0; c < nk; c++) {
            float p = mt_vexpf(sr[c] - lr);
            sr[c] = p;
            dr[c] = p * (dr[c] - dd);
        }
    }
}

// With P_ij = exp(s_ij − lse_i), s_ij = scale·q_i·k_j:
//   dP_ij = dO_i·v_j,  D_i = dO_i·O_i (= Σ_j P_ij dP_ij),  dS_ij = P_ij (dP_ij − D_i)
//   dq_i += scale Σ_j dS_ij k_j,  dk_j += scale Σ_i dS_ij q_i,  dv_j += Σ_i P_ij dO_i
// With sinks, lse includes the sink, so P is recomputed as before; the sink's own column has
// dP = 0 (no value row): dsink_h = Σ_i P_i,sink (0 − D_i) = −Σ_i exp(sink_h − lse_i) D_i.
// One pass per (sequence, query head), key blocks outer and query blocks inner, each block pair's
// P recomputed once for all three gradients. A task owns its dq rows; dk and dv rows are shared by
// the heads of a group, so with group > 1 each head writes its own partial and the partials are
// summed in head order afterwards: no atomics, the same bits at any thread count.
// q [T, nh, hd], k [T, nkv, hd], v [T, nkv, hd_v], dout, out [T, nh, hd_v], lse [T, nh]
// → dq +=, dk +=, dv += (NULL skipped)
void attention_backward_cpu(float *dq, float *dk, float *dv, float *dsinks, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse, const float *sinks,
                            const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                            int window) {
    attn_check_shape(nh, nkv, hd, hd_v);
    const int group = nh / nkv, ldq = nh * hd, ldk = nkv * hd, ldo = nh * hd_v, ldv = nkv * hd_v;
    // Per-head partials of dk [B, nh, S, hd] and dv [B, nh, S, hd_v] when heads share a kv head.
    const int partial = group > 1;
    float *pk = partial && dk ? mt_xcalloc((size_t)B * nh * S * hd, sizeof(float)) : NULL;
    float *pv = partial && dv ? mt_xcalloc((size_t)B * nh * S * hd_v, sizeof(float)) : NULL;
    if (dsinks && !sinks) mt_fatal(MT_EXIT_ERROR, "attention_backward_cpu: dsinks without sinks");
    float *ps = dsinks ? mt_xcalloc((size_t)B * nh, sizeof(float)) : NULL;  // dsinks per (b, h), summed in b order
#pragma omp parallel
    {
        float *s = mt_xmalloc(sizeof(float) * ATT_QC * ATT_BK), *dp = mt_xmalloc(sizeof(float) * ATT_QC * ATT_BK);
        float *Dh = mt_xmalloc(sizeof(float) * S), *lh = mt_xmalloc(sizeof(float) * S);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < nh; h++) {
                const int kvh = h / group;
                const uint8_t *km = key_mask ? key_mask + (int64_t)b * S : NULL;
                const int64_t q0 = (int64_t)b * S * ldq + (int64_t)h * hd, k0 = (int64_t)b * S * ldk + (int64_t)kvh * hd;
                const int64_t o0 = (int64_t)b * S * ldo + (int64_t)h * hd_v, v0 = (int64_t)b * S * ldv + (int64_t)kvh * hd_v;
                for (int i = 0; i < S; i++) {  // D_i and lse_i of this head, contiguous
                    const float *g = dout + o0 + (int64_t)i * ldo, *o = out + o0 + (int64_t)i * ldo;
                    float d = 0.0f;
                    for (int e = 0; e < hd_v; e++) d += g[e] * o[e];
                    float li = lse[((int64_t)b * S + i) * nh + h];
                    Dh[i] = d, lh[i] = li == -INFINITY ? INFINITY : li;
                }
                if (ps) {
                    float acc = 0.0f;
                    for (int i = 0; i < S; i++) acc -= expf(sinks[h] - lh[i]) * Dh[i];
                    ps[(size_t)b * nh + h] = acc;
                }
                // Where this head's dk and dv rows go: its partials, or dk / dv themselves.
                float *gk = NULL, *gv = NULL;
                int ldgk = partial ? hd : ldk, ldgv = partial ? hd_v : ldv;
                if (partial) {
                    size_t p0 = ((size_t)b * nh + h) * S;
                    gk = pk ? pk + p0 * hd : NULL, gv = pv ? pv + p0 * hd_v : NULL;
                } else {
                    gk = dk ? dk + k0 : NULL, gv = dv ? dv + v0 : NULL;
                }
                for (int j0 = 0; j0 < S; j0 += ATT_BK) {
                    int nk = MT_MIN(ATT_BK, S - j0);
                    if (!attn_keys_any(km, j0, nk)) continue;
                    // The queries that can see a key of this block: from j0 to the last one whose
                    // window reaches the block's last key.
                    int qend = window > 0 ? MT_MIN(S, j0 + nk - 1 + window) : S;
                    const float *kj = k + k0 + (int64_t)j0 * ldk, *vj = v + v0 + (int64_t)j0 * ldv;
                    for (int i0 = j0; i0 < qend; i0 += ATT_QC) {
                        int nq = MT_MIN(ATT_QC, qend - i0);
                        const float *qi = q + q0 + (int64_t)i0 * ldq, *gi = dout + o0 + (int64_t)i0 * ldo;
                        mt_sgemm(0, 1, nq, nk, hd, scale, qi, ldq, kj, ldk, 0.0f, s, ATT_BK);
                        attn_mask_block(s, ATT_BK, nq, nk, i0, j0, window, km);
                        mt_sgemm(0, 1, nq, nk, hd_v, 1.0f, gi, ldo, vj, ldv, 0.0f, dp, ATT_BK);
                        attn_block_ds(s, dp, ATT_BK, nq, nk, lh + i0, Dh + i0);
                        if (gv)  // dV_j += Pᵀ dO_i
                            mt_sgemm(1, 0, nk, hd_v, nq, 1.0f, s, ATT_BK, gi, ldo, 1.0f, gv + (int64_t)j0 * ldgv, ldgv);
                        if (gk)  // dK_j += scale dSᵀ Q_i
                            mt_sgemm(1, 0, nk, hd, nq, scale, dp, ATT_BK, qi, ldq, 1.0f, gk + (int64_t)j0 * ldgk, ldgk);
                        if (dq)  // dQ_i += scale dS K_j
                            mt_sgemm(0, 0, nq, hd, nk, scale, dp, ATT_BK, kj, ldk, 1.0f, dq + q0 + (int64_t)i0 * ldq,
                                     ldq);
                    }
                }
            }
        free(s), free(dp), free(Dh), free(lh);
        if (partial) {  // dk, dv rows += the partials of their group's heads, in head order
#pragma omp for collapse(2)
            for (int b = 0; b < B; b++)
                for (int j = 0; j < S; j++)
                    for (int kvh = 0; kvh < nkv; kvh++) {
                        int64_t row = ((int64_t)b * S + j) * nkv + kvh;
                        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                            size_t p = ((size_t)b * nh + h) * S + j;
                            if (pk)
                                for (int e = 0; e < hd; e++) dk[row * hd + e] += pk[p * hd + e];
                            if (pv)
                                for (int e = 0; e < hd_v; e++) dv[row * hd_v + e] += pv[p * hd_v + e];
                        }
                    }
        }
    }
    if (ps)
        for (int h = 0; h < nh; h++)
            for (int b = 0; b < B; b++) dsinks[h] += ps[(size_t)b * nh + h];
    free(pk);
    free(pv);
    free(ps);
}
