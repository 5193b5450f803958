// core/profile.c — the profiler's rows, its region stack and event timeline, and the report
// (text and JSON). The CUDA calls (events on the backend's stream) are core/profile_cuda.cu's;
// a build without CUDA has no device to time, and mt_prof_step_begin refuses.
#include "core/profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/common.h"

int mt_prof_active;

// Where a region's time goes when no code has labelled it (copies, fills, allocation): a row
// of its own, so that unattributed is only what lies outside the events.
static const char *const UNLABELLED = "other (unlabelled)";
static const char *const HOST_WAITS = "host waits";

typedef struct {
    int row;
    const char *alt;
} frame;

static struct {
    int enabled;  // -1: MT_PROFILE not read yet
    mt_backend *be;
    void *stream;
    char phase;
    frame stack[MT_PROF_DEPTH];
    int depth;
    int cur;            // row current on the stream since the last event
    int *ev_row;        // row current from event i to event i + 1
    int n_ev, cap_ev;
    double t0_ms;       // host clock at the step's start
    double wait_t0_ms;  // host clock at the open host wait's start
    mt_prof_table t;
} P = {.enabled = -1};

static double host_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void mt_prof_enable(int on) { P.enabled = !!on; }

int mt_prof_enabled(void) {
    if (P.enabled < 0) {
        const char *v = getenv("MT_PROFILE");
        P.enabled = v && *v && strcmp(v, "0") != 0;
    }
    return P.enabled;
}

void mt_prof_reset(void) {
    memset(&P.t, 0, sizeof P.t);
}

const mt_prof_table *mt_prof_table_get(void) { return &P.t; }

// The row (name, phase), added on first use. The table is fixed-size: a full one is a bug in
// the labels (each call site names one of a few dozen ops), so it is fatal.
static int row_of(const char *name, char phase) {
    for (int i = 0; i < P.t.n; i++)
        if (P.t.row[i].phase == phase && !strcmp(P.t.row[i].name, name)) return i;
    if (P.t.n == MT_PROF_MAX_ROWS) mt_fatal(MT_EXIT_ERROR, "profile: more than %d rows (adding %s)", MT_PROF_MAX_ROWS, name);
    mt_prof_row *r = &P.t.row[P.t.n];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->phase = phase;
    return P.t.n++;
}

// The stream's current row becomes `row` (-1: the end of the step): one event, where it changes.
static void transition(int row) {
    if (row == P.cur) return;
    if (P.n_ev == P.cap_ev) {
        P.cap_ev = P.cap_ev ? 2 * P.cap_ev : 1024;
        P.ev_row = mt_xrealloc(P.ev_row, (size_t)P.cap_ev * sizeof *P.ev_row);
    }
    mt_prof_cuda_record(P.stream, P.n_ev);
    P.ev_row[P.n_ev++] = row;
    P.cur = row;
}

int mt_prof_step_begin(mt_backend *be) {
    if (!mt_prof_enabled()) return 0;
    if (!be || be->ops->kind != MT_BACKEND_CUDA) {
        mt_error_set("profile: only a cuda backend's step can be timed (got %s)", be ? be->ops->name : "none");
        return -1;
    }
    P.be = be;
    P.stream = mt_prof_cuda_stream(be);
    if (!P.stream) return -1;
    P.t.emulated = mt_prof_cuda_emulated();
    mt_prof_cuda_reserve(MT_MAX(1024, P.n_ev + P.n_ev / 4));  // the last step's changes, and room
    mt_prof_cuda_sync(P.stream);  // not a host wait of the step: before it
    P.t0_ms = host_ms();
    P.n_ev = 0, P.depth = 0, P.cur = -2;
    P.phase = MT_PROF_FWD;
    P.stack[P.depth++] = (frame){row_of(UNLABELLED, P.phase), NULL};
    transition(P.stack[0].row);
    mt_prof_active = 1;
    return 0;
}

void mt_prof_step_end(mt_backend *be) {
    if (!mt_prof_active || be != P.be) return;
    transition(-1);
    mt_prof_active = 0;
    mt_prof_cuda_sync(P.stream);
    P.t.step_ms += host_ms() - P.t0_ms;
    for (int i = 0; i + 1 < P.n_ev; i++) {
        double ms = mt_prof_cuda_elapsed(i, i + 1);
        P.t.row[P.ev_row[i]].ms += ms;
        P.t.rows_ms += ms;
    }
    P.t.flops = P.t.bytes = 0;
    for (int i = 0; i < P.t.n; i++) P.t.flops += P.t.row[i].flops, P.t.bytes += P.t.row[i].bytes;
    P.t.steps++;
    P.depth = 0;
}

