// core/safetensors_write.c — safetensors writer: one file atomically (temp + fsync + rename),
// or HF-style shards plus model.safetensors.index.json.
//
// Layout: tensors in the order the caller gives, not HF's dtype-then-name order. Both are
// valid (readers sort by offset); keeping the caller's order lets fill() stream tensors in the
// order they are generated, and makes greedy sharding follow the entry list.
#include <cjson/cJSON.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"

#define ST_EXACT_LIMIT (1ull << 53)  // the reader takes JSON integers below 2^53 only
#define ST_HF_METADATA "{\"format\":\"pt\"}"

static int st_name_cmp(const void *a, const void *b, void *entries) {
    const mt_st_entry *e = entries;
    return strcmp(e[*(const size_t *)a].name, e[*(const size_t *)b].name);
}

// Entry order sorted by name (for duplicate checks and the index's weight_map).
static size_t *st_sorted_by_name(const mt_st_entry *e, size_t n) {
    size_t *ord = mt_xmalloc((n ? n : 1) * sizeof *ord);
    for (size_t i = 0; i < n; i++) ord[i] = i;
    qsort_r(ord, n, sizeof *ord, st_name_cmp, (void *)e);
    return ord;
}

// Everything the reader will check, checked before a byte is written: names (UTF-8, unique,
// not "__metadata__"), dtype, shape, a data source; nbytes[i] gets each entry's size.
static int st_check_entries(const char *where, const mt_st_entry *e, size_t n, mt_st_fill_fn fill,
                            uint64_t *nbytes) {
    for (size_t i = 0; i < n; i++) {
        const char *name = e[i].name;
        if (!name || strcmp(name, "__metadata__") == 0 ||
            mt_st_utf8_prefix(name, strlen(name)) != strlen(name)) {
            mt_error_set("%s: entry %zu: the name is missing, not UTF-8, or \"__metadata__\"", where, i);
            return -1;
        }
        if (mt_st_nbytes(e[i].dtype, e[i].ndim, e[i].shape, &nbytes[i]) != 0) {
            mt_error_prefix("%s: tensor '%.256s'", where, name);
            return -1;
        }
        for (int d = 0; d < e[i].ndim; d++)
            if ((uint64_t)e[i].shape[d] >= ST_EXACT_LIMIT) {
                mt_error_set("%s: tensor '%.256s': dimension %d is 2^53 or more", where, name, d);
                return -1;
            }
        if (!e[i].data && !fill && nbytes[i]) {
            mt_error_set("%s: tensor '%.256s': no data and no fill function", where, name);
            return -1;
        }
    }
    size_t *ord = st_sorted_by_name(e, n);
    for (size_t k = 1; k < n; k++)
        if (strcmp(e[ord[k - 1]].name, e[ord[k]].name) == 0) {
            mt_error_set("%s: tensor '%.256s' given twice", where, e[ord[k]].name);
            free(ord);
            return -1;
        }
    free(ord);
    return 0;
}

// An integer as raw JSON text: cJSON prints numbers from doubles and switches to exponent
// form (1e+15) that integer parsers such as the reference's reject.
static cJSON *st_json_int(uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(buf);
}

// metadata_json parsed and checked to be what the reader accepts: an object of string values
// with distinct keys.
static cJSON *st_parse_metadata(const char *path, const char *metadata_json) {
    cJSON *md = cJSON_Parse(metadata_json);
    int ok = cJSON_IsObject(md);
    for (const cJSON *c = ok ? md->child : NULL; c && ok; c = c->next) {
        ok = cJSON_IsString(c);
        for (const cJSON *d = md->child; d != c && ok; d = d->next) ok = strcmp(c->string, d->string) != 0;
    }
    if (!ok) {
        mt_error_set("%s: metadata must be a JSON object of distinct keys with string values", path);
        cJSON_Delete(md);
        return NULL;
    }
    return md;
}

