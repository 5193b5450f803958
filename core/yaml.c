// core/yaml.c — run configs: a flat YAML mapping read with libyaml's event parser.
//
// libyaml 0.2.5 bounds nothing itself (no nesting limit, aliases expand freely in its loader),
// so this reader uses events, never the document loader, and stops at the first event that
// breaks a bound: an anchor or alias, depth > 8, a scalar > 64 KiB, a duplicate key, or any
// shape other than key → scalar / key → list of scalars.
#include "core/yaml.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include <yaml.h>

#include "core/common.h"
#include "core/fileio.h"

#define YAML_MAX_FILE (1u << 20)
#define YAML_MAX_SCALAR (64u << 10)
#define YAML_MAX_DEPTH 8

typedef struct {
    const char *path;
    yaml_parser_t parser;
    yaml_event_t ev;  // the current event; valid when have_ev
    int have_ev;
    int depth;
    char **keys;      // open-addressing hash set of keys seen, for duplicates
    size_t keys_cap, keys_count;
} yaml_reader;

// "path:line:column: message", with libyaml's 0-based mark made 1-based.
static int fail_at(yaml_reader *r, yaml_mark_t m, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(yaml_reader *r, yaml_mark_t m, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mt_error_set("%s:%zu:%zu: %s", r->path, m.line + 1, m.column + 1, msg);
    return -1;
}

// libyaml's own error. Reader errors (bad UTF-8, control characters) carry only a byte offset.
static int fail_parser(yaml_reader *r, const char *buf, size_t len) {
    yaml_parser_t *p = &r->parser;
    yaml_mark_t m = p->problem_mark;
    if (p->error == YAML_READER_ERROR) {
        memset(&m, 0, sizeof m);
        for (size_t i = 0; i < p->problem_offset && i < len; i++) {
            if (buf[i] == '\n') { m.line++; m.column = 0; }
            else m.column++;
        }
    }
    const char *problem = p->problem ? p->problem : "YAML syntax error";
    if (p->context)
        return fail_at(r, m, "%s %s (line %zu column %zu)", problem, p->context,
                       p->context_mark.line + 1, p->context_mark.column + 1);
    return fail_at(r, m, "%s", problem);
}

// Checks every event, whatever its place: no anchors or aliases, bounded depth and size.
static int check_event(yaml_reader *r) {
    yaml_event_t *e = &r->ev;
    const yaml_char_t *anchor = NULL;
    switch (e->type) {
    case YAML_ALIAS_EVENT:
        return fail_at(r, e->start_mark, "aliases (*%.60s) are not allowed in a run config",
                       (const char *)e->data.alias.anchor);
    case YAML_SCALAR_EVENT:
        anchor = e->data.scalar.anchor;
        if (e->data.scalar.length > YAML_MAX_SCALAR)
            return fail_at(r, e->start_mark, "a value of %zu bytes is larger than the %u-byte limit",
                           e->data.scalar.length, YAML_MAX_SCALAR);
        if (strlen((const char *)e->data.scalar.value) != e->data.scalar.length)
            return fail_at(r, e->start_mark, "a value contains a NUL character");
        break;
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
        anchor = e->type == YAML_SEQUENCE_START_EVENT ? e->data.sequence_start.anchor
                                                      : e->data.mapping_start.anchor;
        if (++r->depth > YAML_MAX_DEPTH)
            return fail_at(r, e->start_mark, "nesting deeper than %d levels", YAML_MAX_DEPTH);
        break;
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        r->depth--;
        break;
    default:
        break;
    }
    if (anchor)
        return fail_at(r, e->start_mark, "anchors (&%.60s) are not allowed in a run config",
                       (const char *)anchor);
    return 0;
}

// Frees the previous event, then parses and checks the next one.
static int next_event(yaml_reader *r, const char *buf, size_t len) {
    if (r->have_ev) yaml_event_delete(&r->ev);
    r->have_ev = 0;
    if (!yaml_parser_parse(&r->parser, &r->ev)) return fail_parser(r, buf, len);
    r->have_ev = 1;
    return check_event(r);
}

// ---------------------------------------------------------------------------------------------
// Keys seen so far: a hash set, so that a file of many keys stays linear.

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void keys_insert(char **tab, size_t cap, char *key) {
    size_t i = hash_str(key) & (cap - 1);
    while (tab[i]) i = (i + 1) & (cap - 1);
    tab[i] = key;
}

// 1 when added, 0 when already present.
static int keys_add(yaml_reader *r, const char *key) {
    if (r->keys_cap) {
        for (size_t i = hash_str(key) & (r->keys_cap - 1); r->keys[i]; i = (i + 1) & (r->keys_cap - 1))
            if (strcmp(r->keys[i], key) == 0) return 0;
    }
    if (2 * (r->keys_count + 1) > r->keys_cap) {
        size_t cap = r->keys_cap ? 2 * r->keys_cap : 64;
        char **tab = mt_xcalloc(cap, sizeof *tab);
        for (size_t i = 0; i < r->keys_cap; i++)
            if (r->keys[i]) keys_insert(tab, cap, r->keys[i]);
        free(r->keys);
        r->keys = tab;
        r->keys_cap = cap;
    }
    keys_insert(r->keys, r->keys_cap, mt_xstrdup(key));
    r->keys_count++;
    return 1;
}

static void keys_free(yaml_reader *r) {
    for (size_t i = 0; i < r->keys_cap; i++) free(r->keys[i]);
    free(r->keys);
}

// ---------------------------------------------------------------------------------------------
// The flat shape.

// A list value: scalars joined with ",". Elements with a comma would be split apart later.
static int read_list(yaml_reader *r, const char *buf, size_t len, const char *key, char **out) {
    size_t n = 0, cap = 64;
    char *joined = mt_xmalloc(cap);
    joined[0] = 0;
    for (;;) {
        if (next_event(r, buf, len) != 0) goto fail;
        yaml_event_t *e = &r->ev;
        if (e->type == YAML_SEQUENCE_END_EVENT) break;
        if (e->type != YAML_SCALAR_EVENT) {
            fail_at(r, e->start_mark, "'%.60s': a list may hold only plain values", key);
            goto fail;
        }
        const char *v = (const char *)e->data.scalar.value;
        size_t vl = e->data.scalar.length;
        if (memchr(v, ',', vl)) {
            fail_at(r, e->start_mark, "'%.60s': list item '%.60s' contains a comma", key, v);
            goto fail;
        }
        if (n + vl + 2 > cap) {
            cap = 2 * (n + vl + 2);
            joined = mt_xrealloc(joined, cap);
        }
        if (n) joined[n++] = ',';
        memcpy(joined + n, v, vl + 1);
        n += vl;
    }
    *out = joined;
    return 0;
fail:
    free(joined);
    return -1;
}

static int read_mapping(yaml_reader *r, const char *buf, size_t len, mt_yaml_pair_fn fn, void *ctx) {
    for (;;) {
        if (next_event(r, buf, len) != 0) return -1;
        yaml_event_t *e = &r->ev;
        if (e->type == YAML_MAPPING_END_EVENT) return 0;
        if (e->type != YAML_SCALAR_EVENT)
            return fail_at(r, e->start_mark, "a key must be a plain name, not a list or mapping");
        yaml_mark_t km = e->start_mark;
        const char *k = (const char *)e->data.scalar.value;
        if (!k[0]) return fail_at(r, km, "empty key");
        if (!keys_add(r, k)) return fail_at(r, km, "duplicate key '%.60s'", k);
        // The key's copy lives in the set until the end; the event is freed by the next parse.
        char *key = mt_xstrdup(k);
        int rc = next_event(r, buf, len);
        e = &r->ev;
        if (rc == 0 && e->type == YAML_SCALAR_EVENT) {
            rc = fn(ctx, key, (const char *)e->data.scalar.value, (int)km.line + 1, (int)km.column + 1);
        } else if (rc == 0 && e->type == YAML_SEQUENCE_START_EVENT) {
            char *joined;
            rc = read_list(r, buf, len, key, &joined);
            if (rc == 0) {
                rc = fn(ctx, key, joined, (int)km.line + 1, (int)km.column + 1);
                free(joined);
            }
        } else if (rc == 0) {
            rc = fail_at(r, e->start_mark, "'%.60s': nested mappings are not allowed (a run config "
                         "is flat: key: value or key: [a, b])", key);
        }
        free(key);
        if (rc != 0) return -1;
    }
}

// stream → at most one document → a mapping (or nothing: an empty file is an empty mapping).
static int read_stream(yaml_reader *r, const char *buf, size_t len, mt_yaml_pair_fn fn, void *ctx) {
    if (next_event(r, buf, len) != 0) return -1;  // STREAM_START
    int documents = 0;
    for (;;) {
        if (next_event(r, buf, len) != 0) return -1;
        yaml_event_t *e = &r->ev;
        if (e->type == YAML_STREAM_END_EVENT) return 0;
        if (e->type != YAML_DOCUMENT_START_EVENT)
            return fail_at(r, e->start_mark, "unexpected YAML event");
        if (++documents > 1)
            return fail_at(r, e->start_mark, "more than one YAML document (a run config is one mapping)");
        if (next_event(r, buf, len) != 0) return -1;
        e = &r->ev;
        if (e->type == YAML_MAPPING_START_EVENT) {
            if (read_mapping(r, buf, len, fn, ctx) != 0) return -1;
        } else if (!(e->type == YAML_SCALAR_EVENT && e->data.scalar.length == 0 &&
                     e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE)) {
            // A lone "---" gives an empty plain scalar: also an empty mapping.
            return fail_at(r, e->start_mark, "the top level must be a mapping of option names to values");
        }
        if (next_event(r, buf, len) != 0) return -1;  // DOCUMENT_END
    }
}

int mt_yaml_read_flat_buffer(const char *name, const char *buf, size_t len, mt_yaml_pair_fn fn,
                             void *ctx) {
    if (len > YAML_MAX_FILE) {
        mt_error_set("%s: %zu bytes is larger than the %u-byte limit for a run config", name, len,
                     YAML_MAX_FILE);
        return -1;
    }
    yaml_reader r = {.path = name};
    if (!yaml_parser_initialize(&r.parser)) {
        mt_error_set("%s: cannot initialise the YAML parser (out of memory)", name);
        return -1;
    }
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)buf, len);
    int rc = read_stream(&r, buf, len, fn, ctx);
    if (r.have_ev) yaml_event_delete(&r.ev);
    yaml_parser_delete(&r.parser);
    keys_free(&r);
    return rc;
}

int mt_yaml_read_flat(const char *path, mt_yaml_pair_fn fn, void *ctx) {
    char *buf;
    size_t len;
    if (mt_read_file(path, YAML_MAX_FILE, &buf, &len) != 0) return -1;
    int rc = mt_yaml_read_flat_buffer(path, buf, len, fn, ctx);
    free(buf);
    return rc;
}
