// core/safetensors.c — safetensors reader: mmap the file, parse the header with cJSON, apply
// every check of docs/formats.md "safetensors" before any tensor pointer is handed out.
//
// Memory: the header (at most 100 MB, and never more than the file holds) is copied once so
// cJSON parses a NUL-terminated buffer we own; the cJSON tree and the tensor table grow with
// the header bytes actually present, never with a length the file merely claims.
#include "core/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"

#define ST_DESER "InvalidHeaderDeserialization"
#define ST_EXACT_LIMIT 9007199254740992.0  // 2^53: integers below it are exact in a double

// ---------------------------------------------------------------------------------------------
// dtypes

static const struct {
    const char *name;
    int bits;
} st_dtypes[] = {
    {"BOOL", 8},         {"U8", 8},           {"I8", 8},       {"F8_E5M2", 8},  {"F8_E4M3", 8},
    {"F8_E8M0", 8},      {"F8_E4M3FNUZ", 8},  {"F8_E5M2FNUZ", 8}, {"I16", 16},  {"U16", 16},
    {"F16", 16},         {"BF16", 16},        {"I32", 32},     {"U32", 32},     {"F32", 32},
    {"I64", 64},         {"U64", 64},         {"F64", 64},     {"C64", 64},     {"F4", 4},
    {"F6_E2M3", 6},      {"F6_E3M2", 6},
};

int mt_st_dtype_bits(const char *dtype) {
    if (!dtype) return -1;
    for (size_t i = 0; i < MT_ARRAY_LEN(st_dtypes); i++)
        if (strcmp(dtype, st_dtypes[i].name) == 0) return st_dtypes[i].bits;
    return -1;
}

const char *mt_st_dtype_of(mt_dtype t) {
    switch (t) {
    case MT_F32: return "F32";
    case MT_BF16: return "BF16";
    case MT_F16: return "F16";
    case MT_U8: return "U8";
    case MT_I32: return "I32";
    case MT_I64: return "I64";
    case MT_F8_E4M3: return "F8_E4M3";
    case MT_F8_E5M2: return "F8_E5M2";
    default: return NULL;  // MT_Q4 has no safetensors dtype: bitsandbytes stores it as U8
    }
}

// Bytes of `ndim` non-negative dims of `bits`-bit elements; NULL, or the name of the rule
// broken. The product is taken in order with checks, as the reference does, so a huge dim
// before a zero one still overflows.
static const char *st_size_rule(int bits, int ndim, const int64_t *shape, uint64_t *nbytes) {
    uint64_t n = 1, nbits;
    for (int d = 0; d < ndim; d++)
        if (!mt_mul_ok(n, (uint64_t)shape[d], &n)) return "ValidationOverflow";
    if (!mt_mul_ok(n, (uint64_t)bits, &nbits)) return "ValidationOverflow";
    if (nbits % 8) return "MisalignedSlice";
    *nbytes = nbits / 8;
    return NULL;
}

int mt_st_nbytes(const char *dtype, int ndim, const int64_t *shape, uint64_t *nbytes) {
    int bits = mt_st_dtype_bits(dtype);
    if (bits < 0) {
        mt_error_set("unknown dtype '%s'", dtype ? dtype : "(null)");
        return -1;
    }
    if (ndim < 0 || ndim > MT_ST_MAX_DIMS) {
        mt_error_set("%d dimensions: must be 0..%d", ndim, MT_ST_MAX_DIMS);
        return -1;
    }
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0) {
            mt_error_set("dimension %d is negative (%lld)", d, (long long)shape[d]);
            return -1;
        }
    const char *rule = st_size_rule(bits, ndim, shape, nbytes);
    if (rule) {
        mt_error_set("%s: %s with %d dimensions is not a whole number of bytes that fits in 64 bits",
                     rule, dtype, ndim);
        return -1;
    }
    return 0;
}

