// tests/test_tensorboard.c — --report-to tensorboard: CRC-32C against published vectors, the
// TFRecord framing against TensorBoard's own masked CRCs, the Event/Summary encoding decoded back,
// and a run writing OUT/runs/events.out.tfevents.*. (TensorBoard itself reads a 20-step run in
// scripts/tensorboard_interop.sh, part of `make interop`.)
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "core/crc32c.h"
#include "test_util.h"
#include "trainer/tensorboard.h"

Test(tensorboard, crc32c_matches_the_published_vectors) {
    // The CRC catalogue's check value and RFC 3720 (iSCSI) appendix B.4.
    cr_expect_eq(mt_crc32c(0, "123456789", 9), 0xE3069283u);
    unsigned char b[32];
    memset(b, 0, 32);
    cr_expect_eq(mt_crc32c(0, b, 32), 0x8A9136AAu);
    memset(b, 0xFF, 32);
    cr_expect_eq(mt_crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
    cr_expect_eq(mt_crc32c(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
    cr_expect_eq(mt_crc32c(0, b, 32), 0x113FDB5Cu);
    // in pieces: the same as at once
    cr_expect_eq(mt_crc32c(mt_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

// Masked CRCs from TensorBoard's own implementation (tensorboard.compat.tensorflow_stub.
// pywrap_tensorflow.masked_crc32c, tensorboard 2.21): of the 8-byte length 8, of "moetrain", of
// the length 0 and of nothing.
Test(tensorboard, a_record_is_framed_as_tfrecord) {
    cr_expect_eq(mt_crc32c_masked("moetrain", 8), 0x5e25a06au);
    cr_expect_eq(mt_crc32c_masked("", 0), 0xa282ead8u);
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    cr_assert_eq(mt_tfrecord_write(f, "moetrain", 8), 0, "%s", mt_error_get());
    cr_assert_eq(mt_tfrecord_write(f, "", 0), 0, "%s", mt_error_get());
    rewind(f);
    unsigned char r[64];
    size_t n = fread(r, 1, sizeof r, f);
    fclose(f);
    cr_assert_eq(n, 12 + 8 + 4 + 12 + 0 + 4, "two records: 12-byte head, data, 4-byte tail each");
    cr_expect_eq(le(r, 8), 8u, "u64 length, little-endian");
    cr_expect_eq(le(r + 8, 4), 0x0f2486ffu, "masked CRC-32C of the length");
    cr_expect_eq(memcmp(r + 12, "moetrain", 8), 0);
    cr_expect_eq(le(r + 20, 4), 0x5e25a06au, "masked CRC-32C of the data");
    cr_expect_eq(le(r + 24, 8), 0u);
    cr_expect_eq(le(r + 32, 4), 0x07980329u);
    cr_expect_eq(le(r + 36, 4), 0xa282ead8u);
}

// --- a minimal protobuf reader for the check

static uint64_t varint(const unsigned char **p, const unsigned char *end) {
    uint64_t v = 0;
    for (int s = 0; *p < end; s += 7) {
        unsigned char c = *(*p)++;
        v |= (uint64_t)(c & 0x7F) << s;
        if (!(c & 0x80)) break;
    }
    return v;
}

typedef struct {
    double wall_time;
    int64_t step;
    char version[32];
    int n;
    char tags[64][64];
    float values[64];
} event;

static void decode_value(const unsigned char *p, const unsigned char *end, event *e) {
    cr_assert_lt(e->n, 64);
    while (p < end) {
        uint64_t key = varint(&p, end);
        if (key == (1 << 3 | 2)) {
            uint64_t len = varint(&p, end);
            snprintf(e->tags[e->n], 64, "%.*s", (int)len, (const char *)p);
            p += len;
        } else if (key == (2 << 3 | 5)) {
            memcpy(&e->values[e->n], p, 4);
            p += 4;
        } else
            cr_assert_fail("unexpected Value field key %llu", (unsigned long long)key);
    }
    e->n++;
}

static void decode_event(const unsigned char *p, const unsigned char *end, event *e) {
    memset(e, 0, sizeof *e);
    while (p < end) {
        uint64_t key = varint(&p, end);
        if (key == (1 << 3 | 1)) memcpy(&e->wall_time, p, 8), p += 8;
        else if (key == (2 << 3 | 0)) e->step = (int64_t)varint(&p, end);
        else if (key == (3 << 3 | 2)) {
            uint64_t len = varint(&p, end);
            snprintf(e->version, sizeof e->version, "%.*s", (int)len, (const char *)p);
            p += len;
        } else if (key == (5 << 3 | 2)) {
            uint64_t len = varint(&p, end);
            const unsigned char *s = p, *se = p + len;
            while (s < se) {
                cr_assert_eq(varint(&s, se), 1u << 3 | 2, "Summary.value");
                uint64_t vl = varint(&s, se);
                decode_value(s, s + vl, e);
                s += vl;
            }
            p = se;
        } else
            cr_assert_fail("unexpected Event field key %llu", (unsigned long long)key);
    }
}

// Reads the next record of f, checking both CRCs; 0 at the end of the file.
static size_t next_record(FILE *f, unsigned char *buf, size_t cap) {
    unsigned char head[12], tail[4];
    if (fread(head, 1, 12, f) != 12) return 0;
    uint64_t len = le(head, 8);
    cr_assert_leq(len, cap);
    cr_assert_eq(le(head + 8, 4), mt_crc32c_masked(head, 8));
    cr_assert_eq(fread(buf, 1, len, f), len);
    cr_assert_eq(fread(tail, 1, 4, f), 4u);
    cr_assert_eq(le(tail, 4), mt_crc32c_masked(buf, len));
    return (size_t)len;
}

Test(tensorboard, events_decode_to_what_was_written) {
    char tmp[64], logdir[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(logdir, sizeof logdir, "%s/runs", tmp);
    mt_tb w;
    cr_assert_eq(mt_tb_open(&w, logdir), 0, "%s", mt_error_get());
    const char *tags[] = {"train/loss", "expert_load/layer_1/expert_7"};
    float v[] = {2.5f, NAN};
    cr_assert_eq(mt_tb_scalars(&w, 300, tags, v, 2), 0, "%s", mt_error_get());
    char path[4400];
    snprintf(path, sizeof path, "%s", w.path);
    mt_tb_close(&w);
    cr_expect(strstr(path, "/runs/events.out.tfevents."), "%s", path);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    unsigned char buf[4096];
    event e;
    size_t n = next_record(f, buf, sizeof buf);
    cr_assert_gt(n, 0u);
    decode_event(buf, buf + n, &e);
    cr_expect_str_eq(e.version, "brain.Event:2", "the first event names the file version");
    cr_expect_gt(e.wall_time, 1.6e9);
    n = next_record(f, buf, sizeof buf);
    decode_event(buf, buf + n, &e);
    cr_expect_eq(e.step, 300);
    cr_assert_eq(e.n, 2);
    cr_expect_str_eq(e.tags[0], "train/loss");
    cr_expect_eq(e.values[0], 2.5f);
    cr_expect_str_eq(e.tags[1], "expert_load/layer_1/expert_7");
    cr_expect(isnan(e.values[1]));
    cr_expect_eq(next_record(f, buf, sizeof buf), 0u, "nothing after");
    fclose(f);
    mt_test_rmrf(tmp);
}

Test(tensorboard, a_run_writes_an_event_per_step, .timeout = 60) {
    char tmp[64], model[128], data[128], out[16384];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 4), 0);
    cr_expect_eq(mt_test_run(out, sizeof out, "--model %s --data %s --steps 1 --report-to tensorbored --out %s/x", model,
                             data, tmp), 2, "a bad value is a usage error: %s", out);
    cr_expect(strstr(out, "tensorboard"), "names the choices: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --quant none --steps 3 --seq 16 --report-to tensorboard "
                             "--out %s/r", model, data, tmp), 0, "%s", out);
    char runs[160], path[4400] = "";
    snprintf(runs, sizeof runs, "%s/r/runs", tmp);
    DIR *d = opendir(runs);
    cr_assert_not_null(d, "no %s", runs);
    struct dirent *de;
    int files = 0;
    while ((de = readdir(d)))
        if (strncmp(de->d_name, "events.out.tfevents.", 20) == 0) files++, snprintf(path, sizeof path, "%s/%s", runs, de->d_name);
    closedir(d);
    cr_assert_eq(files, 1);
    FILE *f = fopen(path, "rb");
    static unsigned char buf[1 << 16];
    event e;
    int steps = 0;
    size_t n = next_record(f, buf, sizeof buf);  // file_version
    while ((n = next_record(f, buf, sizeof buf)) > 0) {
        decode_event(buf, buf + n, &e);
        cr_expect_eq(e.step, ++steps);
        cr_expect_str_eq(e.tags[0], "train/loss");
        cr_expect(isfinite(e.values[0]) && e.values[0] > 0);
    }
    fclose(f);
    cr_expect_eq(steps, 3, "an event per step");
    mt_test_rmrf(tmp);
}
