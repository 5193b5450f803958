// core/sha256.h — SHA-256 (FIPS 180-4): checksums of checkpoints, adapters and trained tensors.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_sha256 {
    uint32_t h[8];
    uint64_t bytes;     // message length so far
    uint8_t block[64];  // a partial block
    size_t fill;
} mt_sha256;

void mt_sha256_init(mt_sha256 *s);
void mt_sha256_update(mt_sha256 *s, const void *data, size_t n);
void mt_sha256_final(mt_sha256 *s, uint8_t digest[32]);
// digest of data[0..n) as 64 lowercase hex digits + NUL
void mt_sha256_hex(const void *data, size_t n, char hex[65]);
void mt_sha256_to_hex(const uint8_t digest[32], char hex[65]);
// Streams `path` through SHA-256: hex digest and size. 0, or -1 with an error naming the path.
int mt_sha256_file(const char *path, char hex[65], uint64_t *size);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// A checksum list in `sha256sum` format ("<64 hex>  <name>\n", checkable with sha256sum -c):
// `list` (a path) gets one line per file names[i] of `dir`, written atomically.
int mt_sha256sums_write(const char *list, const char *dir, const char *const *names, int n);
// Checks every file that `list` names (relative to `dir`); `verbose` prints a line per file.
// Returns the number of files checked, or -1 with an error naming the file and what failed.
int mt_sha256sums_check(const char *list, const char *dir, int verbose);
#ifdef __cplusplus
}
#endif
