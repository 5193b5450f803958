// tests/mpi/mpi_fail.c — failures that must end the whole job quickly, never hang it.
// `mpirun -np N mpi_fail MODE`; tests/mpi/run.sh checks the exit code, the time and the message.
//   early     rank 1 calls exit(4) before mt_comm_init, while the others start their communicator
//   exit      rank 1 calls exit(3) before a collective the others are in (deadline off)
//   kill      rank 1 is killed by SIGKILL before it (deadline off)
//   stall     rank 1 sleeps before it; the others pass MT_COMM_TIMEOUT and abort
//   mismatch  the last rank passes another hash to mt_comm_check_same: every rank refuses
//   check     MT_COMM_CHECK=1: rank 0 calls all_reduce where the others call broadcast
//   counts    MT_COMM_CHECK=1: the last rank expects a row count that rank 0 does not send
//   abort     rank 0 calls mt_comm_abort(world, 7, ...) while the others wait in a barrier
// Reaching the end prints "survived" and exits 0, which run.sh counts as a failure.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/common.h"

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    const char *launcher_rank = getenv("OMPI_COMM_WORLD_RANK");
    if (strcmp(mode, "early") == 0 && launcher_rank && atoi(launcher_rank) == 1) {
        fprintf(stderr, "rank 1: leaving before the communicator exists\n");
        exit(4);
    }
    mt_comm *w = mt_comm_init(MT_COMM_AUTO, NULL);
    if (!w) mt_fatal(MT_EXIT_ERROR, "%s", mt_error_get());
    int me = mt_comm_rank(w), n = mt_comm_size(w);
    float x[64] = {0};
    mt_comm_all_reduce(w, x, 64, MT_COMM_F32, MT_COMM_SUM, 0);  // one completes first

    if (strcmp(mode, "early") == 0) {
        mt_comm_set_timeout(w, 0);
        mt_comm_all_reduce(w, x, 64, MT_COMM_F32, MT_COMM_SUM, 0);
    } else if (strcmp(mode, "exit") == 0 || strcmp(mode, "kill") == 0) {
        mt_comm_set_timeout(w, 0);  // what ends the job must be the launcher, not the deadline
        if (me == 1) {
            fprintf(stderr, "rank 1: leaving by %s\n", mode);
            if (mode[0] == 'e') exit(3);
            raise(SIGKILL);
        }
        mt_comm_all_reduce(w, x, 64, MT_COMM_F32, MT_COMM_SUM, 0);
    } else if (strcmp(mode, "stall") == 0) {
        if (me == 1) sleep(120);
        mt_comm_all_reduce(w, x, 64, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
    } else if (strcmp(mode, "mismatch") == 0) {
        if (mt_comm_check_same(w, "config", me == n - 1 ? 0xbad : 0x600d) != 0)
            mt_fatal(MT_EXIT_ERROR, "%s", mt_error_get());
    } else if (strcmp(mode, "check") == 0) {
        if (me == 0) mt_comm_all_reduce(w, x, 10, MT_COMM_F32, MT_COMM_SUM, 0);
        else mt_comm_broadcast(w, x, 10, MT_COMM_F32, 0, 0);
    } else if (strcmp(mode, "counts") == 0) {
        int64_t s[64] = {0}, r[64] = {0};
        s[n - 1] = 2;  // every rank sends 2 rows to the last one
        mt_comm_all_to_all_counts(w, s, r);
        if (me == n - 1) r[0] = 3;
        mt_comm_all_to_all_v(w, x, s, x + 16, r, 4, MT_COMM_F32, 0);
    } else if (strcmp(mode, "abort") == 0) {
        if (me == 0) mt_comm_abort(w, 7, "rank-local failure (test)");
        mt_comm_barrier(w);
    } else {
        fprintf(stderr, "mpi_fail: unknown mode '%s'\n", mode);
        return 2;
    }
    printf("rank %d: survived %s\n", me, mode);
    mt_comm_free(w);
    return 0;
}
