// trainer/metrics.h — the metrics JSONL and the progress line.
//
// JSONL: one object per line, flushed after each, each with "type":
//   {"type":"step","step":12,"total":1000,"loss":2.31,"ce":2.3,"aux":0.012,"z":0.0001,
//    "lr":0.0001,"grad_norm":0.53,"tokens_per_s":1234.5,"eta_s":3600.2,"peak_bytes":123456,
//    "host_syncs":35,"skipped":false,"skips":0,"elapsed_s":12.5,"expert_load":[[0.13,0.12,...],...]}
//   {"type":"<kind>","elapsed_s":..., <the caller's fields>}      from mt_metrics_event
// Numbers: doubles as %.9g, expert loads as %.6g, integers as integers — always valid JSON;
// a NaN or infinite value is written as null (a step whose loss or grad norm is not finite is
// the caller's to mark skipped). "host_syncs": the step's host waits for the device, counted by
// the cuda backend (one per MoE layer for its expert row counts, plus a few; 0 on the cpu).
// "skips" counts the skipped steps recorded so far by this writer. "expert_load" is [layers][experts], the fraction of the layer's tokens each expert
// got (the caller's numbers: with top-k routing counted per assignment a row sums to k), or
// null when the record has none. Keys "type" and "elapsed_s"
// are reserved in events.
//
// Progress goes to stdout (where mt_info goes too), as key=value fields:
//   step=12/1000 loss=2.3100 aux=0.0120 lr=1.00e-04 gnorm=0.530 tok/s=1235 eta=1h00m peak=1.23GiB
// On a terminal it is one live line rewritten with \r (cleared to its end); mt_metrics_event
// and mt_metrics_close end it, so their output starts on a line of its own. Otherwise (a file,
// a pipe) a plain line every `every` steps (default 1: every step), and always for the first
// record of this writer, the last step (step == total) and skipped steps. `out`, `tty` and `every` may be changed after open.
#pragma once
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_metrics {
    FILE *jsonl;       // NULL: no metrics file
    FILE *out;         // progress stream (stdout)
    int tty;           // out is a terminal: live line
    int every;         // non-tty: a progress line every this many steps
    double t0;         // monotonic seconds at open
    int line_open;     // a live line is on screen without its newline
    int64_t skips;     // skipped steps recorded
    int64_t records;   // step records written
    char path[1024];
    struct mt_tb *tb;  // --report-to tensorboard: steps and evals also as events (tensorboard.h)
} mt_metrics;

// Also writes every step record (loss, aux, lr, grad norm, tokens/s, expert load per layer and
// expert) and every "eval" event's loss to a TensorBoard event file in `logdir`. 0 or -1.
int mt_metrics_tensorboard(mt_metrics *m, const char *logdir);

// NULL path: no file, progress only. The file is created (truncated). 0, or -1 with an error.
int mt_metrics_open(mt_metrics *m, const char *path);
// append = 1 continues an existing file (a resumed run); a partial last line left by a crash is
// ended first, so every line stays one JSON object. Plots keep the last record of each step.
int mt_metrics_open_ex(mt_metrics *m, const char *path, int append);

// One step's record (see above for the JSON). expert_load: layers × experts floats, row-major,
// or NULL.
typedef struct mt_step_record {
    int64_t step, total;
    double loss, ce, aux, z, lr, grad_norm, tokens_per_s, eta_s;
    double seq_aux;   // DeepSeek's sequence-wise balance loss, written where has_seq_aux
    int has_seq_aux;
    uint64_t peak_bytes;
    uint64_t host_syncs;  // times the host waited for the device this step (cuda; 0 on the cpu)
    int skipped;
    int layers, experts;
    const float *expert_load;
} mt_step_record;

void mt_metrics_step(mt_metrics *m, const mt_step_record *r);  // JSONL line (flushed) + progress
// An event ("eval", "save", "skip", ...): json_fields is the inside of a JSON object
// ("\"step\":100,\"loss\":2.1", or NULL/"" for none). It is written to the JSONL and printed as
// "<kind>: key=value ..." on the progress stream. Fields that do not parse are kept as the
// string "bad_fields" (and a warning logged), so the file stays valid JSONL.
void mt_metrics_event(mt_metrics *m, const char *kind, const char *json_fields);
void mt_metrics_close(mt_metrics *m);

// Seconds since open (monotonic).
double mt_metrics_elapsed(const mt_metrics *m);
// "1h02m", "12m03s", "45s"; "?" for a negative or non-finite value.
void mt_format_duration(char *buf, size_t n, double seconds);
// "812MiB", "1.23GiB", "512B".
void mt_format_bytes(char *buf, size_t n, uint64_t bytes);

#ifdef __cplusplus
}
#endif
