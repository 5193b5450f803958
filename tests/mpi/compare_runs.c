// tests/mpi/compare_runs.c — do two training runs agree? `compare_runs A B TOL`
//
// `compare_runs A B LOSS_TOL [TENSOR_TOL]` compares the losses of the steps both
// A/metrics.jsonl and B/metrics.jsonl record (relative error; B may hold the tail of A's steps,
// as a resumed run writing elsewhere does) and every tensor of the runs' product
// (adapter/adapter_model.safetensors and, where A has it, adapter/router_bias.safetensors; or
// trained.safetensors): the relative L2 error
// ‖a − b‖ / ‖a‖ of each tensor (an all-zero `a` needs b all zero). TENSOR_TOL defaults to
// LOSS_TOL; both 0 ask for the same bits. Prints the worst of each and "same" or "DIFFERENT";
// exit 0 when within the tolerances, 1 when not, 2 when a file is missing, no step is common,
// or the runs differ in tensors.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"

enum { MAX_STEPS = 4096 };

// The last record of each step (a resumed run may repeat one); NAN where a step has none; the
// last eval's loss into *eval (NAN without one). Returns the highest step.
static int losses(const char *dir, double *loss, double *eval) {
    for (int s = 0; s < MAX_STEPS; s++) loss[s] = NAN;
    *eval = NAN;
    char path[4200], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (mt_read_file(path, 64 << 20, &text, &len) != 0) return -1;
    int steps = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *type = cJSON_GetObjectItem(j, "type"), *step = cJSON_GetObjectItem(j, "step");
        const cJSON *l = cJSON_GetObjectItem(j, "loss");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "eval") && cJSON_IsNumber(l)) *eval = l->valuedouble;
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "step") && cJSON_IsNumber(step) && cJSON_IsNumber(l)) {
            int s = (int)step->valuedouble;
            if (s >= 1 && s <= MAX_STEPS) {
                loss[s - 1] = l->valuedouble;
                steps = s > steps ? s : steps;
            }
        }
        cJSON_Delete(j);
    }
    free(text);
    return steps;
}

static int open_product(const char *dir, mt_st_file *f) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter/adapter_model.safetensors", dir);
    if (mt_st_file_open(f, path) == 0) return 0;
    snprintf(path, sizeof path, "%s/trained.safetensors", dir);
    return mt_st_file_open(f, path);
}

static double as_double(const mt_st_tensor *t, size_t i) {
    mt_dtype dt;
    if (mt_st_float_dtype(t->dtype, &dt) != 0) return NAN;
    float x;
    mt_convert(&x, MT_F32, (const char *)t->data + mt_dtype_bytes(dt, i), dt, 1);
    return x;
}

typedef struct {
    double worst;      // the worst relative L2 error of a tensor
    const char *name;  // its name (static storage: copied)
    size_t n;          // tensors compared
} tensor_diff;

