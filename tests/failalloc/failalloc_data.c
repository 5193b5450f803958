// tests/failalloc/failalloc_data.c — the data path with one allocation made to fail (issue 32).
//
//   failalloc_data TOKENIZER DATA SEQ [PHASE N]
// TOKENIZER: a tokenizer.json, or "bytes". Loads the tokenizer (phase 1) and DATA (phase 2) with
// every malloc/calloc/realloc of the process counted while a phase runs. Without PHASE N it prints
// "allocs1=K1 allocs2=K2 samples=S"; with them, the N-th allocation of that phase returns NULL
// (ENOMEM) and the run goes on: it must then exit MT_EXIT_OOM (4) naming what it was reading, or
// read every sample as if nothing had failed (a caller that recovers): never end with fewer
// samples, never report the failure as bad input (exit 1). tests/test_failalloc.c runs it for
// every N. Not built under ASan (which owns malloc).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "data/data.h"
#include "data/tokenizer.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
int main(void) {
    printf("skip: built with a sanitizer, which owns malloc\n");
    return 77;
}
#else
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t c, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

static int phase;            // counting while 1 or 2
static long counts[3], fail_phase, fail_at;

static int fail_now(void) {
    if (!phase) return 0;
    long n = ++counts[phase];
    if (phase == fail_phase && n == fail_at) {
        errno = ENOMEM;
        return 1;
    }
    return 0;
}

void *malloc(size_t n) { return fail_now() ? NULL : __libc_malloc(n); }
void *calloc(size_t c, size_t n) { return fail_now() ? NULL : __libc_calloc(c, n); }
void *realloc(void *p, size_t n) { return fail_now() ? NULL : __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }

int main(int argc, char **argv) {
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: failalloc_data TOKENIZER|bytes DATA SEQ [PHASE N]\n");
        return 2;
    }
    if (argc == 6) fail_phase = atol(argv[4]), fail_at = atol(argv[5]);
    mt_log_set_level(MT_LOG_ERROR);
    mt_tokenizer tok;
    phase = 1;
    int rc = strcmp(argv[1], "bytes") == 0 ? mt_tokenizer_init_bytes(&tok, 256, 1, 2)
                                           : mt_tokenizer_load_bpe(&tok, argv[1], 1 << 20, 0);
    phase = 0;
    if (rc != 0) {
        printf("tokenizer: %s\n", mt_error_get());
        return 1;
    }
    mt_data_opts o;
    mt_data_opts_default(&o);
    o.seq = atol(argv[3]);
    o.shuffle = 0;
    mt_dataset d;
    phase = 2;
    rc = mt_dataset_load(&d, argv[2], &tok, &o);
    phase = 0;
    if (rc != 0) {
        printf("data: %s\n", mt_error_get());
        return 1;
    }
    printf("allocs1=%ld allocs2=%ld samples=%lld\n", counts[1], counts[2], (long long)d.stats.samples);
    mt_dataset_free(&d);
    mt_tokenizer_free(&tok);
    return 0;
}
#endif
