// optim/schedule.c — transformers' warmup + cosine / linear / constant schedules
// (formulas and step convention in schedule.h).
#include "optim/schedule.h"

#include <math.h>
#include <string.h>

#include "core/common.h"

// Python's float(max(1, n)) for the denominators.
static double sched_den(int64_t n) { return (double)(n > 1 ? n : 1); }

double mt_lr_at(int64_t step, int64_t total, int64_t warmup, double peak, mt_schedule s) {
    if (warmup < 0) warmup = 0;
    if (step < warmup) return peak * ((double)step / sched_den(warmup));
    switch (s) {
    case MT_SCHED_COSINE: {
        double progress = (double)(step - warmup) / sched_den(total - warmup);
        double f = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
        return peak * (f > 0.0 ? f : 0.0);
    }
    case MT_SCHED_LINEAR: {
        double f = (double)(total - step) / sched_den(total - warmup);
        return peak * (f > 0.0 ? f : 0.0);
    }
    case MT_SCHED_CONSTANT:
        return peak;
    }
    return peak;
}

static const char *const sched_names[] = {
    [MT_SCHED_COSINE] = "cosine",
    [MT_SCHED_LINEAR] = "linear",
    [MT_SCHED_CONSTANT] = "constant",
};

int mt_schedule_parse(const char *text, mt_schedule *out) {
    for (size_t i = 0; i < MT_ARRAY_LEN(sched_names); i++)
        if (text && strcmp(text, sched_names[i]) == 0) {
            *out = (mt_schedule)i;
            return 0;
        }
    mt_error_set("schedule '%s': expected cosine, linear or constant", text ? text : "(null)");
    return -1;
}

const char *mt_schedule_name(mt_schedule s) {
    return (unsigned)s < MT_ARRAY_LEN(sched_names) ? sched_names[s] : "?";
}
