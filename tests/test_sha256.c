// core/sha256: the FIPS 180-4 / NIST CAVS example vectors, streaming in odd pieces, files.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/sha256.h"
#include "tests/test_util.h"

Test(sha256, fips_180_4_vectors) {
    static const struct { const char *msg; const char *hex; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
         "mnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[65];
    for (size_t i = 0; i < MT_ARRAY_LEN(v); i++) {
        mt_sha256_hex(v[i].msg, strlen(v[i].msg), hex);
        cr_assert_str_eq(hex, v[i].hex, "vector %zu", i);
    }
}

Test(sha256, million_a_in_uneven_pieces) {
    // FIPS 180-4's long vector: one million 'a', fed in pieces that straddle block edges
    static char a[1024];
    memset(a, 'a', sizeof a);
    mt_sha256 s;
    mt_sha256_init(&s);
    size_t done = 0, piece = 1;
    while (done < 1000000) {
        size_t n = MT_MIN(piece, 1000000 - done);
        mt_sha256_update(&s, a, n);
        done += n;
        piece = piece % 997 + 13;  // 13..1009
    }
    uint8_t dg[32];
    char hex[65];
    mt_sha256_final(&s, dg);
    mt_sha256_to_hex(dg, hex);
    cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

Test(sha256, file_digest_and_size) {
    char tmp[64], path[128], hex[65], want[65];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(path, sizeof path, "%s/f", tmp);
    static char buf[200000];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (char)(i * 31 + 7);
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, sizeof buf, f);
    fclose(f);
    uint64_t size = 0;
    cr_assert_eq(mt_sha256_file(path, hex, &size), 0);
    mt_sha256_hex(buf, sizeof buf, want);
    cr_assert_str_eq(hex, want);
    cr_assert_eq(size, sizeof buf);
    snprintf(path, sizeof path, "%s/missing", tmp);
    cr_assert_neq(mt_sha256_file(path, hex, &size), 0);
    cr_assert(strstr(mt_error_get(), "missing"), "%s", mt_error_get());
    mt_test_rmrf(tmp);
}