void mt_prof_push2_on(const char *name, const char *alt) {
    if (!mt_prof_active) return;
    if (P.depth == MT_PROF_DEPTH) mt_fatal(MT_EXIT_ERROR, "profile: regions nested deeper than %d at %s", MT_PROF_DEPTH, name);
    int row = row_of(name, P.phase);
    P.stack[P.depth++] = (frame){row, alt};
    transition(row);
}

void mt_prof_push_alt_on(void) {
    if (!mt_prof_active) return;
    const frame *f = &P.stack[P.depth - 1];
    mt_prof_push2_on(f->alt ? f->alt : P.t.row[f->row].name, NULL);
}

void mt_prof_pop_on(void) {
    if (!mt_prof_active) return;
    if (P.depth <= 1) mt_fatal(MT_EXIT_ERROR, "profile: a region popped that was never pushed");
    P.depth--;
    transition(P.stack[P.depth - 1].row);
}

char mt_prof_set_phase(char phase) {
    char old = P.phase;
    if (!mt_prof_active) return old;
    P.phase = phase;
    if (P.depth == 1) {  // the unlabelled time follows the phase
        P.stack[0].row = row_of(UNLABELLED, phase);
        transition(P.stack[0].row);
    }
    return old;
}

void mt_prof_count_on(double flops, double bytes) {
    if (!mt_prof_active) return;
    mt_prof_row *r = &P.t.row[P.stack[P.depth - 1].row];
    r->calls++, r->flops += flops, r->bytes += bytes;
}

void mt_prof_count_untimed_on(const char *name, double flops, double bytes) {
    if (!mt_prof_active) return;
    mt_prof_row *r = &P.t.row[row_of(name, P.phase)];
    r->calls++, r->flops += flops, r->bytes += bytes, r->untimed = 1;
}

void mt_prof_wait_begin_on(double bytes) {
    if (!mt_prof_active) return;
    mt_prof_push2_on(HOST_WAITS, NULL);
    mt_prof_count_on(0, bytes);
    P.wait_t0_ms = host_ms();
}

void mt_prof_wait_end_on(void) {
    if (!mt_prof_active) return;
    P.t.row[P.stack[P.depth - 1].row].host_ms += host_ms() - P.wait_t0_ms;
    mt_prof_pop_on();
}

// ---------------------------------------------------------------------------------------------
// Report

static const char *phase_name(char p) {
    switch (p) {
    case MT_PROF_FWD: return "forward";
    case MT_PROF_RECOMPUTE: return "recompute";
    case MT_PROF_BWD: return "backward";
    case MT_PROF_OPT: return "optimizer";
    default: return "?";
    }
}

// Rows in phase order (forward, recompute, backward, optimizer), first use within a phase.
static int phase_rank(char p) {
    const char *order = "FRBO";
    const char *at = strchr(order, p);
    return at ? (int)(at - order) : 4;
}

static int *ordered_rows(void) {
    int *ix = mt_xmalloc((size_t)(P.t.n ? P.t.n : 1) * sizeof *ix), k = 0;
    for (int rank = 0; rank <= 4; rank++)
        for (int i = 0; i < P.t.n; i++)
            if (phase_rank(P.t.row[i].phase) == rank) ix[k++] = i;
    return ix;
}

static const char *device_time_label(void) {
    return P.t.emulated ? "CPU-emulated (tests/cudasim: not GPU time)" : "GPU (CUDA events)";
}

