// core/safetensors_model.c — a checkpoint folder: model.safetensors alone, or the shards that
// model.safetensors.index.json lists, cross-checked so every tensor is exactly where the index
// says and nowhere else.
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"

#define ST_SINGLE "model.safetensors"
#define ST_INDEX "model.safetensors.index.json"
#define ST_INDEX_MAX (100u << 20)  // real indexes are a few MB even for 100k tensors

// One weight_map entry: a tensor name and the shard file it is said to be in.
typedef struct {
    const char *tensor, *file;
    size_t shard;  // index into m->files
} st_wm;

static int st_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// A shard must be a plain file name in the folder: no path, no way out of it.
static int st_plain_name(const char *s) {
    return s[0] && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && !strchr(s, '/') &&
           !strchr(s, '\\');
}

// By name, then file, so a name in two shards is reported the same way every time.
static int st_tensor_by_name(const void *a, const void *b) {
    const mt_st_tensor *x = *(const mt_st_tensor *const *)a, *y = *(const mt_st_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file_index > y->file_index) - (x->file_index < y->file_index);
}
static int st_wm_by_tensor(const void *a, const void *b) {
    return strcmp(((const st_wm *)a)->tensor, ((const st_wm *)b)->tensor);
}
static int st_str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *st_base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

// m->tensors: every tensor of every open file, sorted by name; a name in two files is an error.
static int st_collect(mt_st_model *m, const char *where) {
    size_t n = 0;
    for (size_t i = 0; i < m->n_files; i++) n += m->files[i].n_tensors;
    m->tensors = mt_xmalloc((n ? n : 1) * sizeof *m->tensors);
    for (size_t i = 0; i < m->n_files; i++)
        for (size_t j = 0; j < m->files[i].n_tensors; j++) {
            m->files[i].tensors[j].file_index = (int)i;
            m->tensors[m->n_tensors++] = &m->files[i].tensors[j];
        }
    qsort(m->tensors, n, sizeof *m->tensors, st_tensor_by_name);
    for (size_t k = 1; k < n; k++)
        if (strcmp(m->tensors[k - 1]->name, m->tensors[k]->name) == 0) {
            mt_error_set("%s: tensor '%.256s' is in two shards: %s and %s", where,
                         m->tensors[k]->name, st_base(m->files[m->tensors[k - 1]->file_index].path),
                         st_base(m->files[m->tensors[k]->file_index].path));
            return -1;
        }
    return 0;
}

// The weight_map entries, checked (string values, plain file names, no name twice) and sorted
// by tensor name.
static int st_read_weight_map(const char *ipath, const cJSON *root, st_wm **out, size_t *n_out) {
    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        mt_error_set("%s: no \"weight_map\" object", ipath);
        return -1;
    }
    size_t n = 0;
    for (const cJSON *c = wm->child; c; c = c->next) n++;
    st_wm *e = mt_xcalloc(n, sizeof *e);
    n = 0;
    for (const cJSON *c = wm->child; c; c = c->next) {
        if (!cJSON_IsString(c) || !st_plain_name(c->valuestring)) {
            if (!cJSON_IsString(c))
                mt_error_set("%s: tensor '%.256s': its shard is not a string", ipath, c->string);
            else
                mt_error_set("%s: tensor '%.256s': shard '%.256s' is not a plain file name in "
                             "the folder (no '/', '..' or absolute path)",
                             ipath, c->string, c->valuestring);
            free(e);
            return -1;
        }
        e[n++] = (st_wm){c->string, c->valuestring, 0};
    }
    qsort(e, n, sizeof *e, st_wm_by_tensor);
    for (size_t k = 1; k < n; k++)
        if (strcmp(e[k - 1].tensor, e[k].tensor) == 0) {
            mt_error_set("%s: tensor '%.256s' is listed twice in \"weight_map\"", ipath, e[k].tensor);
            free(e);
            return -1;
        }
    *out = e;
    *n_out = n;
    return 0;
}

