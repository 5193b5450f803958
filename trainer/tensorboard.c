// trainer/tensorboard.c — TensorBoard event files: TFRecord framing around hand-encoded Event
// protobufs (the format is in tensorboard.h).
#include "trainer/tensorboard.h"

#include <errno.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/common.h"
#include "core/crc32c.h"
#include "core/fileio.h"

int mt_tfrecord_write(FILE *f, const void *data, size_t n) {
    unsigned char head[12];
    uint64_t len = n;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
    uint32_t c = mt_crc32c_masked(head, 8);
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(c >> (8 * i));
    unsigned char tail[4];
    c = mt_crc32c_masked(data, n);
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(c >> (8 * i));
    if (fwrite(head, 1, 12, f) != 12 || fwrite(data, 1, n, f) != n || fwrite(tail, 1, 4, f) != 4 || fflush(f) != 0) {
        mt_error_set("event file: write failed: %s", strerror(errno));
        return -1;
    }
    return 0;
}

// --- protobuf encoding: the wire format's varints, fixed64/fixed32 and length-delimited fields

static void put(mt_tb *w, const void *p, size_t k) {
    if (w->n + k > w->cap) {
        w->cap = MT_MAX(2 * w->cap, w->n + k + 256);
        w->buf = mt_xrealloc(w->buf, w->cap);
    }
    memcpy(w->buf + w->n, p, k);
    w->n += k;
}

static void put_varint(mt_tb *w, uint64_t v) {
    unsigned char b[10];
    int k = 0;
    do {
        b[k] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) b[k] |= 0x80;
        k++;
    } while (v);
    put(w, b, (size_t)k);
}

static void put_tag(mt_tb *w, unsigned field, unsigned wire) { put_varint(w, (uint64_t)(field << 3 | wire)); }

static void put_fixed(mt_tb *w, uint64_t v, int bytes) {
    unsigned char b[8];
    for (int i = 0; i < bytes; i++) b[i] = (unsigned char)(v >> (8 * i));
    put(w, b, (size_t)bytes);
}

static void put_bytes(mt_tb *w, unsigned field, const void *p, size_t k) {
    put_tag(w, field, 2);
    put_varint(w, k);
    put(w, p, k);
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

// Event fields 1 (wall_time) and 2 (step) into w->buf, emptied first.
static void event_head(mt_tb *w, int64_t step) {
    double t = wall_time();
    uint64_t bits;
    memcpy(&bits, &t, 8);
    w->n = 0;
    put_tag(w, 1, 1);
    put_fixed(w, bits, 8);
    put_tag(w, 2, 0);
    put_varint(w, (uint64_t)step);
}

int mt_tb_open(mt_tb *w, const char *logdir) {
    memset(w, 0, sizeof *w);
    if (mt_mkdir_p(logdir) != 0) return -1;
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d", logdir, (long long)wall_time(), host,
             (int)getpid());
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        mt_error_set("%s: cannot create the TensorBoard event file: %s", w->path, strerror(errno));
        return -1;
    }
    event_head(w, 0);
    put_bytes(w, 3, "brain.Event:2", strlen("brain.Event:2"));
    if (mt_tfrecord_write(w->f, w->buf, w->n) != 0) {
        mt_error_prefix("%s", w->path);
        mt_tb_close(w);
        return -1;
    }
    return 0;
}

int mt_tb_scalars(mt_tb *w, int64_t step, const char *const *tags, const float *values, int n) {
    if (!w->f) return 0;
    // Summary: each Value is length-delimited, so it is encoded after the event's head into the
    // same buffer, then the lengths are known: Value = tag (1) + simple_value (2, fixed32).
    size_t summary = 0;
    for (int i = 0; i < n; i++) {
        size_t t = strlen(tags[i]), v = 1 + (t < 128 ? 1 : t < 16384 ? 2 : 3) + t + 5;
        summary += 1 + (v < 128 ? 1 : v < 16384 ? 2 : 3) + v;
    }
    event_head(w, step);
    put_tag(w, 5, 2);
    put_varint(w, summary);
    size_t start = w->n;
    for (int i = 0; i < n; i++) {
        size_t t = strlen(tags[i]);
        uint32_t bits;
        memcpy(&bits, &values[i], 4);
        put_tag(w, 1, 2);
        put_varint(w, 1 + (t < 128 ? 1 : t < 16384 ? 2 : 3) + t + 5);
        put_bytes(w, 1, tags[i], t);
        put_tag(w, 2, 5);
        put_fixed(w, bits, 4);
    }
    if (w->n - start != summary) {  // the sizes above and the encoding disagree: a bug, not input
        mt_error_set("%s: event encoding: summary of %zu bytes, %zu expected", w->path, w->n - start, summary);
        return -1;
    }
    if (mt_tfrecord_write(w->f, w->buf, w->n) != 0) return mt_error_prefix("%s", w->path), -1;
    return 0;
}

void mt_tb_close(mt_tb *w) {
    if (w->f) fclose(w->f);
    free(w->buf);
    memset(w, 0, sizeof *w);
}
