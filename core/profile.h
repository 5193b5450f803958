// core/profile.h — per-operation timing of a training step on the cuda backend (MT_PROFILE=1).
//
// The step's device time is cut at every change of "current region" by a CUDA event recorded on
// the backend's stream: the stream time between two consecutive events belongs to the region
// that was current between them (innermost wins), so the rows partition the timed span and sum
// to it. Regions are labelled by the code that knows what runs (model/, optim/): a name (the
// roofline's op names, scripts/step_model.h) and a phase (forward, recompute, backward,
// optimizer). FLOPs and bytes are added by the call sites from the real shapes (cuBLASLt
// matmul: 2·M·N·K; grouped expert GEMMs; attention's S² terms), never estimated afterwards.
// Host waits (synchronize, device-to-host copies) are a region of their own on the stream: the
// bubble between the device reaching the wait and the host's next command.
//
//   mt_prof_step_begin(be);   ... forward, backward, optimizer ...   mt_prof_step_end(be);
//   mt_prof_print(stdout, "case C s=4096");  mt_prof_write_json("prof.json", "case C s=4096");
//
// Off (MT_PROFILE unset and mt_prof_enable not called), every hook is one branch on a global
// flag and no event is created. One profiler per process (one GPU per rank).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Nonzero between mt_prof_step_begin and mt_prof_step_end of an enabled profiler: the one
// thing a hook reads when profiling is off.
extern int mt_prof_active;

enum { MT_PROF_NAME = 48, MT_PROF_MAX_ROWS = 128, MT_PROF_DEPTH = 16 };

// Phases, as scripts/step_model.h spells them.
enum { MT_PROF_FWD = 'F', MT_PROF_RECOMPUTE = 'R', MT_PROF_BWD = 'B', MT_PROF_OPT = 'O' };

typedef struct {
    char name[MT_PROF_NAME];
    char phase;
    uint64_t calls;       // kernels / library calls counted into the row
    double flops, bytes;  // summed over the profiled steps
    double ms;            // stream time while the row was current (events)
    double host_ms;       // host waits only: time the host blocked (host clock)
    int untimed;          // work inside another row's kernels (dequant in the grouped GEMMs)
} mt_prof_row;

typedef struct {
    int steps;            // steps profiled since mt_prof_reset
    double step_ms;       // host clock around each step, synchronized at both ends, summed
    double rows_ms;       // Σ rows' ms
    double flops, bytes;  // Σ rows'
    int emulated;         // the device is tests/cudasim: times are CPU-emulated
    int n;
    mt_prof_row row[MT_PROF_MAX_ROWS];
} mt_prof_table;

// MT_PROFILE=1 in the environment (read at the first call), or this call, turns it on.
void mt_prof_enable(int on);
int mt_prof_enabled(void);
// Drops every row and the step count (the events are kept for reuse).
void mt_prof_reset(void);
// Brackets one step on `be` (a cuda backend): synchronizes, starts the host clock, records the
// first event. No-ops when disabled. -1 with an error for another backend kind.
int mt_prof_step_begin(mt_backend *be);
void mt_prof_step_end(mt_backend *be);

// Regions. push makes (name, current phase) current until its pop; alt is the name the region's
// adapter part takes (a Linear's LoRA: mt_prof_push_alt), NULL for the same name. Each hook is
// inline: one branch on mt_prof_active when off; the *_on functions do the work.
void mt_prof_push2_on(const char *name, const char *alt);
void mt_prof_push_alt_on(void);
void mt_prof_pop_on(void);
void mt_prof_count_on(double flops, double bytes);
void mt_prof_count_untimed_on(const char *name, double flops, double bytes);
void mt_prof_wait_begin_on(double bytes);
void mt_prof_wait_end_on(void);
static inline void mt_prof_push2(const char *name, const char *alt) {
    if (mt_prof_active) mt_prof_push2_on(name, alt);
}
static inline void mt_prof_push(const char *name) {
    if (mt_prof_active) mt_prof_push2_on(name, NULL);
}
// Pushes the innermost region's alt name (its own name when it has none).
static inline void mt_prof_push_alt(void) {
    if (mt_prof_active) mt_prof_push_alt_on();
}
static inline void mt_prof_pop(void) {
    if (mt_prof_active) mt_prof_pop_on();
}
// Adds one call's work to the current region.
static inline void mt_prof_count(double flops, double bytes) {
    if (mt_prof_active) mt_prof_count_on(flops, bytes);
}
// Adds work that runs inside another region's kernels to row (name, current phase), no time.
static inline void mt_prof_count_untimed(const char *name, double flops, double bytes) {
    if (mt_prof_active) mt_prof_count_untimed_on(name, flops, bytes);
}
// Host waits (core/backend_cuda.cu): begin before the copy or synchronize, end after it returns.
static inline void mt_prof_wait_begin(double bytes) {
    if (mt_prof_active) mt_prof_wait_begin_on(bytes);
}
static inline void mt_prof_wait_end(void) {
    if (mt_prof_active) mt_prof_wait_end_on();
}
// The phase of regions pushed from now on; returns the previous one (to restore it).
char mt_prof_set_phase(char phase);

// The table of the steps profiled since mt_prof_reset (sums; the printers divide by steps).
const mt_prof_table *mt_prof_table_get(void);
// Text: one row per (name, phase), then "unattributed" (step − Σ rows) and the step total.
void mt_prof_print(FILE *f, const char *title);
// JSON: {"title", "device_time", "steps", "step_ms", "rows": [...], "totals": {...}}. 0 or -1
// with an error.
int mt_prof_write_json(const char *path, const char *title);

// For core/profile_cuda.cu: the event timeline of the profiler (core/profile.c).
void *mt_prof_cuda_stream(mt_backend *be);
void mt_prof_cuda_reserve(int n);                     // at least n events created
void mt_prof_cuda_record(void *stream, int index);   // event `index` (grown as needed)
float mt_prof_cuda_elapsed(int from, int to);        // ms between two recorded events
void mt_prof_cuda_sync(void *stream);
int mt_prof_cuda_emulated(void);
void mt_prof_cuda_free(void);

#ifdef __cplusplus
}
#endif
