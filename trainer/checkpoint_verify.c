// trainer/checkpoint_verify.c — checkpoints that prove their integrity.
//
// state.json lists every file of its checkpoint with its size and SHA-256 and ends with the
// SHA-256 of its own bytes up to that field:
//   { "format": ..., "step": ..., ..., "files": {"trainables.safetensors": {"size": N,
//     "sha256": "..."}, ...},
//     "sha256": "<SHA-256 of every byte before this value's opening quote>"
//   }
// The file must end exactly with that field, so no byte of it (step, data position, run options,
// the file list, the digest, the closing brace) can change without the check failing.
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/sha256.h"
#include "trainer/checkpoint.h"

#define SEAL_KEY "\"sha256\":\t\""
#define SEAL_END "\"\n}\n"
#define STATE_MAX (1 << 20)

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int mt_ckpt_manifest_add(cJSON *state, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        mt_error_set("%s: cannot list: %s", dir, strerror(errno));
        return -1;
    }
    // sorted names, so that the manifest does not depend on the directory's order
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "state.json") == 0) continue;
        if (n == cap) names = mt_xrealloc(names, (cap = cap ? 2 * cap : 8) * sizeof *names);
        names[n++] = mt_xstrdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    cJSON *files = cJSON_AddObjectToObject(state, "files");
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4400], hex[65];
        uint64_t size;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (rc == 0 && mt_sha256_file(path, hex, &size) != 0) rc = -1;
        if (rc == 0) {
            cJSON *f = cJSON_AddObjectToObject(files, names[i]);
            cJSON_AddNumberToObject(f, "size", (double)size);
            cJSON_AddStringToObject(f, "sha256", hex);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

char *mt_ckpt_state_seal(const cJSON *state) {
    char *body = cJSON_Print(state);  // "{\n\t...\n}"
    size_t len = strlen(body);
    if (len < 2 || body[len - 1] != '}') mt_fatal(MT_EXIT_ERROR, "checkpoint: unexpected JSON text");
    len--;
    while (len && body[len - 1] == '\n') len--;
    const char *sep = state->child ? ",\n\t" : "\n\t";  // after the last member, or after "{"
    size_t klen = strlen(sep) + strlen(SEAL_KEY), elen = strlen(SEAL_END);
    char *text = mt_xmalloc(len + klen + 64 + elen + 1);
    memcpy(text, body, len);
    snprintf(text + len, klen + 1, "%s%s", sep, SEAL_KEY);
    free(body);
    mt_sha256_hex(text, len + klen, text + len + klen);
    memcpy(text + len + klen + 64, SEAL_END, elen + 1);
    return text;
}

// 0 when `text` ends with its own valid seal; -1 with an error naming `path`; 1 when it carries
// no seal at all (a version-1 checkpoint, written before checksums).
static int state_unseal(const char *text, size_t len, const char *path) {
    size_t klen = strlen(SEAL_KEY), elen = strlen(SEAL_END);
    if (len < klen + 64 + elen || memcmp(text + len - elen, SEAL_END, elen) != 0 ||
        memcmp(text + len - elen - 64 - klen, SEAL_KEY, klen) != 0) {
        if (!strstr(text, "\"sha256\"") && strstr(text, "\"version\":\t1,")) return 1;
        mt_error_set("%s: no valid checksum at its end (truncated or edited)", path);
        return -1;
    }
    char hex[65];
    size_t body = len - elen - 64;
    mt_sha256_hex(text, body, hex);
    if (memcmp(hex, text + body, 64) != 0) {
        mt_error_set("%s: checksum mismatch: its content (step, data position, options, file list) was "
                     "changed or damaged", path);
        return -1;
    }
    return 0;
}

// Exactly what version 1 wrote: those keys and no other, "version" 1.
static int legacy_state(const cJSON *j) {
    static const char *const keys[] = {"format", "version", "step", "epoch", "index", "skips", "data_fingerprint", "run"};
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "version"), *e;
    if (!cJSON_IsObject(j) || !cJSON_IsNumber(v) || v->valuedouble != 1) return 0;
    cJSON_ArrayForEach(e, j) {
        size_t i = 0;
        while (i < MT_ARRAY_LEN(keys) && strcmp(e->string, keys[i]) != 0) i++;
        if (i == MT_ARRAY_LEN(keys)) return 0;
    }
    return 1;
}

int mt_ckpt_state_read(const char *path, cJSON **out) {
    char *text;
    size_t len;
    *out = NULL;
    if (mt_read_file(path, STATE_MAX, &text, &len) != 0) return -1;
    int sealed = strlen(text) == len ? state_unseal(text, len, path) : -1;
    if (sealed < 0 && strlen(text) != len) mt_error_set("%s: holds a NUL byte", path);
    if (sealed >= 0 && !(*out = cJSON_ParseWithLength(text, len))) {
        mt_error_set("%s: not valid JSON", path);
        sealed = -1;
    }
    if (sealed == 1 && !legacy_state(*out)) {  // e.g. a sealed file whose seal was damaged
        mt_error_set("%s: no valid checksum at its end (truncated or edited)", path);
        cJSON_Delete(*out);
        *out = NULL;
        sealed = -1;
    }
    if (sealed == 1) mt_warn("%s: written before checkpoints carried checksums: not verified", path);
    free(text);
    return sealed < 0 ? -1 : 0;
}

