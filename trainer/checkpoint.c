// trainer/checkpoint.c — complete-or-absent training checkpoints.
#include "trainer/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"

// Each weight through its backend's download (device memory on cuda).
static int fill_weight(void *ctx, size_t index, void *dst, size_t nbytes) {
    const mt_param *p = &((const mt_param *)ctx)[index];
    if (p->w->nbytes != nbytes) {
        mt_error_set("checkpoint: internal size mismatch for '%s'", p->name);
        return -1;
    }
    mt_tensor_download(p->w, dst);
    return 0;
}

static int save_trainables(const char *path, const mt_param *p, int n) {
    mt_st_entry *e = mt_xcalloc((size_t)(n ? n : 1), sizeof *e);
    for (int i = 0; i < n; i++) {
        e[i] = (mt_st_entry){.name = p[i].name, .dtype = mt_st_dtype_of(p[i].w->dtype), .ndim = p[i].w->ndim};
        memcpy(e[i].shape, p[i].w->shape, sizeof(int64_t) * (size_t)p[i].w->ndim);
    }
    int rc = mt_st_write(path, e, (size_t)n, "{\"format\":\"moetrain-trainables\"}", fill_weight, (void *)p);
    free(e);
    return rc;
}

static int load_trainables(const char *path, const mt_param *p, int n) {
    mt_st_file f;
    if (mt_st_file_open(&f, path) != 0) return -1;
    int rc = 0;
    if ((int)f.n_tensors != n) {
        mt_error_set("%s: %zu tensors where this run trains %d", path, f.n_tensors, n);
        rc = -1;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        const mt_st_tensor *t = mt_st_file_find(&f, p[i].name);
        if (!t || t->nbytes != p[i].w->nbytes || strcmp(t->dtype, mt_st_dtype_of(p[i].w->dtype)) != 0) {
            mt_error_set("%s: tensor '%s' is missing or differs in dtype or size", path, p[i].name);
            rc = -1;
        } else {
            mt_tensor_upload(p[i].w, t->data);
        }
    }
    mt_st_file_close(&f);
    return rc;
}

static int write_state(const char *path, const mt_train_state *st, const char *run_id, const char *dir) {
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)st->data_fingerprint);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", "moetrain-checkpoint");
    cJSON_AddNumberToObject(j, "version", 2);
    cJSON_AddNumberToObject(j, "step", (double)st->step);
    cJSON_AddNumberToObject(j, "epoch", (double)st->cursor.epoch);
    cJSON_AddNumberToObject(j, "index", (double)st->cursor.index);
    cJSON_AddNumberToObject(j, "skips", (double)st->skips);
    if (st->eval_loss == st->eval_loss) cJSON_AddNumberToObject(j, "eval_loss", st->eval_loss);
    cJSON_AddStringToObject(j, "data_fingerprint", fp);
    cJSON_AddStringToObject(j, "run", run_id);
    if (st->options) {  // [[key, value], ...] in the order given: --resume OUT replays them
        cJSON *opts = cJSON_AddArrayToObject(j, "options");
        for (int i = 0; i < st->options->n; i++) {
            const char *kv[2] = {st->options->kv[2 * i], st->options->kv[2 * i + 1]};
            cJSON_AddItemToArray(opts, cJSON_CreateStringArray(kv, 2));
        }
    }
    int rc = mt_ckpt_manifest_add(j, dir);
    char *text = rc ? NULL : mt_ckpt_state_seal(j);
    cJSON_Delete(j);
    if (!rc) rc = mt_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

