// What an output folder keeps: at most --save-total-limit checkpoints, the newest and the best
// (lowest eval loss) always among them; no temporary debris of dead processes once a run starts,
// even after SIGKILLs at random moments.
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "trainer/checkpoint.h"
#include "tests/test_util.h"

// A checkpoint folder whose sealed state.json records eval_loss (NaN: none).
static void fake_ckpt(const char *out, int step, double eval_loss) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", out, step);
    cr_assert_eq(mt_mkdir_p(dir), 0);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", 2);
    cJSON_AddNumberToObject(j, "step", step);
    if (eval_loss == eval_loss) cJSON_AddNumberToObject(j, "eval_loss", eval_loss);
    cJSON_AddObjectToObject(j, "files");
    char *text = mt_ckpt_state_seal(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/state.json", dir);
    cr_assert_eq(mt_write_file_atomic(path, text, strlen(text)), 0);
    free(text);
}

static int has(const char *out, const char *name) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", out, name);
    return access(p, F_OK) == 0;
}

// Names in `out` that are temporaries (".tmp", ".del") and checkpoint-N folders.
static void census(const char *out, int *temps, int *ckpts, char *names, size_t cap) {
    *temps = *ckpts = 0;
    names[0] = 0;
    DIR *d = opendir(out);
    cr_assert(d, "%s", out);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strstr(e->d_name, ".tmp") || strstr(e->d_name, ".del")) {
            ++*temps;
            snprintf(names + strlen(names), cap - strlen(names), "%s ", e->d_name);
        }
        long long s;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%lld%c", &s, &tail) == 1) ++*ckpts;
    }
    closedir(d);
}

Test(checkpoint_retention, keeps_the_newest_and_the_best_within_the_limit) {
    char tmp[64];
    mt_test_tmpdir(tmp, sizeof tmp);
    fake_ckpt(tmp, 1, 3.0);
    fake_ckpt(tmp, 2, 1.5);  // the best
    fake_ckpt(tmp, 3, 2.0);
    fake_ckpt(tmp, 4, NAN);
    fake_ckpt(tmp, 5, 2.5);
    fake_ckpt(tmp, 10, NAN);  // the newest (numerically, not by name)
    mt_checkpoint_prune(tmp, 0);
    int temps, ckpts;
    char names[1024];
    census(tmp, &temps, &ckpts, names, sizeof names);
    cr_assert_eq(ckpts, 6, "limit 0 keeps everything");
    mt_checkpoint_prune(tmp, 3);
    cr_assert(has(tmp, "checkpoint-10") && has(tmp, "checkpoint-2") && has(tmp, "checkpoint-5"));
    census(tmp, &temps, &ckpts, names, sizeof names);
    cr_assert_eq(ckpts, 3);
    cr_assert_eq(temps, 0, "%s", names);
    mt_checkpoint_prune(tmp, 1);  // HF's rule: the best survives a limit of 1 beside the newest
    cr_assert(has(tmp, "checkpoint-10") && has(tmp, "checkpoint-2") && !has(tmp, "checkpoint-5"));
    mt_test_rmrf(tmp);
}

Test(checkpoint_retention, removes_the_debris_of_dead_processes_only) {
    char tmp[64], p[600];
    mt_test_tmpdir(tmp, sizeof tmp);
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);  // its pid now names no process
    int live = (int)getppid();
    const char *forms[] = {"%s/.checkpoint-7.tmp-%d", "%s/.checkpoint-3.del-%d", "%s/latest.tmp.%d"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, forms[i], tmp, (int)dead);
        if (i < 2) {
            cr_assert_eq(mt_mkdir_p(p), 0);
            strcat(p, "/trainables.safetensors");
        }
        cr_assert_eq(mt_write_file_atomic(p, "x", 1), 0);
        snprintf(p, sizeof p, forms[i], tmp, live);
        cr_assert_eq(i < 2 ? mt_mkdir_p(p) : mt_write_file_atomic(p, "x", 1), 0);
    }
    fake_ckpt(tmp, 7, NAN);
    cr_assert_eq(mt_checkpoint_remove_stale(tmp), 3);
    int temps, ckpts;
    char names[1024];
    census(tmp, &temps, &ckpts, names, sizeof names);
    cr_assert_eq(temps, 3, "those of a live process stay: %s", names);
    cr_assert_eq(ckpts, 1);
    snprintf(p, sizeof p, ".checkpoint-7.tmp-%d", (int)dead);
    cr_assert(!has(tmp, p));
    mt_test_rmrf(tmp);
}

