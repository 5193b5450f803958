// core/threads.c — the OpenMP wait policy default and thread counts (see threads.h).
#include "core/threads.h"

#include "core/common.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void mt_threads_init(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    // The exec failed (no /proc): libgomp keeps the policy it started with; nothing else changed.
}

int mt_threads_max(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int mt_thread_index(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

int mt_threads_choose(int cpus, int running, int max) {
    int others = running > 1 ? running - 1 : 0, n = cpus - others;
    if (n > max) n = max;
    return n < 1 ? 1 : n;
}

int mt_loadavg_running(const char *line) {
    double l1, l5, l15;
    int running, total;
    if (sscanf(line, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) != 5 || running < 0 || total < running)
        return -1;
    return running;
}

static long long threads_chosen[MT_THREADS_COUNTED];

#ifdef _OPENMP
// The CPUs this process may run on (its affinity mask), at least 1.
static int cpus_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return (int)MT_MAX(1, sysconf(_SC_NPROCESSORS_ONLN));
    return MT_MAX(1, CPU_COUNT(&set));
}

// This process's threads that are runnable now (their state R in /proc/self/task/*/stat), the
// caller among them; 1 when that cannot be read.
static int own_running(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return 1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%.20s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        const char *p = strrchr(buf, ')');  // the state follows the command name, which may hold ')'
        n += p && p[1] == ' ' && p[2] == 'R';
    }
    closedir(d);
    return n > 0 ? n : 1;
}

// The running count of /proc/loadavg now, our own threads counted as the caller alone (a team
// thread still finishing the last region, the loader's, would otherwise read as another
// process's: idle, a step then took 1 thread every other time), or −1.
static int running_now(void) {
    char line[256];
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return -1;
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    int running = ok ? mt_loadavg_running(line) : -1;
    return running < 0 ? -1 : running - (own_running() - 1);
}
#endif

// The thread count the program started with, taken before main (libgomp, a shared library, is
// initialised first) and before anything adapts it.
static int started = 1;
#ifdef _OPENMP
__attribute__((constructor)) static void take_started(void) { started = omp_get_max_threads(); }
#endif

int mt_threads_started(void) { return started; }

int mt_threads_adapt(void) {
#ifdef _OPENMP
    int max = started, n = max;
    if (!getenv("OMP_NUM_THREADS")) {
        // The least of the last RECENT samples: a process that wants a core shows in every one;
        // a kernel thread's blip (this VM's kdamond was runnable at a third of the step
        // boundaries of an idle machine) in few, and costs no thread.
        enum { RECENT = 6 };
        static int recent[RECENT], seen;
        int running = running_now();
        if (running >= 0) {
            recent[seen++ % RECENT] = running;
            for (int i = 0; i < MT_MIN(seen, RECENT); i++) running = MT_MIN(running, recent[i]);
            n = mt_threads_choose(cpus_allowed(), running, max);
        }
    }
    omp_set_num_threads(n);
#else
    int n = 1;
#endif
    threads_chosen[MT_MIN(n, MT_THREADS_COUNTED - 1)]++;
    return n;
}

void mt_threads_chosen(long long counts[MT_THREADS_COUNTED]) {
    for (int i = 0; i < MT_THREADS_COUNTED; i++) counts[i] = threads_chosen[i];
}
