// core/sha256.c — SHA-256 as FIPS 180-4 §6.2 specifies it; tests/test_sha256.c checks the
// standard's vectors. Written here rather than linked from libcrypto: 100 lines, no new package.
#include "core/sha256.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void mt_sha256_init(mt_sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->bytes = 0, s->fill = 0;
}

void mt_sha256_update(mt_sha256 *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->bytes += n;
    if (s->fill) {
        size_t take = MT_MIN(n, 64 - s->fill);
        memcpy(s->block + s->fill, p, take);
        s->fill += take, p += take, n -= take;
        if (s->fill < 64) return;
        compress(s->h, s->block);
        s->fill = 0;
    }
    for (; n >= 64; p += 64, n -= 64) compress(s->h, p);
    memcpy(s->block, p, n);
    s->fill = n;
}

void mt_sha256_final(mt_sha256 *s, uint8_t digest[32]) {
    uint64_t bits = s->bytes * 8;
    uint8_t pad[72] = {0x80};
    size_t padlen = (s->fill < 56 ? 56 : 120) - s->fill;
    for (int i = 0; i < 8; i++) pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    mt_sha256_update(s, pad, padlen + 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) digest[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

void mt_sha256_to_hex(const uint8_t digest[32], char hex[65]) {
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) hex[2 * i] = d[digest[i] >> 4], hex[2 * i + 1] = d[digest[i] & 15];
    hex[64] = 0;
}

void mt_sha256_hex(const void *data, size_t n, char hex[65]) {
    mt_sha256 s;
    uint8_t dg[32];
    mt_sha256_init(&s);
    mt_sha256_update(&s, data, n);
    mt_sha256_final(&s, dg);
    mt_sha256_to_hex(dg, hex);
}

int mt_sha256_file(const char *path, char hex[65], uint64_t *size) {
    struct stat st;
    FILE *f = mt_open_regular(path, &st);
    if (!f) return -1;
    mt_sha256 s;
    mt_sha256_init(&s);
    static _Thread_local uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) mt_sha256_update(&s, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        mt_error_set("%s: read failed: %s", path, strerror(errno));
        return -1;
    }
    uint8_t dg[32];
    *size = s.bytes;  // before the padding
    mt_sha256_final(&s, dg);
    mt_sha256_to_hex(dg, hex);
    return 0;
}

int mt_sha256sums_write(const char *list, const char *dir, const char *const *names, int n) {
    size_t cap = (size_t)n * 4200 + 1, len = 0;
    char *text = mt_xmalloc(cap);
    for (int i = 0; i < n; i++) {
        char path[4200], hex[65];
        uint64_t size;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (mt_sha256_file(path, hex, &size) != 0) {
            free(text);
            return -1;
        }
        len += (size_t)snprintf(text + len, cap - len, "%s  %s\n", hex, names[i]);
    }
    int rc = mt_write_file_atomic(list, text, len);
    free(text);
    return rc;
}

int mt_sha256sums_check(const char *list, const char *dir, int verbose) {
    char *text;
    size_t len;
    if (mt_read_file(list, 1 << 20, &text, &len) != 0) return -1;
    int count = 0, lineno = 0;
    char *save = NULL;
    if (strlen(text) != len) {
        mt_error_set("%s: holds a NUL byte", list);
        count = -1;
    }
    for (char *line = count ? NULL : strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        size_t n = strlen(line);
        const char *name = line + 66;
        int ok = n > 66 && line[64] == ' ' && line[65] == ' ' && !strchr(name, '/');
        for (int i = 0; ok && i < 64; i++) ok = (line[i] >= '0' && line[i] <= '9') || (line[i] >= 'a' && line[i] <= 'f');
        if (!ok) {
            mt_error_set("%s:%d: not a '<sha256>  <file>' line", list, lineno);
            count = -1;
            break;
        }
        char path[4200], hex[65];
        uint64_t size;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (mt_sha256_file(path, hex, &size) != 0) {
            count = -1;
            break;
        }
        if (memcmp(hex, line, 64) != 0) {
            mt_error_set("%s: SHA-256 mismatch with %s (recorded %.12s…, found %.12s…): the data is damaged", path,
                         list, line, hex);
            count = -1;
            break;
        }
        if (verbose) printf("  ok  %s (%llu bytes)\n", name, (unsigned long long)size);
        count++;
    }
    if (count == 0) {
        mt_error_set("%s: lists no file", list);
        count = -1;
    }
    free(text);
    return count;
}