// One manifest entry against the file on disk.
static int check_file(const char *dir, const cJSON *entry) {
    const char *name = entry->string;
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(entry, "size"),
                *sha = cJSON_GetObjectItemCaseSensitive(entry, "sha256");
    char path[4400], hex[65];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!name[0] || strchr(name, '/') || !strcmp(name, "..") || !cJSON_IsNumber(size) || !cJSON_IsString(sha) ||
        strlen(sha->valuestring) != 64) {
        mt_error_set("%s/state.json: file entry '%s' is malformed", dir, name);
        return -1;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        mt_error_set("%s: missing (%s)", path, strerror(errno));
        return -1;
    }
    if ((double)st.st_size != size->valuedouble) {
        mt_error_set("%s: size %lld bytes, but the checkpoint recorded %.0f", path, (long long)st.st_size,
                     size->valuedouble);
        return -1;
    }
    uint64_t got;
    if (mt_sha256_file(path, hex, &got) != 0) return -1;
    if (strcmp(hex, sha->valuestring) != 0) {
        mt_error_set("%s: SHA-256 mismatch (recorded %.12s…, found %.12s…): the data is damaged", path,
                     sha->valuestring, hex);
        return -1;
    }
    return 0;
}

int mt_checkpoint_verify(const char *dir, int verbose) {
    char path[4400];
    snprintf(path, sizeof path, "%s/state.json", dir);
    cJSON *j;
    if (mt_ckpt_state_read(path, &j) != 0) return -1;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    int rc = 0;
    if (!files) {
        // version 1: nothing recorded to check the files against
    } else if (!cJSON_IsObject(files) || !files->child) {
        mt_error_set("%s: \"files\" lists no file", path);
        rc = -1;
    } else {
        const cJSON *e;
        cJSON_ArrayForEach(e, files) {
            if ((rc = check_file(dir, e)) != 0) break;
            if (verbose) printf("  ok  %s (%.0f bytes)\n", e->string, cJSON_GetObjectItem(e, "size")->valuedouble);
        }
    }
    cJSON_Delete(j);
    return rc;
}

int mt_checkpoint_lists(const char *dir, const char *file) {
    char path[4400];
    snprintf(path, sizeof path, "%s/state.json", dir);
    cJSON *j;
    if (mt_ckpt_state_read(path, &j) != 0) return -1;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    int rc = !files || cJSON_GetObjectItemCaseSensitive(files, file) ? 0 : -1;
    if (rc) mt_error_set("%s: does not list %s (a checkpoint of another world size?)", path, file);
    cJSON_Delete(j);
    return rc;
}

// Candidates for --resume OUT, best first: the one `latest` names, then every other
// checkpoint-N by falling N. Fills names[] (malloc'd), returns their count.
static int candidates(const char *out, char ***names_out) {
    char first[4096] = "", **names = NULL;
    int n = 0, cap = 0;
    if (mt_checkpoint_find(out, first) == 0) {
        names = mt_xrealloc(names, (size_t)(cap = 8) * sizeof *names);
        names[n++] = mt_xstrdup(first);
    }
    DIR *d = opendir(out);
    long long *steps = NULL;
    int ns = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            long long step;
            char tail;
            if (sscanf(e->d_name, "checkpoint-%lld%c", &step, &tail) != 1 || step < 0) continue;
            steps = mt_xrealloc(steps, (size_t)(ns + 1) * sizeof *steps);
            steps[ns++] = step;
        }
        closedir(d);
    }
    for (int i = 0; i < ns; i++)  // falling order
        for (int j = i + 1; j < ns; j++)
            if (steps[j] > steps[i]) { long long t = steps[i]; steps[i] = steps[j]; steps[j] = t; }
    for (int i = 0; i < ns; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/checkpoint-%lld", out, steps[i]);
        if (n && strcmp(dir, names[0]) == 0) continue;
        if (n == cap) names = mt_xrealloc(names, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *names);
        names[n++] = mt_xstrdup(dir);
    }
    free(steps);
    *names_out = names;
    return n;
}

int mt_checkpoint_find_verified(const char *path, char *dir) {
    char state[4400];
    snprintf(state, sizeof state, "%s/state.json", path);
    if (access(state, F_OK) == 0) {  // a checkpoint folder named itself: that one or nothing
        if (mt_checkpoint_verify(path, 0) != 0) {
            mt_error_prefix("%s does not verify: not resuming from it", path);
            return -1;
        }
        snprintf(dir, 4096, "%s", path);
        return 0;
    }
    char **names;
    int n = candidates(path, &names), found = -1;
    for (int i = 0; i < n && found < 0; i++) {
        if (mt_checkpoint_verify(names[i], 0) == 0) found = i;
        else mt_warn("%s does not verify: %s", names[i], mt_error_get());
    }
    if (found > 0) mt_warn("falling back to %s, the newest checkpoint that verifies", names[found]);
    if (found >= 0) snprintf(dir, 4096, "%s", names[found]);
    else mt_error_set("%s: %s", path, n ? "no checkpoint verifies (see the warnings above); not resuming"
                                        : "no complete checkpoint to resume from");
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return found >= 0 ? 0 : -1;
}