static long long latest_mtime(const char *out) {
    char p[600];
    struct stat st;
    snprintf(p, sizeof p, "%s/latest", out);
    return stat(p, &st) == 0 ? (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec : -1;
}

Test(checkpoint_retention, sigkills_at_random_moments_leave_no_debris_and_at_most_n_checkpoints) {
    char tmp[64], model[128], data[128], out[160], log[8192];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 48), 0);
    // Every run saves every step and keeps 2; each is killed (SIGKILL) after a delay from a fixed
    // sequence (often inside a save), then the next one resumes where the last verified checkpoint is.
    const int kills = 8;
    unsigned seed = 12345;
    for (int k = 0; k <= kills; k++) {
        char cmd[2048];
        seed = seed * 1103515245u + 12345u;
        int ms = (int)((seed >> 8) % 1200);
        int resume = has(out, "latest");
        long long before = latest_mtime(out);
        snprintf(cmd, sizeof cmd,
                 "exec %s --model %s --data %s --mode lora --r 64 --quant none --seq 24 --batch 2 --steps %d --save-every 1 "
                 "--save-total-limit 2 --schedule constant --out %s %s%s > %s/run%d.log 2>&1",
                 MT_TEST_BIN, model, data, k < kills ? 100000 : 0, out, resume ? "--resume " : "--overwrite", resume ? out : "",
                 tmp, k);
        if (k == kills) {  // the last run finishes: one more step after the checkpoint it resumes
            char *l;
            size_t len;
            cr_assert_eq(mt_read_file(strcat(strcpy(log, out), "/latest"), 4096, &l, &len), 0);
            long long step = atoll(l + 11);
            free(l);
            snprintf(cmd, sizeof cmd,
                     "%s --model %s --data %s --mode lora --r 64 --quant none --seq 24 --batch 2 --steps %lld "
                     "--save-every 1 --save-total-limit 2 --schedule constant --out %s --resume %s --resume-override "
                     "> %s/final.log 2>&1",
                     MT_TEST_BIN, model, data, step + 1, out, out, tmp);
            int rc = system(cmd);
            snprintf(log, sizeof log, "%s/final.log", tmp);
            char *text;
            size_t len2;
            mt_read_file(log, 1 << 20, &text, &len2);
            cr_assert_eq(rc, 0, "%s", text);
            free(text);
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        // after this run's first save (a new `latest`), so that the kill lands among steps and saves
        for (int waited = 0; waited < 3000 && latest_mtime(out) == before; waited++) usleep(10000);
        if (k % 2) {
            usleep((useconds_t)ms * 1000);
        } else {  // every other kill inside a save, while its temporary folder exists
            int temps = 0, ckpts;
            char names[1024];
            for (int waited = 0; waited < 5000 && !temps; waited++) {
                census(out, &temps, &ckpts, names, sizeof names);
                if (!temps) usleep(500);
            }
        }
        kill(pid, SIGKILL);  // the shell exec'd moetrain: pid is moetrain itself
        waitpid(pid, NULL, 0);
    }
    int temps, ckpts;
    char names[1024];
    census(out, &temps, &ckpts, names, sizeof names);
    cr_assert_eq(temps, 0, "debris after the next run started: %s", names);
    cr_assert_leq(ckpts, 2, "%d checkpoints with --save-total-limit 2", ckpts);
    cr_assert_eq(mt_test_run(log, sizeof log, "verify %s", out), 0, "%s", log);
    mt_test_rmrf(tmp);
}
