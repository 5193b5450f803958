// tests/cudasim/runtime.h — what the library stand-ins (cublaslt.cc, nccl.cc) use of the
// emulated runtime: its lock, the device-memory checks, and the streams.
#pragma once
#include <cuda_runtime.h>

#include <functional>

namespace cudasim {
void lib_enter();  // takes the runtime's lock (every stand-in entry point)
void lib_leave();
struct LibCall {
    LibCall() { lib_enter(); }
    ~LibCall() { lib_leave(); }
};
// Reports (and aborts) unless [p, p + n) lies inside one live device allocation.
void lib_check_device(const void *p, size_t n, const char *role);
// Makes the allocation holding p readable and writable until the running stream item ends
// (for memory a system call or another process reads: they get EFAULT, not a fault to catch).
void lib_open(const void *p);
// Queues fn on s under `name`; now: runs s up to and including it before returning.
void lib_enqueue(cudaStream_t s, const char *name, std::function<void()> fn, bool now);
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
}  // namespace cudasim