int mt_ckpt_state_parse(const char *path, mt_train_state *st, char *run_id, size_t cap) {
    cJSON *j;
    if (mt_ckpt_state_read(path, &j) != 0) return -1;
    const cJSON *f = cJSON_GetObjectItem(j, "format"), *step = cJSON_GetObjectItem(j, "step"),
                *ep = cJSON_GetObjectItem(j, "epoch"), *ix = cJSON_GetObjectItem(j, "index"),
                *sk = cJSON_GetObjectItem(j, "skips"), *fp = cJSON_GetObjectItem(j, "data_fingerprint"),
                *run = cJSON_GetObjectItem(j, "run"), *el = cJSON_GetObjectItem(j, "eval_loss");
    int rc = -1;
    if (!cJSON_IsString(f) || strcmp(f->valuestring, "moetrain-checkpoint") != 0 || !cJSON_IsNumber(step) ||
        !cJSON_IsNumber(ep) || !cJSON_IsNumber(ix) || !cJSON_IsString(fp) || !cJSON_IsString(run) ||
        step->valuedouble < 0 || step->valuedouble > 9e15 || ep->valuedouble < 0 || ep->valuedouble > 9e15 ||
        ix->valuedouble < 0 || ix->valuedouble > 9e15)
        mt_error_set("%s: not a moetrain checkpoint state (format, step, epoch, index, data_fingerprint, run)", path);
    else {
        st->step = (int64_t)step->valuedouble;
        st->cursor.epoch = (int64_t)ep->valuedouble;
        st->cursor.index = (int64_t)ix->valuedouble;
        st->skips = cJSON_IsNumber(sk) && sk->valuedouble >= 0 && sk->valuedouble < 9e15 ? (int64_t)sk->valuedouble : 0;
        st->eval_loss = cJSON_IsNumber(el) ? el->valuedouble : NAN;
        st->data_fingerprint = strtoull(fp->valuestring, NULL, 16);
        snprintf(run_id, cap, "%s", run->valuestring);
        rc = 0;
    }
    cJSON_Delete(j);
    return rc;
}

int mt_ckpt_state_options(const char *dir, mt_opt_pairs *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/state.json", dir);
    cJSON *j;
    if (mt_ckpt_state_read(path, &j) != 0) return -1;
    const cJSON *opts = cJSON_GetObjectItem(j, "options"), *kv;
    int rc = cJSON_IsArray(opts) ? 0 : 1;
    cJSON_ArrayForEach(kv, opts) {
        const cJSON *k = cJSON_GetArrayItem(kv, 0), *v = cJSON_GetArrayItem(kv, 1);
        if (cJSON_GetArraySize(kv) != 2 || !cJSON_IsString(k) || !cJSON_IsString(v)) {
            mt_error_set("%s: \"options\" holds something other than [key, value] pairs", path);
            rc = -1;
            break;
        }
        mt_opt_pairs_add(out, k->valuestring, v->valuestring);
    }
    cJSON_Delete(j);
    return rc;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) fsync(fd), close(fd);
}

// A rank's file name: "trainables.safetensors" on one rank, "trainables-rank-00003-of-00008
// .safetensors" on several (each rank holds its own experts and its own ZeRO shard).
static void rank_file(char *buf, size_t n, const char *dir, const char *what, mt_comm *world) {
    if (!world || mt_comm_size(world) == 1)
        snprintf(buf, n, "%s/%s.safetensors", dir, what);
    else
        snprintf(buf, n, "%s/%s-rank-%05d-of-%05d.safetensors", dir, what, mt_comm_rank(world), mt_comm_size(world));
}

// Whether every rank got this far without an error (a no-op on one rank).
static int all_ok(mt_comm *world, int rc) { return world ? !mt_comm_any(world, rc != 0) : rc == 0; }

int mt_checkpoint_save(const char *out, const mt_param *w, int nw, const mt_param *p, int n, const mt_adamw *o,
                       const mt_train_state *st, const char *run_id, mt_comm *world) {
    char tmp[4200], final[4200], path[4400], name[64];
    int lead = !world || mt_comm_rank(world) == 0, multi = world && mt_comm_size(world) > 1;
    snprintf(name, sizeof name, "checkpoint-%lld", (long long)st->step);
    // Several ranks write into one folder: it carries rank 0's pid, so that a later start can
    // tell whether its writer is gone (mt_checkpoint_remove_stale).
    int32_t pid = (int32_t)getpid();
    if (multi) mt_comm_host_broadcast(world, &pid, 1, MT_COMM_I32, 0);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%d", out, name, (int)pid);
    snprintf(final, sizeof final, "%s/%s", out, name);
    int rc = 0;
    if (lead) {
        mt_remove_flat_dir(tmp);
        rc = mt_mkdir_p(tmp);
    }
    if (!all_ok(world, rc)) goto failed;
    rank_file(path, sizeof path, tmp, "trainables", world);
    rc = save_trainables(path, w, nw);
    rank_file(path, sizeof path, tmp, "optimizer", world);
    if (!rc) rc = mt_adamw_save(o, p, n, path);
    if (!all_ok(world, rc)) goto failed;
    if (lead) {
        snprintf(path, sizeof path, "%s/state.json", tmp);
        rc = write_state(path, st, run_id, tmp);
        if (!rc) {
            fsync_dir(tmp);
            mt_remove_flat_dir(final);  // a checkpoint of the same step written before (a resumed run)
            if (rename(tmp, final) != 0) {
                mt_error_set("%s: cannot rename into place: %s", final, strerror(errno));
                rc = -1;
            }
        }
        if (!rc) {
            fsync_dir(out);
            char latest[80];
            snprintf(path, sizeof path, "%s/latest", out);
            int len = snprintf(latest, sizeof latest, "%s\n", name);
            rc = mt_write_file_atomic(path, latest, (size_t)len);
        }
    }
    if (all_ok(world, rc)) return 0;
failed:
    if (rc == 0) mt_error_set("another rank failed to write its part");
    if (lead) mt_remove_flat_dir(tmp);
    mt_error_prefix("saving checkpoint %s", final);
    return -1;
}