// The header for entries [first, first+count): offsets relative to the range, padded with
// spaces to a multiple of 8 so the data buffer starts 8-aligned. NULL on bad metadata.
static char *st_build_header(const char *path, const mt_st_entry *e, const uint64_t *nbytes,
                             size_t first, size_t count, const char *metadata_json, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    if (metadata_json) {
        cJSON *md = st_parse_metadata(path, metadata_json);
        if (!md) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddItemToObject(root, "__metadata__", md);
    }
    uint64_t off = 0;
    for (size_t i = first; i < first + count; i++) {
        cJSON *t = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        cJSON_AddStringToObject(t, "dtype", e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++) cJSON_AddItemToArray(shape, st_json_int((uint64_t)e[i].shape[d]));
        cJSON_AddItemToObject(t, "shape", shape);
        cJSON_AddItemToArray(offs, st_json_int(off));
        cJSON_AddItemToArray(offs, st_json_int(off + nbytes[i]));
        cJSON_AddItemToObject(t, "data_offsets", offs);
        cJSON_AddItemToObject(root, e[i].name, t);
        off += nbytes[i];
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) mt_fatal(MT_EXIT_OOM, "out of host memory printing a safetensors header");
    size_t n = strlen(s), padded = (n + 7) & ~(size_t)7;
    char *h = mt_xmalloc(padded);
    memcpy(h, s, n);
    memset(h + n, ' ', padded - n);
    cJSON_free(s);
    *len = padded;
    return h;
}

static int st_put(mt_atomic_file *af, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, af->f) != n) {
        mt_error_set("%s: write failed: %s", af->path, strerror(errno));
        return -1;
    }
    return 0;
}

// Writes entries [first, first+count) to `path`; fill gets the index into the whole array.
// One scratch buffer, grown to the largest filled tensor, serves every fill() call.
static int st_write_range(const char *path, const mt_st_entry *e, const uint64_t *nbytes,
                          size_t first, size_t count, const char *metadata_json, mt_st_fill_fn fill,
                          void *ctx) {
    uint64_t total = 0;
    int ok = 1;
    for (size_t i = first; i < first + count && ok; i++) ok = mt_add_ok(total, nbytes[i], &total);
    if (!ok || total >= ST_EXACT_LIMIT) {
        mt_error_set("%s: %llu data bytes: more than one file can address", path,
                     (unsigned long long)total);
        return -1;
    }
    size_t hlen;
    char *header = st_build_header(path, e, nbytes, first, count, metadata_json, &hlen);
    if (!header) return -1;
    mt_atomic_file af;
    if (mt_atomic_open(&af, path) != 0) {
        free(header);
        return -1;
    }
    uint8_t len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (uint8_t)((uint64_t)hlen >> (8 * b));  // little-endian
    int rc = st_put(&af, len8, 8) || st_put(&af, header, hlen) ? -1 : 0;
    free(header);
    void *buf = NULL;
    size_t cap = 0;
    for (size_t i = first; i < first + count && rc == 0; i++) {
        const void *src = e[i].data;
        if (!src && fill) {
            if (nbytes[i] > cap || !buf) {
                cap = nbytes[i];
                buf = mt_xrealloc(buf, cap ? cap : 1);
            }
            mt_error_clear();
            if (fill(ctx, i, buf, nbytes[i]) != 0) {
                mt_error_prefix("%s: tensor '%.256s': fill failed", path, e[i].name);
                rc = -1;
                break;
            }
            src = buf;
        }
        if (src) rc = st_put(&af, src, nbytes[i]);
    }
    free(buf);
    if (rc != 0) {
        mt_atomic_abort(&af);
        return -1;
    }
    return mt_atomic_commit(&af);
}