void mt_prof_print(FILE *f, const char *title) {
    const mt_prof_table *t = &P.t;
    double steps = t->steps ? t->steps : 1, step_ms = t->step_ms / steps;
    double unattr = (t->step_ms - t->rows_ms) / steps;
    fprintf(f, "profile: %s — %d step(s), per step; times %s\n", title ? title : "", t->steps, device_time_label());
    fprintf(f, "%-38s %-9s %7s %10s %11s %11s %9s %9s %6s\n", "op", "phase", "calls", "ms", "GFLOP", "MB",
            "TFLOP/s", "GB/s", "share");
    int *ix = ordered_rows();
    for (int k = 0; k < t->n; k++) {
        const mt_prof_row *r = &t->row[ix[k]];
        double ms = r->ms / steps, fl = r->flops / steps, by = r->bytes / steps;
        char tf[16] = "-", gb[16] = "-";
        if (ms > 0 && fl > 0) snprintf(tf, sizeof tf, "%.2f", fl / (ms * 1e-3) / 1e12);
        if (ms > 0 && by > 0) snprintf(gb, sizeof gb, "%.1f", by / (ms * 1e-3) / 1e9);
        fprintf(f, "%-38s %-9s %7.0f %10.3f %11.4f %11.3f %9s %9s %5.1f%%%s", r->name, phase_name(r->phase),
                r->calls / steps, ms, fl / 1e9, by / 1e6, tf, gb, step_ms > 0 ? 100 * ms / step_ms : 0.0,
                r->untimed ? "  (inside the grouped GEMMs' time)" : "");
        if (r->host_ms > 0) fprintf(f, "  host blocked %.3f ms", r->host_ms / steps);
        fputc('\n', f);
    }
    free(ix);
    fprintf(f, "%-38s %-9s %7s %10.3f %11s %11s %9s %9s %5.1f%%\n", "unattributed (step - rows)", "", "", unattr, "", "",
            "", "", step_ms > 0 ? 100 * unattr / step_ms : 0.0);
    fprintf(f, "%-38s %-9s %7s %10.3f %11.4f %11.3f %9.2f %9s %5.1f%%\n", "step (host clock, synchronized)", "", "",
            step_ms, t->flops / steps / 1e9, t->bytes / steps / 1e6,
            step_ms > 0 ? t->flops / steps / (step_ms * 1e-3) / 1e12 : 0.0, "", 100.0);
}

// A JSON string of s (the names are plain ASCII; quotes and backslashes escaped all the same).
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('"', f);
}

int mt_prof_write_json(const char *path, const char *title) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);  // written whole, then renamed: never half a file
    FILE *f = fopen(tmp, "w");
    if (!f) {
        mt_error_set("profile: cannot write %s", tmp);
        return -1;
    }
    const mt_prof_table *t = &P.t;
    double steps = t->steps ? t->steps : 1;
    fprintf(f, "{\"title\": ");
    json_str(f, title ? title : "");
    fprintf(f, ", \"device_time\": ");
    json_str(f, device_time_label());
    fprintf(f, ", \"emulated\": %s, \"steps\": %d, \"rows\": [", t->emulated ? "true" : "false", t->steps);
    int *ix = ordered_rows();
    for (int k = 0; k < t->n; k++) {
        const mt_prof_row *r = &t->row[ix[k]];
        fprintf(f, "%s\n  {\"name\": ", k ? "," : "");
        json_str(f, r->name);
        fprintf(f, ", \"phase\": \"%c\", \"calls\": %.17g, \"ms\": %.17g, \"flops\": %.17g, \"bytes\": %.17g, "
                   "\"host_blocked_ms\": %.17g, \"untimed\": %s}",
                r->phase, r->calls / steps, r->ms / steps, r->flops / steps, r->bytes / steps, r->host_ms / steps,
                r->untimed ? "true" : "false");
    }
    free(ix);
    fprintf(f, "\n], \"totals\": {\"step_ms\": %.17g, \"rows_ms\": %.17g, \"unattributed_ms\": %.17g, \"flops\": %.17g, "
               "\"bytes\": %.17g}}\n",
            t->step_ms / steps, t->rows_ms / steps, (t->step_ms - t->rows_ms) / steps, t->flops / steps,
            t->bytes / steps);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        mt_error_set("profile: writing %s failed", path);
        remove(tmp);
        return -1;
    }
    return 0;
}

#ifndef MT_CUDA
// Without CUDA there is no stream to time: mt_prof_step_begin refuses before any of these runs.
void *mt_prof_cuda_stream(mt_backend *be) {
    (void)be;
    mt_error_set("profile: built without CUDA");
    return NULL;
}
void mt_prof_cuda_reserve(int n) { (void)n; }
void mt_prof_cuda_record(void *stream, int index) { (void)stream, (void)index; }
float mt_prof_cuda_elapsed(int from, int to) { return (void)from, (void)to, 0.0f; }
void mt_prof_cuda_sync(void *stream) { (void)stream; }
int mt_prof_cuda_emulated(void) { return 0; }
void mt_prof_cuda_free(void) {}
#endif