// Every tensor of a against b's of the same name (b_path names b in errors); 2 when they differ in
// names, dtypes or sizes.
static int compare_files(const mt_st_file *fa, const mt_st_file *fb, const char *b_path, tensor_diff *d,
                         int *same_bits) {
    static char worst_name[256];
    if (fa->n_tensors != fb->n_tensors) {
        fprintf(stderr, "compare_runs: %zu tensors against %zu\n", fa->n_tensors, fb->n_tensors);
        return 2;
    }
    for (size_t i = 0; i < fa->n_tensors; i++) {
        const mt_st_tensor *a = &fa->tensors[i], *b = mt_st_file_find(fb, a->name);
        if (!b || b->nbytes != a->nbytes || strcmp(a->dtype, b->dtype) != 0) {
            fprintf(stderr, "compare_runs: tensor '%s' is missing from %s or differs in dtype or size\n", a->name,
                    b_path);
            return 2;
        }
        *same_bits &= memcmp(a->data, b->data, a->nbytes) == 0;
        mt_dtype dt;
        if (mt_st_float_dtype(a->dtype, &dt) != 0) {
            fprintf(stderr, "compare_runs: tensor '%s': %s\n", a->name, mt_error_get());
            return 2;
        }
        size_t n = a->nbytes / mt_dtype_bytes(dt, 1);
        double diff = 0, norm = 0;
        for (size_t k = 0; k < n; k++) {
            double x = as_double(a, k), y = as_double(b, k);
            diff += (x - y) * (x - y), norm += x * x;
        }
        double rel = norm > 0 ? sqrt(diff / norm) : (diff > 0 ? INFINITY : 0);
        if (rel > d->worst || !(rel == rel)) {
            d->worst = rel;
            snprintf(worst_name, sizeof worst_name, "%s", a->name);
            d->name = worst_name;
        }
        d->n++;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: compare_runs RUN_A RUN_B LOSS_TOL [TENSOR_TOL]\n");
        return 2;
    }
    double tol = atof(argv[3]), ttol = argc == 5 ? atof(argv[4]) : tol;
    static double la[MAX_STEPS], lb[MAX_STEPS];
    double ea, eb;
    int na = losses(argv[1], la, &ea), nb = losses(argv[2], lb, &eb), common = 0;
    double worst_loss = 0;
    int same_bits = 1;
    for (int s = 0; s < MT_MIN(na, nb); s++) {
        if (la[s] != la[s] || lb[s] != lb[s]) continue;  // a step one of them does not record
        worst_loss = fmax(worst_loss, fabs(la[s] - lb[s]) / fmax(fabs(la[s]), 1e-30));
        same_bits &= la[s] == lb[s];
        common++;
    }
    if ((ea == ea) != (eb == eb)) {
        fprintf(stderr, "compare_runs: only one of the runs has an eval\n");
        return 2;
    }
    if (ea == ea) {  // the final eval counts as one more loss
        worst_loss = fmax(worst_loss, fabs(ea - eb) / fmax(fabs(ea), 1e-30));
        same_bits &= ea == eb;
    }
    if (common == 0 || na != nb) {
        fprintf(stderr, "compare_runs: %d steps in %s, %d in %s, %d in common (%s)\n", na, argv[1], nb, argv[2],
                common, common ? "the last differs" : mt_error_get());
        return 2;
    }
    mt_st_file fa, fb;
    if (open_product(argv[1], &fa) != 0 || open_product(argv[2], &fb) != 0) {
        fprintf(stderr, "compare_runs: %s\n", mt_error_get());
        return 2;
    }
    tensor_diff d = {0, "", 0};
    int rc = compare_files(&fa, &fb, argv[2], &d, &same_bits);
    mt_st_file_close(&fa), mt_st_file_close(&fb);
    // --router-bias-update's moved biases beside a LoRA run's adapter: compared too, where A has them
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/adapter/router_bias.safetensors", argv[1]);
    snprintf(pb, sizeof pb, "%s/adapter/router_bias.safetensors", argv[2]);
    if (rc == 0 && mt_st_file_open(&fa, pa) == 0) {
        if (mt_st_file_open(&fb, pb) != 0) {
            fprintf(stderr, "compare_runs: %s\n", mt_error_get());
            mt_st_file_close(&fa);
            return 2;
        }
        rc = compare_files(&fa, &fb, argv[2], &d, &same_bits);
        mt_st_file_close(&fa), mt_st_file_close(&fb);
    }
    if (rc) return rc;
    int ok = tol == 0 && ttol == 0 ? same_bits : worst_loss <= tol && d.worst <= ttol;
    printf("%d steps%s compared, %zu tensors: worst loss rel. error %.3g, worst tensor rel. L2 error %.3g (%s); "
           "%s%s (tolerances %g, %g)\n", common, ea == ea ? " and the eval" : "", d.n, worst_loss, d.worst, d.name,
           ok ? "same" : "DIFFERENT", same_bits ? ", bit for bit" : "", tol, ttol);
    return ok ? 0 : 1;
}