int mt_st_write(const char *path, const mt_st_entry *entries, size_t n, const char *metadata_json,
                mt_st_fill_fn fill, void *ctx) {
    uint64_t *nbytes = mt_xmalloc((n ? n : 1) * sizeof *nbytes);
    int rc = st_check_entries(path, entries, n, fill, nbytes);
    if (rc == 0) rc = st_write_range(path, entries, nbytes, 0, n, metadata_json, fill, ctx);
    free(nbytes);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// sharded

// Removes dir/name if it is there: a stale file of the other layout would mislead a reader.
static void st_remove_stale(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (unlink(p) != 0 && errno != ENOENT) mt_warn("could not remove stale %s: %s", p, strerror(errno));
}

static void st_shard_name(char *buf, size_t cap, size_t s, size_t nsh) {
    snprintf(buf, cap, "model-%05zu-of-%05zu.safetensors", s + 1, nsh);
}

// {"metadata":{"total_size":N},"weight_map":{name: file}}, names sorted as HF writes them.
static int st_write_index(const char *dir, const mt_st_entry *e, size_t n, const size_t *shard_of,
                          size_t nsh, uint64_t total) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *wm = cJSON_CreateObject();
    cJSON_AddItemToObject(meta, "total_size", st_json_int(total));
    cJSON_AddItemToObject(root, "metadata", meta);
    cJSON_AddItemToObject(root, "weight_map", wm);
    size_t *ord = st_sorted_by_name(e, n);
    char file[64];
    for (size_t k = 0; k < n; k++) {
        st_shard_name(file, sizeof file, shard_of[ord[k]], nsh);
        cJSON_AddStringToObject(wm, e[ord[k]].name, file);
    }
    free(ord);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    if (!s) mt_fatal(MT_EXIT_OOM, "out of host memory printing a safetensors index");
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc = mt_write_file_atomic(path, s, strlen(s));
    cJSON_free(s);
    return rc;
}

// Greedy split in entry order: a shard closes when the next entry would push it past `max`;
// an entry larger than max gets a shard of its own. start[s] is shard s's first entry.
static size_t st_split(const uint64_t *nbytes, size_t n, uint64_t max, size_t *start,
                       size_t *shard_of) {
    size_t nsh = 0, in_shard = 0;
    uint64_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || (in_shard > 0 && cur + nbytes[i] > max)) {
            start[nsh++] = i;
            cur = 0;
            in_shard = 0;
        }
        cur += nbytes[i];
        in_shard++;
        shard_of[i] = nsh - 1;
    }
    start[nsh] = n;
    return nsh;
}

int mt_st_write_sharded(const char *dir, const mt_st_entry *entries, size_t n,
                        uint64_t max_shard_bytes, mt_st_fill_fn fill, void *ctx) {
    uint64_t *nbytes = mt_xmalloc((n ? n : 1) * sizeof *nbytes), total = 0;
    if (st_check_entries(dir, entries, n, fill, nbytes) != 0 || mt_mkdir_p(dir) != 0) {
        free(nbytes);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (!mt_add_ok(total, nbytes[i], &total)) {
            mt_error_set("%s: the tensors total more than 2^64 bytes", dir);
            rc = -1;
        }
    if (rc != 0) {
        free(nbytes);
        return -1;
    }
    char path[4200];
    if (total <= max_shard_bytes) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = st_write_range(path, entries, nbytes, 0, n, ST_HF_METADATA, fill, ctx);
        if (rc == 0) st_remove_stale(dir, "model.safetensors.index.json");
        free(nbytes);
        return rc;
    }
    size_t *start = mt_xmalloc((n + 1) * sizeof *start), *shard_of = mt_xmalloc(n * sizeof *shard_of);
    size_t nsh = st_split(nbytes, n, max_shard_bytes, start, shard_of), done = 0;
    char file[64];
    while (done < nsh && rc == 0) {
        st_shard_name(file, sizeof file, done, nsh);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        rc = st_write_range(path, entries, nbytes, start[done], start[done + 1] - start[done],
                            ST_HF_METADATA, fill, ctx);
        if (rc == 0) done++;
    }
    if (rc == 0) rc = st_write_index(dir, entries, n, shard_of, nsh, total);
    if (rc == 0) {
        st_remove_stale(dir, "model.safetensors");
    } else {  // shards written by this call are orphans without their index
        for (size_t s = 0; s < done; s++) {
            st_shard_name(file, sizeof file, s, nsh);
            st_remove_stale(dir, file);
        }
    }
    free(start);
    free(shard_of);
    free(nbytes);
    return rc;
}
