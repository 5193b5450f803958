// model/row_expert.cuh — which expert's rows hold a row, on the device: the search the kernels
// that walk a grouped call's rows share (model/grouped_cuda.cu's dropout, model/parts_cuda.cu's
// expert biases). Include after cuda_runtime.h.
#pragma once
#include <stdint.h>

// The expert e whose rows [o[e], o[e+1]) hold row r, o non-decreasing [E+1] (an expert without
// rows is skipped: the last e with o[e] <= r); -1 when r is outside [o[0], o[E]).
static __device__ __forceinline__ int row_expert(const int32_t *o, int E, int64_t r) {
    if (r < o[0] || r >= o[E]) return -1;
    int lo = 0, hi = E;  // o[lo] <= r < o[hi]
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (o[mid] <= r) lo = mid;
        else hi = mid;
    }
    return lo;
}