size_t mt_st_utf8_prefix(const void *s, size_t len) {
    const unsigned char *p = s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) need = 1, cp = c & 0x1f, min = 0x80;
        else if ((c & 0xf0) == 0xe0) need = 2, cp = c & 0x0f, min = 0x800;
        else if ((c & 0xf8) == 0xf0) need = 3, cp = c & 0x07, min = 0x10000;
        else return i;  // a continuation byte, or 0xf8..0xff
        if (len - i <= need) return i;  // truncated sequence
        for (size_t k = 1; k <= need; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += need + 1;
    }
    return len;
}

// ---------------------------------------------------------------------------------------------
// errors

// Every reader error has one shape: "<path>: [tensor '<name>': ]<rule>: <detail>". Names are
// cut to 256 bytes: a hostile header may hold a 100 MB key.
__attribute__((format(printf, 4, 5))) static int st_fail(const char *path, const char *tensor,
                                                         const char *rule, const char *fmt, ...) {
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (tensor) mt_error_set("%s: tensor '%.256s': %s: %s", path, tensor, rule, detail);
    else mt_error_set("%s: %s: %s", path, rule, detail);
    return -1;
}

// "BF16 [4, 8]" for messages.
static const char *st_describe(const mt_st_tensor *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "%s [", t->dtype);
    for (int d = 0; d < t->ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

// ---------------------------------------------------------------------------------------------
// header entries

// A JSON number that is a non-negative integer below 2^53, so the double cJSON stored holds
// exactly what the file wrote.
static int st_json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= ST_EXACT_LIMIT || (double)(uint64_t)d != d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int st_by_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

// The first key that appears twice in an object, or NULL. cJSON keeps duplicates in its list
// (and lookups would silently see only the first), so they are found by sorting the keys.
static const char *st_duplicate_key(const cJSON *obj) {
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) n++;
    if (n < 2) return NULL;
    const cJSON **keys = mt_xmalloc(n * sizeof *keys);
    n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) keys[n++] = c;
    qsort(keys, n, sizeof *keys, st_by_key);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (strcmp(keys[i - 1]->string, keys[i]->string) == 0) dup = keys[i]->string;
    free(keys);
    return dup;
}

// The tensor-entry members we know; others are ignored, as the reference does, but a known
// one given twice is an error (the reference's serde rejects duplicate fields).
static int st_entry_fields(const char *path, const cJSON *e, const cJSON **dtype,
                           const cJSON **shape, const cJSON **offsets) {
    *dtype = *shape = *offsets = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        const cJSON **slot = strcmp(c->string, "dtype") == 0          ? dtype
                             : strcmp(c->string, "shape") == 0        ? shape
                             : strcmp(c->string, "data_offsets") == 0 ? offsets
                                                                      : NULL;
        if (!slot) continue;
        if (*slot) return st_fail(path, e->string, ST_DESER, "\"%s\" given twice", c->string);
        *slot = c;
    }
    return 0;
}

// Fills t (dtype, shape) and off[2] from {"dtype": .., "shape": [..], "data_offsets": [b, e]}.
static int st_parse_entry(const char *path, const cJSON *e, mt_st_tensor *t, uint64_t off[2]) {
    const char *name = e->string;
    if (!cJSON_IsObject(e)) return st_fail(path, name, ST_DESER, "entry is not a JSON object");
    const cJSON *dt, *sh, *of;
    if (st_entry_fields(path, e, &dt, &sh, &of) != 0) return -1;

    if (!dt) return st_fail(path, name, ST_DESER, "missing \"dtype\"");
    if (!cJSON_IsString(dt)) return st_fail(path, name, ST_DESER, "\"dtype\" is not a string");
    t->dtype_bits = mt_st_dtype_bits(dt->valuestring);
    if (t->dtype_bits < 0)
        return st_fail(path, name, ST_DESER, "unknown dtype '%.64s'", dt->valuestring);
    snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);  // known names fit

    if (!sh) return st_fail(path, name, ST_DESER, "missing \"shape\"");
    if (!cJSON_IsArray(sh)) return st_fail(path, name, ST_DESER, "\"shape\" is not an array");
    t->ndim = 0;
    for (const cJSON *d = sh->child; d; d = d->next) {
        uint64_t v;
        if (t->ndim == MT_ST_MAX_DIMS)
            return st_fail(path, name, ST_DESER, "\"shape\" has more than %d dimensions",
                           MT_ST_MAX_DIMS);
        if (st_json_uint(d, &v) != 0)
            return st_fail(path, name, ST_DESER,
                           "\"shape\"[%d] is not a non-negative integer below 2^53", t->ndim);
        t->shape[t->ndim++] = (int64_t)v;
    }

    if (!of) return st_fail(path, name, ST_DESER, "missing \"data_offsets\"");
    const cJSON *b = cJSON_IsArray(of) ? of->child : NULL, *en = b ? b->next : NULL;
    if (!b || !en || en->next || st_json_uint(b, &off[0]) != 0 || st_json_uint(en, &off[1]) != 0)
        return st_fail(path, name, ST_DESER,
                       "\"data_offsets\" is not two non-negative integers below 2^53");
    return 0;
}

