// tests/cudasim/race.cc — placeholder until the race detector lands.
#include "exec.h"
namespace cudasim {
bool race_enabled() { return false; }
void race_kernel_begin() {}
void race_kernel_end() {}
void race_block_begin(int) {}
void race_block_sync() {}
void race_warp_sync(int, unsigned) {}
void race_thread_exit() {}
bool race_fault(void *, bool, void *) { return false; }
bool race_trap(void *) { return false; }
}  // namespace cudasim
