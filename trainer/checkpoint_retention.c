// trainer/checkpoint_retention.c — what an output folder keeps: at most --save-total-limit
// checkpoints (the newest and the best always), and no debris of processes that died.
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "trainer/checkpoint.h"

typedef struct { long long step; double eval_loss; } kept;

static int by_step_desc(const void *a, const void *b) {
    long long x = ((const kept *)a)->step, y = ((const kept *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

// The eval loss recorded in a checkpoint's state.json, NaN when none (or unreadable).
static double eval_loss_of(const char *dir) {
    char path[4500];
    snprintf(path, sizeof path, "%s/state.json", dir);
    cJSON *j;
    double v = NAN;
    if (mt_ckpt_state_read(path, &j) == 0) {
        const cJSON *el = cJSON_GetObjectItemCaseSensitive(j, "eval_loss");
        if (cJSON_IsNumber(el)) v = el->valuedouble;
        cJSON_Delete(j);
    }
    mt_error_clear();
    return v;
}

void mt_checkpoint_prune(const char *out, int64_t limit) {
    if (limit <= 0) return;
    DIR *d = opendir(out);
    if (!d) return;
    kept *c = NULL;
    int n = 0;
    struct dirent *e;
    char dir[4400];
    while ((e = readdir(d))) {
        long long step;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%lld%c", &step, &tail) != 1 || step < 0) continue;
        c = mt_xrealloc(c, (size_t)(n + 1) * sizeof *c);
        c[n++] = (kept){step, NAN};
    }
    closedir(d);
    if (n <= limit) {
        free(c);
        return;
    }
    qsort(c, (size_t)n, sizeof *c, by_step_desc);
    int best = -1;
    for (int i = 0; i < n; i++) {
        snprintf(dir, sizeof dir, "%s/checkpoint-%lld", out, c[i].step);
        c[i].eval_loss = eval_loss_of(dir);
        if (c[i].eval_loss == c[i].eval_loss && (best < 0 || c[i].eval_loss < c[best].eval_loss)) best = i;
    }
    // the newest (i = 0) and the best, then the newest others up to the limit
    int64_t room = limit - 1 - (best > 0);
    for (int i = 1; i < n; i++) {
        if (i == best) continue;
        if (room > 0) {
            room--;
            continue;
        }
        char doomed[4400];
        snprintf(dir, sizeof dir, "%s/checkpoint-%lld", out, c[i].step);
        snprintf(doomed, sizeof doomed, "%s/.checkpoint-%lld.del-%d", out, c[i].step, (int)getpid());
        // renamed first: a kill while removing leaves debris that the next start clears, never a
        // half-removed checkpoint-N that looks complete
        if (rename(dir, doomed) == 0) mt_remove_flat_dir(doomed);
        else mt_warn("%s: cannot remove old checkpoint: %s", dir, strerror(errno));
    }
    free(c);
}

// The pid in a temporary name: ".checkpoint-N.tmp-PID", ".checkpoint-N.del-PID", "NAME.tmp.PID".
static long pid_in_name(const char *name) {
    const char *p = NULL;
    if (name[0] == '.' && strncmp(name, ".checkpoint-", 12) == 0) {
        p = strstr(name, ".tmp-");
        if (!p) p = strstr(name, ".del-");
        if (p) p += 5;
    } else if ((p = strstr(name, ".tmp."))) {
        p += 5;
    }
    if (!p || !*p) return -1;
    char *end;
    long pid = strtol(p, &end, 10);
    return *end || pid <= 0 ? -1 : pid;
}

int mt_checkpoint_remove_stale(const char *out) {
    DIR *d = opendir(out);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d))) {
        long pid = pid_in_name(e->d_name);
        if (pid < 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
        snprintf(path, sizeof path, "%s/%s", out, e->d_name);
        mt_remove_flat_dir(path);
        removed++;
    }
    closedir(d);
    if (removed) mt_info("removed %d temporary file%s left in %s by processes that no longer run", removed,
                         removed == 1 ? "" : "s", out);
    return removed;
}