// "__metadata__": a string -> string map (null is taken as absent, as serde's Option does).
static int st_parse_metadata(mt_st_file *f, const cJSON *md) {
    if (cJSON_IsNull(md)) return 0;
    if (!cJSON_IsObject(md))
        return st_fail(f->path, NULL, ST_DESER, "\"__metadata__\" is not a JSON object");
    for (const cJSON *c = md->child; c; c = c->next)
        if (!cJSON_IsString(c))
            return st_fail(f->path, NULL, ST_DESER,
                           "\"__metadata__\" value of '%.256s' is not a string", c->string);
    const char *dup = st_duplicate_key(md);
    if (dup) return st_fail(f->path, NULL, ST_DESER, "\"__metadata__\" key '%.256s' given twice", dup);
    char *s = cJSON_PrintUnformatted(md);
    if (!s) mt_fatal(MT_EXIT_OOM, "out of host memory printing safetensors metadata");
    f->metadata_json = mt_xstrdup(s);
    cJSON_free(s);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// offsets

typedef struct {
    uint64_t begin, end;
    size_t idx;        // into f->tensors (header order)
    const char *name;  // that tensor's name, for ties
} st_span;

// File order, as the reference sorts: by (begin, end); the name breaks ties between zero-size
// tensors so the order never depends on the header's key order.
static int st_by_offset(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

// The reference's Metadata::validate plus its final length check: tensors tile the data
// buffer exactly, each with the size its dtype and shape imply.
static int st_check_spans(mt_st_file *f, st_span *sp, uint64_t data_len) {
    char what[256];
    uint64_t pos = 0;
    for (size_t k = 0; k < f->n_tensors; k++) {
        const mt_st_tensor *t = &f->tensors[sp[k].idx];
        uint64_t b = sp[k].begin, e = sp[k].end, nbytes;
        if (e < b)
            return st_fail(f->path, t->name, "InvalidOffset",
                           "data_offsets [%llu, %llu] end before they begin",
                           (unsigned long long)b, (unsigned long long)e);
        if (b != pos && k == 0)
            return st_fail(f->path, t->name, "InvalidOffset",
                           "the first tensor's data begins at %llu, not 0", (unsigned long long)b);
        if (b != pos)
            return st_fail(f->path, t->name, "InvalidOffset",
                           "begins at %llu where the previous tensor ended at %llu (%s)",
                           (unsigned long long)b, (unsigned long long)pos,
                           b > pos ? "a gap" : "an overlap");
        pos = e;
        const char *rule = st_size_rule(t->dtype_bits, t->ndim, t->shape, &nbytes);
        if (rule)
            return st_fail(f->path, t->name, rule, "%s: %s", st_describe(t, what, sizeof what),
                           rule[0] == 'V' ? "the element count times the dtype's bits overflows"
                                          : "the total bits are not a multiple of 8");
        if (e - b != nbytes)
            return st_fail(f->path, t->name, "TensorInvalidInfo",
                           "%s needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                           st_describe(t, what, sizeof what), (unsigned long long)nbytes,
                           (unsigned long long)b, (unsigned long long)e,
                           (unsigned long long)(e - b));
        f->tensors[sp[k].idx].nbytes = nbytes;
    }
    if (pos > data_len)
        return st_fail(f->path, f->tensors[sp[f->n_tensors - 1].idx].name,
                       "MetadataIncompleteBuffer",
                       "data ends at %llu, past the %llu data bytes the file holds",
                       (unsigned long long)pos, (unsigned long long)data_len);
    if (pos < data_len)
        return st_fail(f->path, NULL, "MetadataIncompleteBuffer",
                       "tensors cover %llu data bytes but the file holds %llu (%llu bytes unused)",
                       (unsigned long long)pos, (unsigned long long)data_len,
                       (unsigned long long)(data_len - pos));
    return 0;
}

// ---------------------------------------------------------------------------------------------
// the header as a whole

static int st_by_name(const void *a, const void *b) {
    return strcmp((*(const mt_st_tensor *const *)a)->name, (*(const mt_st_tensor *const *)b)->name);
}

// Tensors from the parsed header: entries, duplicates, offsets; then data pointers, file
// order and the by-name table.
static int st_load(mt_st_file *f, const cJSON *root, uint64_t hlen) {
    size_t count = 0;
    for (const cJSON *c = root->child; c; c = c->next) count++;
    const char *dup = st_duplicate_key(root);
    if (dup) return st_fail(f->path, dup, ST_DESER, "the name appears twice in the header");

    f->tensors = mt_xcalloc(count, sizeof *f->tensors);
    st_span *sp = mt_xcalloc(count, sizeof *sp);
    int rc = 0;
    for (const cJSON *c = root->child; c && rc == 0; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            rc = st_parse_metadata(f, c);
            continue;
        }
        mt_st_tensor *t = &f->tensors[f->n_tensors];
        uint64_t off[2] = {0, 0};
        rc = st_parse_entry(f->path, c, t, off);
        if (rc != 0) break;
        t->name = mt_xstrdup(c->string);
        sp[f->n_tensors] = (st_span){off[0], off[1], f->n_tensors, t->name};
        f->n_tensors++;
    }
    if (rc == 0) {
        qsort(sp, f->n_tensors, sizeof *sp, st_by_offset);
        rc = st_check_spans(f, sp, f->map_len - 8 - hlen);
    }
    if (rc == 0) {  // every span is now known to lie inside the file
        const uint8_t *base = (const uint8_t *)f->map + 8 + hlen;
        mt_st_tensor *ordered = mt_xcalloc(count, sizeof *ordered);
        for (size_t k = 0; k < f->n_tensors; k++) {
            ordered[k] = f->tensors[sp[k].idx];
            ordered[k].data = base + sp[k].begin;
        }
        free(f->tensors);
        f->tensors = ordered;
        f->by_name = mt_xmalloc((f->n_tensors ? f->n_tensors : 1) * sizeof *f->by_name);
        for (size_t k = 0; k < f->n_tensors; k++) f->by_name[k] = &f->tensors[k];
        qsort(f->by_name, f->n_tensors, sizeof *f->by_name, st_by_name);
    }
    free(sp);
    return rc;
}

static int st_is_json_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Bytes 8..8+N: UTF-8, starts with '{', one JSON object, then only whitespace (the README's
// space padding; serde also takes tabs and newlines).
static int st_parse_header(mt_st_file *f, uint64_t hlen) {
    const unsigned char *h = (const unsigned char *)f->map + 8;
    size_t n = (size_t)hlen, bad = mt_st_utf8_prefix(h, n);
    if (bad < n)
        return st_fail(f->path, NULL, "InvalidHeader",
                       "the header is not UTF-8 (byte 0x%02x at header offset %zu)", h[bad], bad);
    if (n == 0)
        return st_fail(f->path, NULL, "InvalidHeaderStart", "the header is empty, not '{...}'");
    if (h[0] != '{')
        return st_fail(f->path, NULL, "InvalidHeaderStart",
                       "the header must start with '{', not byte 0x%02x", h[0]);
    // Raw control bytes are never valid JSON, and a NUL would cut cJSON's strings short.
    for (size_t i = 0; i < n; i++)
        if (h[i] < 0x20 && !st_is_json_space(h[i]))
            return st_fail(f->path, NULL, ST_DESER,
                           "control byte 0x%02x at header offset %zu is not valid JSON", h[i], i);
    char *buf = mt_xmalloc(n + 1);
    memcpy(buf, h, n);
    buf[n] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    int rc = 0;
    if (!root) {
        rc = st_fail(f->path, NULL, ST_DESER, "the header is not valid JSON (error near offset %zu)",
                     end ? (size_t)(end - buf) : (size_t)0);
    } else {
        for (const char *p = end; p < buf + n && rc == 0; p++)
            if (!st_is_json_space((unsigned char)*p))
                rc = st_fail(f->path, NULL, ST_DESER,
                             "unexpected '%c' after the header object at offset %zu", *p,
                             (size_t)(p - buf));
        if (rc == 0 && !cJSON_IsObject(root))
            rc = st_fail(f->path, NULL, ST_DESER, "the header is not a JSON object");
        if (rc == 0) rc = st_load(f, root, hlen);
    }
    cJSON_Delete(root);
    free(buf);
    return rc;
}

// The 8-byte length prefix: checked against the limit and the file before anything else.
static int st_check_length(mt_st_file *f, uint64_t *hlen) {
    const uint8_t *p = f->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];  // little-endian on any host
    if (n > MT_ST_MAX_HEADER)
        return st_fail(f->path, NULL, "HeaderTooLarge",
                       "header length %llu is above the %llu-byte limit", (unsigned long long)n,
                       MT_ST_MAX_HEADER);
    if (n > f->map_len - 8)
        return st_fail(f->path, NULL, "InvalidHeaderLength",
                       "header length %llu runs past the end of the %zu-byte file",
                       (unsigned long long)n, f->map_len);
    *hlen = n;
    return 0;
}

int mt_st_file_open(mt_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        mt_error_set("%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        mt_error_set("%s: not a regular file", path);
        return -1;
    }
    if (st.st_size < 8) {
        close(fd);
        return st_fail(path, NULL, "HeaderTooSmall",
                       "the file has %lld bytes, fewer than the 8-byte header length",
                       (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);  // the mapping keeps the file
    if (map == MAP_FAILED) {
        mt_error_set("%s: cannot map: %s", path, strerror(err));
        return -1;
    }
    f->path = mt_xstrdup(path);
    f->map = map;
    f->map_len = (size_t)st.st_size;
    uint64_t hlen = 0;
    if (st_check_length(f, &hlen) != 0 || st_parse_header(f, hlen) != 0) {
        mt_st_file_close(f);
        return -1;
    }
    return 0;
}

void mt_st_file_close(mt_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    free(f->metadata_json);
    free(f->path);
    if (f->map) munmap(f->map, f->map_len);
    memset(f, 0, sizeof *f);
}

static int st_find_cmp(const void *key, const void *elem) {
    return strcmp(key, (*(const mt_st_tensor *const *)elem)->name);
}

const mt_st_tensor *mt_st_file_find(const mt_st_file *f, const char *name) {
    if (!f->by_name) return NULL;
    const mt_st_tensor *const *hit =
        bsearch(name, f->by_name, f->n_tensors, sizeof *f->by_name, st_find_cmp);
    return hit ? *hit : NULL;
}

int mt_st_float_dtype(const char *dtype, mt_dtype *out) {
    static const struct { const char *name; mt_dtype t; } floats[] = {{"F32", MT_F32}, {"BF16", MT_BF16}, {"F16", MT_F16}};
    for (size_t i = 0; i < MT_ARRAY_LEN(floats); i++)
        if (strcmp(dtype, floats[i].name) == 0) {
            *out = floats[i].t;
            return 0;
        }
    return -1;
}
