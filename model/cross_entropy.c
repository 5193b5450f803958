// model/cross_entropy.c — softmax cross-entropy over a vocabulary, with ignored targets
// (CPU reference, fp32 log-softmax, double loss sum). The row loops are `omp simd` over
// core/vmath.h's exp, built for x86-64-v3 and the baseline (MT_HOT).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/vmath.h"
#include "model/ops.h"

// One counted row: returns logsumexp(lt); dt (may be NULL, may be lt) gets
// keep·dt + dscale·softmax(lt).
MT_HOT static float ce_row(float *dt, const float *lt, int V, float dscale, float keep) {
    float m = -INFINITY;  // max-subtracted: exp never overflows
#pragma omp simd reduction(max : m)
    for (int i = 0; i < V; i++) m = lt[i] > m ? lt[i] : m;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; i++) sum += mt_vexpf(lt[i] - m);
    if (dt) {  // in place, element i is read before it is written
        float inv = (float)(1.0 / sum);
#pragma omp simd
        for (int i = 0; i < V; i++) dt[i] = keep * dt[i] + dscale * (mt_vexpf(lt[i] - m) * inv);
    }
    return m + (float)log(sum);
}

// logits [T, V], targets [T] → returns Σ over counted rows of (logsumexp(row) − row[target]),
// *count = rows whose target ≠ ignore_index; dlogits [T, V] += dscale·(softmax − onehot) on those
// rows (ignored rows untouched; dlogits may be NULL). dlogits == logits: the gradient REPLACES
// the logits (ignored rows become 0), so the model never holds two T×V fp32 buffers.
double cross_entropy_cpu(float *dlogits, float dscale, int64_t *count, const float *logits,
                         const int32_t *targets, int T, int V, int ignore_index) {
    // Checked before the parallel loop, so that a bad id is a clean fatal, not an OOB read.
    int64_t n = 0;
    for (int t = 0; t < T; t++) {
        if (targets[t] == ignore_index) continue;
        if (targets[t] < 0 || targets[t] >= V)
            mt_fatal(MT_EXIT_ERROR, "cross_entropy: row %d has target %d outside [0, %d) (ignore_index %d)",
                     t, targets[t], V, ignore_index);
        n++;
    }
    // Row losses in a buffer and summed in order afterwards: the same sum at any thread count.
    double *row_loss = mt_xmalloc((size_t)(T > 0 ? T : 1) * sizeof(double));
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        row_loss[t] = 0.0;
        if (targets[t] == ignore_index) {
            if (dlogits && dlogits == logits) memset(dlogits + (int64_t)t * V, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float *lt = logits + (int64_t)t * V;
        float target_logit = lt[targets[t]];  // read before an in-place gradient overwrites it
        float *dt = dlogits ? dlogits + (int64_t)t * V : NULL;
        float lse = ce_row(dt, lt, V, dscale, dlogits == logits ? 0.0f : 1.0f);
        row_loss[t] = (double)lse - target_logit;
        if (dt) dt[targets[t]] -= dscale;
    }
    double loss = 0.0;
    for (int t = 0; t < T; t++) loss += row_loss[t];
    free(row_loss);
    if (count) *count = n;
    return loss;
}
