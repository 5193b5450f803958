// tests/gpu_or_skip.h — the CUDA backend on GPU 0 for a Criterion test, or the test is skipped
// with the reason: a CPU build, no GPU (the driver's words), or a GPU older than the build's
// targets. A skip is reported as a skip, never as a pass. Include after criterion.h.
#pragma once
#include <string.h>

#include "core/backend.h"
#include "core/common.h"

static inline mt_backend *gpu_or_skip(void) {
#ifndef MT_CUDA
    cr_skip_test("no CUDA GPU: this is a CPU build (rebuild with `make CUDA=1`)");
    return NULL;
#else
    if (mt_cuda_device_count() == 0) {
        mt_backend *be = mt_backend_cuda_new(0);
        cr_assert_null(be, "mt_cuda_device_count() is 0 but the backend was created");
        cr_skip_test("%s", mt_error_get());  // "no CUDA GPU: <the driver's reason>"
    }
    mt_backend *be = mt_backend_cuda_new(0);
    if (!be && strstr(mt_error_get(), "compute capability"))  // a pre-Ampere GPU: nothing to test on
        cr_skip_test("unsupported GPU: %s", mt_error_get());
    cr_assert_not_null(be, "cuda backend on GPU 0: %s", mt_error_get());
    return be;
#endif
}
