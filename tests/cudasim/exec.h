// tests/cudasim/exec.h — what the parts of cudasim share (not seen by the emulated .cu files).
#pragma once
#include "cudasim.h"

namespace cudasim {

enum { RUN, AT_BLOCK, AT_WARP, DONE };
enum { ORDER_FORWARD, ORDER_REVERSE, ORDER_RANDOM };
enum { SMEM_DEFAULT_MAX = 48 << 10, SMEM_OPTIN_MAX = 227 << 10 };

extern const char *cur_kernel;  // the kernel running, for reports
extern const char *cur_call;    // the runtime call running, for reports
void vreport(const char *fmt, va_list ap);
int order_kind();

// exec.cc: runs every block of a grid (the launch was checked by the runtime).
void run_grid(const char *name, const Cfg &c, const std::function<void()> &body);
bool in_smem(const void *p);
char *smem_base();
size_t smem_used();

// race.cc: the shared-memory race detector (CUDASIM_RACECHECK=1), told about barriers.
bool race_enabled();
void race_kernel_begin();
void race_kernel_end();
void race_block_begin(int nthreads);  // before the arena is refilled
void race_block_arm();                // after
void race_block_sync();
void race_warp_sync(int base, unsigned mask);
void race_thread_exit();
bool race_fault(void *addr, bool write, void *uctx);  // SIGSEGV in the arena: recorded
bool race_trap(void *uctx);                           // SIGTRAP after the single step
// Lets the faulting instruction of uctx run once (the caller opened the memory), then after(arg).
void step_over(void *uctx, void (*after)(void *), void *arg);

}  // namespace cudasim
