// core/threads.h — how the program's OpenMP threads wait, and how many a step takes (one
// libgomp pool: OpenBLAS is linked in its OpenMP build, scripts/configure.sh).
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

// ---------------------------------------------------------------------------------------------
// A thread count that follows the machine's load
//
// On a machine where other processes want the cores, a team as wide as the machine loses: the
// step is many short parallel regions, and each one's barrier waits for the thread the kernel
// preempted for a whole time slice (tiny's LoRA step at seq 128 beside one CPU burner on 2 cores:
// 0.15–0.69 of its quiet speed with 2 threads, ~1.0 with 1). So before each step (and eval or
// generate batch) the program takes the cores nobody else is using. Results do not change with
// the count: every GEMM goes through core/gemm.h, and the OpenMP loops have no reduction whose
// order depends on the threads (tests/test_train.c checks a step's bits at 1, 2 and 3 threads).

// n = clamp(cpus − others, 1, max), others = running − 1: the runnable tasks of the machine but
// the caller itself (running as counted by /proc/loadavg while our other threads sleep). A
// running count below 1 counts as 1.
int mt_threads_choose(int cpus, int running, int max);

// The running count of a /proc/loadavg line ("0.52 0.58 0.59 3/467 12345": 3), or −1 when the
// line does not have that form.
int mt_loadavg_running(const char *line);

// Chooses the thread count for the next step from /proc/loadavg and the CPUs this process may
// run on, and sets it (omp_set_num_threads); returns it. `max` is the thread count the program
// started with (OMP_NUM_THREADS, or libgomp's default of one a CPU). When the user set
// OMP_NUM_THREADS, or /proc/loadavg cannot be read or parsed, the count is max. Also counts the
// choices for mt_threads_chosen. 1 in a build without OpenMP.
int mt_threads_adapt(void);

// How many times mt_threads_adapt chose each count since the process started: counts[n] for n
// in [1, MT_THREADS_COUNTED) (larger counts are added to the last). counts[0] is unused.
enum { MT_THREADS_COUNTED = 17 };
void mt_threads_chosen(long long counts[MT_THREADS_COUNTED]);

// The thread count the program started with (OMP_NUM_THREADS, or one a CPU), whatever
// mt_threads_adapt chose since: what core/gemm.c cuts a product for. 1 without OpenMP.
int mt_threads_started(void);

// The threads a parallel region gets, and this thread's index in its region (0 outside one):
// 1 and 0 in a build without OpenMP (the fuzzers').
int mt_threads_max(void);
int mt_thread_index(void);
