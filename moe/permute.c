// moe/permute.c — sort the T·k assignments by expert, gather token rows into expert order, and
// the weighted combine back to token order, with their backwards (CPU reference, fp32).
// Assignment a = t·k + j is token t's j-th choice; order[i] = a lists them expert by expert.
// Scatters into token rows (gather backward, combine) run in parallel over column blocks, so
// each output element is summed by one thread in a fixed order: no races, reproducible.
#include <string.h>

#include "core/common.h"
#include "moe/moe.h"

#define PERMUTE_COLS 64  // columns per thread block of the scatters

// ids [T, k] → order [T·k], offsets [E+1], counts [E] (or NULL). A stable counting sort.
void moe_permute_cpu(int32_t *order, int32_t *offsets, int32_t *counts, const int32_t *ids, int T,
                     int E, int k) {
    const int n = T * k;
    memset(offsets, 0, (size_t)(E + 1) * sizeof *offsets);
    for (int a = 0; a < n; a++) {
        int32_t e = ids[a];
        if (e < 0 || e >= E) mt_fatal(MT_EXIT_ERROR, "moe_permute: expert id %d out of [0, %d)", e, E);
        offsets[e + 1]++;
    }
    if (counts)
        for (int e = 0; e < E; e++) counts[e] = offsets[e + 1];
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
    // counts as fill cursors would clobber the caller's array; walk a copy of the offsets instead
    int32_t cursor_stack[1024];
    int32_t *cursor = E <= 1024 ? cursor_stack : mt_xmalloc((size_t)E * sizeof *cursor);
    memcpy(cursor, offsets, (size_t)E * sizeof *cursor);
    for (int a = 0; a < n; a++) order[cursor[ids[a]]++] = a;
    if (cursor != cursor_stack) free(cursor);
}

// x [T, H] → xs [n, H] (rows ldo apart), row i = x[order[i] / k]
void moe_gather_cpu(float *xs, int64_t ldo, const float *x, const int32_t *order, int n, int H, int k) {
#pragma omp parallel for
    for (int i = 0; i < n; i++)
        memcpy(xs + (int64_t)i * ldo, x + (int64_t)(order[i] / k) * H, (size_t)H * sizeof *xs);
}

// dxs [n, H] (rows ldi apart) → dx [T, H], the sum of token order[i] / k's rows i
void moe_gather_backward_cpu(float *dx, const float *dxs, int64_t ldi, const int32_t *order, int n, int H, int k) {
    const int nb = (H + PERMUTE_COLS - 1) / PERMUTE_COLS;
#pragma omp parallel for
    for (int b = 0; b < nb; b++) {
        const int h0 = b * PERMUTE_COLS, h1 = MT_MIN(H, h0 + PERMUTE_COLS);
        for (int t = 0; t < n / k; t++) memset(dx + (int64_t)t * H + h0, 0, (size_t)(h1 - h0) * sizeof(float));
        for (int i = 0; i < n; i++) {
            float *d = dx + (int64_t)(order[i] / k) * H;
            const float *s = dxs + (int64_t)i * ldi;
            for (int h = h0; h < h1; h++) d[h] += s[h];
        }
    }
}

// ys [n, H] (expert order), weights [T·k] (assignment order) → out [T, H] +=
// out[t] += weights[a] · ys[i], a = order[i], t = a / k
void moe_combine_cpu(float *out, const float *ys, const float *weights, const int32_t *order, int n,
                     int H, int k) {
    const int nb = (H + PERMUTE_COLS - 1) / PERMUTE_COLS;
#pragma omp parallel for
    for (int b = 0; b < nb; b++) {
        const int h0 = b * PERMUTE_COLS, h1 = MT_MIN(H, h0 + PERMUTE_COLS);
        for (int i = 0; i < n; i++) {
            const int32_t a = order[i];
            const float w = weights[a];
            float *o = out + (int64_t)(a / k) * H;
            const float *y = ys + (int64_t)i * H;
            for (int h = h0; h < h1; h++) o[h] += w * y[h];
        }
    }
}

// dout [T, H] → dys [n, H] (rows ldd apart, written), dweights [T·k] += (either may be NULL):
// dys[i] = weights[a] · dout[t], dweights[a] += <dout[t], ys[i]>   (a = order[i], t = a / k)
void moe_combine_backward_cpu(float *dys, int64_t ldd, float *dweights, const float *dout, const float *ys,
                              const float *weights, const int32_t *order, int n, int H, int k) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const int32_t a = order[i];
        const float *d = dout + (int64_t)(a / k) * H;
        if (dys) {
            const float w = weights[a];
            float *dy = dys + (int64_t)i * ldd;
            for (int h = 0; h < H; h++) dy[h] = w * d[h];
        }
        if (dweights) {
            const float *y = ys + (int64_t)i * H;
            float dot = 0.0f;
            for (int h = 0; h < H; h++) dot += d[h] * y[h];
            dweights[a] += dot;  // order is a permutation: each a is one i, one thread
        }
    }
}
