// scripts/profile_table.h — a profiled step (core/profile.h, MT_PROFILE=1) printed line by line
// beside the roofline's projection of the same op (scripts/step_model.h counts it,
// scripts/step_time.h times it): measured ms, projected ms, measured/projected, and the FLOPs
// of both. Rows match by (name, phase); a measured row the model lacks (host waits, unlabelled
// work) and a model row nothing measured are printed with "-" on the missing side.
//
//   step_ops ops; step_build(&sh, &ops);
//   profile_table_print(stdout, mt_prof_table_get(), &ops);
#pragma once
#include <stdio.h>
#include <string.h>

#include "core/profile.h"
#include "scripts/step_model.h"
#include "scripts/step_time.h"

// The model's op (name, phase), or NULL.
static inline const step_op *profile_table_model_op(const step_ops *ops, const char *name, char phase) {
    for (int i = 0; i < ops->n; i++)
        if (ops->op[i].phase == phase && !strcmp(ops->op[i].name, name)) return &ops->op[i];
    return NULL;
}

static inline void profile_table_line(FILE *f, const char *name, char phase, const mt_prof_row *r, const step_op *o,
                                      double steps) {
    int cb;
    double ms = r ? r->ms / steps : -1, gf = r ? r->flops / steps / 1e9 : -1;
    double pms = o ? op_time(o, &cb) * 1e3 : -1, pgf = o ? o->flops / 1e9 : -1;
    char a[16] = "-", b[16] = "-", c[16] = "-", d[16] = "-", e[16] = "-", g[16] = "-";
    if (r) snprintf(a, sizeof a, "%.3f", ms), snprintf(c, sizeof c, "%.4f", gf);
    if (o) snprintf(b, sizeof b, "%.3f", pms), snprintf(d, sizeof d, "%.4f", pgf);
    if (r && o && pms > 0 && !r->untimed) snprintf(e, sizeof e, "%.2f", ms / pms);
    if (r && o && pgf > 0) snprintf(g, sizeof g, "%.4f", gf / pgf);
    fprintf(f, "%-38s %c %10s %10s %8s %11s %11s %8s\n", name, phase, a, b, e, c, d, g);
}

// Per step: every measured row in the profile's order, then the model's ops nothing measured.
// Time of an "untimed" row (work inside another row's kernels) is not compared.
static inline void profile_table_print(FILE *f, const mt_prof_table *t, const step_ops *ops) {
    double steps = t->steps ? t->steps : 1;
    fprintf(f, "measured (%s) beside projected (scripts/roofline.c's model of the %s), per step\n",
            t->emulated ? "CPU-emulated: times meaningless" : "GPU, CUDA events", step_dev->name);
    fprintf(f, "%-38s %c %10s %10s %8s %11s %11s %8s\n", "op", 'p', "ms", "proj. ms", "meas/pr", "GFLOP",
            "proj. GFLOP", "meas/pr");
    for (int i = 0; i < t->n; i++)
        profile_table_line(f, t->row[i].name, t->row[i].phase, &t->row[i],
                           profile_table_model_op(ops, t->row[i].name, t->row[i].phase), steps);
    for (int i = 0; i < ops->n; i++) {
        int seen = 0;
        for (int j = 0; j < t->n && !seen; j++)
            seen = t->row[j].phase == ops->op[i].phase && !strcmp(t->row[j].name, ops->op[i].name);
        if (!seen) profile_table_line(f, ops->op[i].name, ops->op[i].phase, NULL, &ops->op[i], steps);
    }
    double proj = 0;
    for (int i = 0; i < ops->n; i++) {
        int cb;
        proj += op_time(&ops->op[i], &cb) * 1e3;
    }
    fprintf(f, "%-38s %c %10.3f %10.3f %8.2f %11.4f %11.4f %8.4f\n", "step", ' ', t->step_ms / steps, proj,
            proj > 0 ? t->step_ms / steps / proj : 0.0, t->flops / steps / 1e9, step_hw_flops(ops) / 1e9,
            step_hw_flops(ops) > 0 ? t->flops / steps / step_hw_flops(ops) : 0.0);
}
