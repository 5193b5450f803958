// trainer/tensorboard.h — TensorBoard event files (--report-to tensorboard), written without a
// protobuf library: the few Event fields TensorBoard reads, hand-encoded, in TFRecord framing.
//
// A file OUT/runs/events.out.tfevents.<unix time>.<host>.<pid> (a new one per run, resumed runs
// included: TensorBoard reads every event file of the folder, ordered by step) holds records
//   u64 length (little-endian) | u32 masked CRC-32C of those 8 bytes | data | u32 masked CRC-32C of data
// each data an Event message:
//   1 wall_time (double, seconds since 1970)   2 step (int64)
//   3 file_version "brain.Event:2" (the first record only)   5 summary (Summary)
// Summary: repeated 1 value (Value); Value: 1 tag (string), 2 simple_value (float).
// One event per training step holds every scalar of it (trainer/metrics.c: train/loss, train/aux,
// train/learning_rate, train/grad_norm, train/tokens_per_s, expert_load/layer_L/expert_E), one
// per evaluation eval/loss. Records are flushed as written; a crash leaves whole records and
// possibly one torn last record, which TensorBoard's reader stops at.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_tb {
    FILE *f;
    char path[4400];
    unsigned char *buf;  // the event being encoded
    size_t n, cap;
} mt_tb;

// Creates `logdir` and a new event file in it, holding the file_version record. 0, or -1 with an
// error naming the path.
int mt_tb_open(mt_tb *w, const char *logdir);
// One event at `step` holding n scalars tags[i] = values[i] (a NaN is written as NaN). 0 or -1.
int mt_tb_scalars(mt_tb *w, int64_t step, const char *const *tags, const float *values, int n);
void mt_tb_close(mt_tb *w);

// One TFRecord (the framing above) of data[0..n) to f. 0, or -1 with an error.
int mt_tfrecord_write(FILE *f, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
