// core/threads.h — how the program's OpenMP threads wait (one libgomp pool: OpenBLAS is linked
// in its OpenMP build, scripts/configure.sh).
#pragma once

// Makes OMP_WAIT_POLICY=passive the default: when the user set neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT, sets OMP_WAIT_POLICY=passive and re-executes the program (argv as given) so
// that libgomp, which reads its environment in a constructor before main, sees it. Returns
// (having changed nothing else) when either is set or the exec fails. Call first thing in main.
//
// Why passive: libgomp's default spins up to 300,000 iterations at every barrier and idle point
// before it sleeps. On a machine where another process wants the cores, the spinning threads
// take the time slices the working thread needs: `moetrain demo` ran ~35x slower beside other
// jobs, a LoRA step at seq 128 ~4–8x slower (issue 17; scripts/bench.c's busy-machine case
// measures it on every `make bench`). Sleeping at once costs a futex wake per region, which the
// same measurements show to be lost in the noise on a quiet machine.
void mt_threads_init(char **argv);

// The threads a parallel region gets, and this thread's index in its region (0 outside one):
// 1 and 0 in a build without OpenMP (the fuzzers').
int mt_threads_max(void);
int mt_thread_index(void);
