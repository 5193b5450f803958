// core/profile_cuda.cu — the profiler's CUDA events (core/profile.h): one event per change of
// region, recorded on the backend's stream, created on first use and kept for the next step.
// Events hold no device memory the ledger would count. Only a profiled step gets here.
#include <cuda_runtime.h>
#include <string.h>

#include "core/cuda_check.h"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "core/profile.h"

static cudaEvent_t *events;
static int n_events;

extern "C" void *mt_prof_cuda_stream(mt_backend *be) { return mt_cuda_backend_stream(be); }

// At least n events (mt_prof_step_begin asks before its clock starts, so that a step creates none).
extern "C" void mt_prof_cuda_reserve(int n) {
    if (n <= n_events) return;
    events = (cudaEvent_t *)mt_xrealloc(events, (size_t)n * sizeof *events);
    for (int i = n_events; i < n; i++) MT_CHECK_CUDA(cudaEventCreate(&events[i]));
    n_events = n;
}

extern "C" void mt_prof_cuda_record(void *stream, int index) {
    if (index >= n_events) mt_prof_cuda_reserve(2 * index + 1);  // more changes than the last step
    MT_CHECK_CUDA(cudaEventRecord(events[index], (cudaStream_t)stream));
}

extern "C" float mt_prof_cuda_elapsed(int from, int to) {
    float ms = 0.0f;
    MT_CHECK_CUDA(cudaEventElapsedTime(&ms, events[from], events[to]));
    return ms;
}

extern "C" void mt_prof_cuda_sync(void *stream) { MT_CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)stream)); }

// tests/cudasim names its device "... (cudasim: CPU-emulated)": its times are the host's.
extern "C" int mt_prof_cuda_emulated(void) {
    int dev = 0;
    cudaDeviceProp prop;
    MT_CHECK_CUDA(cudaGetDevice(&dev));
    MT_CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
    return strstr(prop.name, "cudasim") != NULL || strstr(prop.name, "CPU-emulated") != NULL;
}

extern "C" void mt_prof_cuda_free(void) {
    for (int i = 0; i < n_events; i++) MT_CHECK_CUDA(cudaEventDestroy(events[i]));
    free(events);
    events = NULL, n_events = 0;
}
