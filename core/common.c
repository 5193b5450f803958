// core/common.c — error buffer, logging, fatal exits, checked host allocation.
#include "core/common.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <string.h>

static _Thread_local char error_buf[2048];
static mt_log_level log_level = MT_LOG_INFO;
static int log_rank = 0, log_ranks = 1;

void mt_error_set(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_buf, sizeof error_buf, fmt, ap);
    va_end(ap);
}

void mt_error_prefix(const char *fmt, ...) {
    char prefix[1024], old[sizeof error_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_buf, sizeof old);
    // Compose by hand: the result is cut to the buffer, which snprintf would warn about.
    size_t n = strlen(prefix);
    if (n > sizeof error_buf - 3) n = sizeof error_buf - 3;
    memcpy(error_buf, prefix, n);
    memcpy(error_buf + n, ": ", 3);
    const char *rest = old[0] ? old : "error";
    size_t m = strlen(rest), room = sizeof error_buf - n - 3;
    if (m > room) m = room;
    memcpy(error_buf + n + 2, rest, m);
    error_buf[n + 2 + m] = 0;
}

const char *mt_error_get(void) { return error_buf[0] ? error_buf : "unknown error"; }
void mt_error_clear(void) { error_buf[0] = 0; }

void mt_log_set_level(mt_log_level level) { log_level = level; }
void mt_log_set_rank(int rank) { log_rank = rank; }
void mt_log_set_world(int rank, int size) { log_rank = rank, log_ranks = size; }

void mt_log(mt_log_level level, const char *fmt, ...) {
    if (level < log_level) return;
    if (log_rank != 0 && level < MT_LOG_WARN) return;
    static const char *tag[] = {"debug: ", "", "warning: ", "error: "};
    FILE *out = level >= MT_LOG_WARN ? stderr : stdout;
    if (log_ranks > 1 && level >= MT_LOG_WARN) fprintf(out, "[rank %d/%d] ", log_rank, log_ranks);
    fprintf(out, "%s", tag[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}

_Noreturn void mt_fatal_at(const char *file, int line, int code, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "moetrain: fatal: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (%s:%d)\n", file, line);
    exit(code);
}

_Noreturn void mt_fatal_io_at(const char *file, int line, const char *expr, const char *path) {
    mt_fatal_at(file, line, MT_EXIT_ERROR, "I/O failed on '%s': %s [%s]", path ? path : "?",
                strerror(errno), expr);
}

static _Thread_local char oom_where[1200];

void mt_oom_context(const char *where) {
    snprintf(oom_where, sizeof oom_where, "%s", where ? where : "");
}

_Noreturn void mt_fatal_oom_at(const char *file, int line, const char *what) {
    mt_fatal_at(file, line, MT_EXIT_OOM, "out of host memory (%s)%s%s", what,
                oom_where[0] ? " reading " : "", oom_where);
}

void *mt_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        char what[64];
        snprintf(what, sizeof what, "%zu bytes", n);
        mt_fatal_oom(what);
    }
    return p;
}

void *mt_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        char what[80];
        snprintf(what, sizeof what, "%zu x %zu bytes", count, size);
        mt_fatal_oom(what);
    }
    return p;
}

void *mt_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        char what[64];
        snprintf(what, sizeof what, "%zu bytes, growing a buffer", n);
        mt_fatal_oom(what);
    }
    return q;
}

// cJSON allocates through mt_xmalloc: an out-of-memory parse exits MT_EXIT_OOM instead of
// reading as "invalid JSON". Installed before main, so every parser of every layer has it.
static void *json_malloc(size_t n) { return mt_xmalloc(n); }
__attribute__((constructor)) static void json_hooks_install(void) {
    cJSON_Hooks h = {.malloc_fn = json_malloc, .free_fn = free};
    cJSON_InitHooks(&h);
}

char *mt_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(mt_xmalloc(n), s, n);
}

int mt_str_in(const char *const *list, size_t n, const char *s) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i], s) == 0) return 1;
    return 0;
}
