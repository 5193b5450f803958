// tests/fd.h — central finite differences for gradient tests (header-only, shared by all folders).
//
// Usage: write a loss `double f(void *ctx)` that runs the forward from the parameters it reads
// through ctx and reduces the output to a scalar (e.g. Σ g·y for a fixed random g, in double);
// get the analytic gradient from the backward (with dy = g); then
//     fd_report r = fd_check_f32(f, ctx, x, dx, n, 1e-3f, floor);
//     cr_assert(r.worst < 1e-2, FD_FMT, FD_ARGS(r));
// Each checked x[i] is moved by ±h, f is evaluated twice, and x[i] is restored bit for bit.
// The error per element is |a − n| / max(|a|, |n|, floor): relative where the gradient is large,
// absolute (scaled by 1/floor) where both are near zero — pick floor at the noise level of the
// differences (≈ a few % of the gradient's typical size for fp32 forwards and h ≈ 1e-3).
#pragma once
#include <math.h>
#include <stdint.h>

typedef double (*fd_fn)(void *ctx);

typedef struct fd_report {
    double worst;       // largest normalised error
    int64_t index;      // where it was (-1 when nothing was checked)
    double analytic, numeric;
    int64_t checked;
} fd_report;

#define FD_FMT "worst normalised error %.3g at [%lld]: analytic %.6g, numeric %.6g (%lld checked)"
#define FD_ARGS(r) (r).worst, (long long)(r).index, (r).analytic, (r).numeric, (long long)(r).checked

// A NaN or infinity on either side is an infinite error (a NaN would slip through any `<`).
static inline double fd_rel_err(double a, double n, double floor) {
    if (!isfinite(a) || !isfinite(n)) return INFINITY;
    double d = fmax(fmax(fabs(a), fabs(n)), floor);
    return d > 0 ? fabs(a - n) / d : 0.0;
}

static inline void fd_note(fd_report *r, int64_t i, double a, double num, double floor) {
    double e = fd_rel_err(a, num, floor);
    if (r->index < 0 || e > r->worst) *r = (fd_report){e, i, a, num, r->checked};
    r->checked++;
}

// float parameters; the step actually taken is (x+h) − (x−h) as rounded in float.
static inline fd_report fd_check_f32(fd_fn f, void *ctx, float *x, const float *grad, int64_t n,
                                     float h, double floor) {
    fd_report r = {0, -1, 0, 0, 0};
    for (int64_t i = 0; i < n; i++) {
        float x0 = x[i], xp = x0 + h, xm = x0 - h;
        x[i] = xp;
        double fp = f(ctx);
        x[i] = xm;
        double fm = f(ctx);
        x[i] = x0;
        fd_note(&r, i, grad[i], (fp - fm) / ((double)xp - (double)xm), floor);
    }
    return r;
}

static inline fd_report fd_check_f64(fd_fn f, void *ctx, double *x, const double *grad, int64_t n,
                                     double h, double floor) {
    fd_report r = {0, -1, 0, 0, 0};
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double fp = f(ctx);
        x[i] = x0 - h;
        double fm = f(ctx);
        x[i] = x0;
        fd_note(&r, i, grad[i], (fp - fm) / (2 * h), floor);
    }
    return r;
}

// Largest |g|: a convenient scale for floor (e.g. floor = 0.01 · fd_max_abs(grad, n)).
static inline double fd_max_abs(const float *g, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)g[i]));
    return m;
}