// Opens each distinct shard the index names (sorted by file name) into m->files, and records
// in every entry which one it named.
static int st_open_shards(mt_st_model *m, const char *dir, const char *ipath, st_wm *e, size_t n) {
    const char **names = mt_xmalloc((n ? n : 1) * sizeof *names);
    for (size_t k = 0; k < n; k++) names[k] = e[k].file;
    qsort(names, n, sizeof *names, st_str_cmp);
    size_t u = 0;
    for (size_t k = 0; k < n; k++)
        if (u == 0 || strcmp(names[u - 1], names[k]) != 0) names[u++] = names[k];
    for (size_t k = 0; k < n; k++)
        e[k].shard = (size_t)((const char **)bsearch(&e[k].file, names, u, sizeof *names, st_str_cmp) - names);

    m->files = mt_xcalloc(u ? u : 1, sizeof *m->files);
    int rc = 0;
    char path[4200];
    for (size_t s = 0; s < u && rc == 0; s++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[s]);
        if (!st_regular(path)) {
            const char *who = "";
            for (size_t k = 0; k < n && !who[0]; k++)
                if (e[k].shard == s) who = e[k].tensor;
            mt_error_set("%s: shard '%s' (named for tensor '%.256s') does not exist", ipath,
                         names[s], who);
            rc = -1;
        } else if (mt_st_file_open(&m->files[s], path) != 0) {
            mt_error_prefix("%s", ipath);
            rc = -1;
        } else {
            m->n_files++;
        }
    }
    free(names);
    return rc;
}

// Index and shards agree both ways: each listed tensor is in the shard named for it, and each
// shard tensor is listed.
static int st_cross_check(const mt_st_model *m, const char *ipath, st_wm *e, size_t n) {
    for (size_t k = 0; k < n; k++) {
        const mt_st_tensor *t = mt_st_model_find(m, e[k].tensor);
        if (!t || t->file_index != (int)e[k].shard) {
            mt_error_set("%s: tensor '%.256s': the index says it is in %s but %s%s", ipath,
                         e[k].tensor, e[k].file, t ? "it is in " : "no shard holds it",
                         t ? st_base(m->files[t->file_index].path) : "");
            return -1;
        }
    }
    if (m->n_tensors == n) return 0;
    for (size_t k = 0; k < m->n_tensors; k++) {
        st_wm key = {m->tensors[k]->name, NULL, 0};
        if (!bsearch(&key, e, n, sizeof *e, st_wm_by_tensor)) {
            mt_error_set("%s: tensor '%.256s' is in shard %s but not in the index", ipath,
                         m->tensors[k]->name, st_base(m->files[m->tensors[k]->file_index].path));
            return -1;
        }
    }
    return 0;
}

static int st_open_index(mt_st_model *m, const char *dir, const char *ipath) {
    char *text;
    size_t len;
    if (mt_read_file(ipath, ST_INDEX_MAX, &text, &len) != 0) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) {
        mt_error_set("%s: not valid JSON", ipath);
        return -1;
    }
    st_wm *e = NULL;
    size_t n = 0;
    int rc = st_read_weight_map(ipath, root, &e, &n);
    if (rc == 0) rc = st_open_shards(m, dir, ipath, e, n);
    if (rc == 0) rc = st_collect(m, ipath);
    if (rc == 0) rc = st_cross_check(m, ipath, e, n);
    free(e);
    cJSON_Delete(root);
    return rc;
}

int mt_st_model_open(mt_st_model *m, const char *dir) {
    memset(m, 0, sizeof *m);
    char single[4200], index[4200];
    snprintf(single, sizeof single, "%s/%s", dir, ST_SINGLE);
    snprintf(index, sizeof index, "%s/%s", dir, ST_INDEX);
    int rc;
    if (st_regular(single)) {  // preferred when both exist, as transformers does
        m->files = mt_xcalloc(1, sizeof *m->files);
        rc = mt_st_file_open(&m->files[0], single);
        if (rc == 0) {
            m->n_files = 1;
            rc = st_collect(m, single);
        }
    } else if (st_regular(index)) {
        rc = st_open_index(m, dir, index);
    } else {
        mt_error_set("%s: no %s or %s", dir, ST_SINGLE, ST_INDEX);
        rc = -1;
    }
    if (rc != 0) mt_st_model_close(m);
    return rc;
}

void mt_st_model_close(mt_st_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_files; i++) mt_st_file_close(&m->files[i]);
    free(m->files);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

static int st_find_cmp(const void *key, const void *elem) {
    return strcmp(key, (*(const mt_st_tensor *const *)elem)->name);
}

const mt_st_tensor *mt_st_model_find(const mt_st_model *m, const char *name) {
    if (!m->tensors) return NULL;
    const mt_st_tensor *const *hit =
        bsearch(name, m->tensors, m->n_tensors, sizeof *m->tensors, st_find_cmp);
    return hit ? *hit : NULL;
}