static int is_checkpoint(const char *dir) {
    char path[4500];
    snprintf(path, sizeof path, "%s/state.json", dir);
    return access(path, R_OK) == 0;
}

int mt_checkpoint_find(const char *path, char *dir) {
    if (is_checkpoint(path)) {
        snprintf(dir, 4096, "%s", path);
        return 0;
    }
    char latest[4400], *text;
    size_t len;
    snprintf(latest, sizeof latest, "%s/latest", path);
    if (mt_read_file(latest, 4096, &text, &len) == 0) {
        text[strcspn(text, "\r\n")] = 0;
        int ok = text[0] && !strchr(text, '/') && strncmp(text, "checkpoint-", 11) == 0;
        snprintf(dir, 4096, "%s/%s", path, text);
        free(text);
        if (ok && is_checkpoint(dir)) return 0;
        mt_warn("%s does not name a complete checkpoint; using the newest one", latest);
    }
    DIR *d = opendir(path);
    if (!d) {
        mt_error_set("%s: not a checkpoint or output folder: %s", path, strerror(errno));
        return -1;
    }
    long long best = -1;
    struct dirent *e;
    char cand[4300];
    while ((e = readdir(d))) {
        long long step;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%lld%c", &step, &tail) != 1) continue;  // skips .tmp folders
        snprintf(cand, sizeof cand, "%s/%s", path, e->d_name);
        if (step > best && is_checkpoint(cand)) best = step;
    }
    closedir(d);
    if (best < 0) {
        mt_error_set("%s: no complete checkpoint to resume from", path);
        return -1;
    }
    snprintf(dir, 4096, "%s/checkpoint-%lld", path, best);
    return 0;
}

int mt_train_state_check(const mt_train_state *st, const mt_dataset *d, int64_t total_steps, const char *dir) {
    if (st->cursor.epoch < 0 || st->cursor.index < 0 || st->cursor.index >= d->n) {
        mt_error_set("%s: its data position (epoch %lld, sample %lld) is past the %lld samples of %s",
                     dir, (long long)st->cursor.epoch, (long long)st->cursor.index, (long long)d->n, d->source);
        return -1;
    }
    if (st->step > total_steps) {
        mt_error_set("%s is at step %lld, past this run's %lld steps: nothing left to train (raise --steps "
                     "or --epochs)", dir, (long long)st->step, (long long)total_steps);
        return -1;
    }
    return 0;
}

int mt_checkpoint_load(const char *dir, const mt_param *w, int nw, const mt_param *p, int n, mt_adamw *o,
                       mt_train_state *st, const char *run_id, mt_comm *world) {
    char path[4400], saved_run[2048];
    snprintf(path, sizeof path, "%s/state.json", dir);
    if (mt_ckpt_state_parse(path, st, saved_run, sizeof saved_run) != 0) return -1;
    if (strcmp(saved_run, run_id) != 0) {
        mt_error_set("%s was written by a different run and cannot be resumed by this one:\n  saved: %s\n  now:   %s",
                     dir, saved_run, run_id);
        return -1;
    }
    const char *what[] = {"trainables", "optimizer"};
    for (int i = 0; i < 2; i++) {  // the files this rank loads must be among those verified
        rank_file(path, sizeof path, "", what[i], world);
        if (mt_checkpoint_lists(dir, path + 1) != 0) return -1;
    }
    rank_file(path, sizeof path, dir, "trainables", world);
    if (load_trainables(path, w, nw) != 0) return -1;
    rank_file(path, sizeof path, dir, "optimizer", world);
    return mt_adamw_load(o, p, n, path);
}
