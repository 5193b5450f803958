// core/common.h — error reporting, checked calls and logging shared by every folder.
//
// Two kinds of failure:
//   * user-facing (bad file, bad flag): a function records a message with mt_error_set()
//     and returns non-zero; the caller adds context or prints it and exits with a code.
//   * programming or runtime faults (CUDA error, out of host memory): the MT_CHECK_* macros
//     print the expression, file, line and a hint, then exit.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
#define MT_NORETURN [[noreturn]]
extern "C" {
#else
#define MT_NORETURN _Noreturn
#endif

// Exit codes shared by every sub-command.
enum {
    MT_EXIT_OK = 0,
    MT_EXIT_ERROR = 1,      // bad input, I/O failure, anything reported with a message
    MT_EXIT_USAGE = 2,      // unknown flag, bad value
    MT_EXIT_NOFIT = 3,      // planner: the run does not fit
    MT_EXIT_OOM = 4,        // a ledger or device allocation failed
    MT_EXIT_NOT_BUILT = 5,  // sub-command that is not built yet
};

// The last user-facing error of this thread, like dlerror(). Always returns a string.
void mt_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Prefix the current error with more context: "ctx: previous message".
void mt_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *mt_error_get(void);
void mt_error_clear(void);

// Logging: rank 0 prints; key=value fields where a script may parse them.
typedef enum { MT_LOG_DEBUG, MT_LOG_INFO, MT_LOG_WARN, MT_LOG_ERROR } mt_log_level;
void mt_log_set_level(mt_log_level level);
void mt_log_set_rank(int rank);
// Several ranks: warnings and errors (which may differ between ranks) carry "[rank R/N] "; the
// info lines rank 0 alone prints do not.
void mt_log_set_world(int rank, int size);
void mt_log(mt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define mt_info(...) mt_log(MT_LOG_INFO, __VA_ARGS__)
#define mt_warn(...) mt_log(MT_LOG_WARN, __VA_ARGS__)

// Fatal: prints "moetrain: fatal: <msg> (file:line)" and exits with `code`.
MT_NORETURN void mt_fatal_at(const char *file, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define mt_fatal(code, ...) mt_fatal_at(__FILE__, __LINE__, (code), __VA_ARGS__)

// Host allocation that never returns NULL: out of host memory is a clean fatal error (exit
// MT_EXIT_OOM), naming what is being read when a context is set.
void *mt_xmalloc(size_t n);
void *mt_xcalloc(size_t count, size_t size);
void *mt_xrealloc(void *p, size_t n);
char *mt_xstrdup(const char *s);
// What this thread is reading ("data.jsonl:11"), for the out-of-memory message of mt_x*alloc and
// of every cJSON parse (its allocator is mt_xmalloc's: a JSON parse never fails for want of
// memory, it exits MT_EXIT_OOM). The string is copied; NULL clears it.
void mt_oom_context(const char *where);
// Out of host memory, with `what` (bytes asked, the call) and the context: exits MT_EXIT_OOM.
MT_NORETURN void mt_fatal_oom_at(const char *file, int line, const char *what);
#define mt_fatal_oom(what) mt_fatal_oom_at(__FILE__, __LINE__, (what))

// Checked I/O: expression must be true, else fatal with errno text.
#define MT_CHECK_IO(expr, path)                                                             \
    do {                                                                                    \
        if (!(expr)) mt_fatal_io_at(__FILE__, __LINE__, #expr, (path));                     \
    } while (0)
MT_NORETURN void mt_fatal_io_at(const char *file, int line, const char *expr, const char *path);

// Overflow-checked size arithmetic for parsers: return 0 on overflow.
static inline int mt_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline int mt_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

// Whether s is one of the n strings of list (the parsers' field policies).
int mt_str_in(const char *const *list, size_t n, const char *s);

#define MT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MT_MAX(a, b) ((a) > (b) ? (a) : (b))

#ifdef __cplusplus
}
#endif
