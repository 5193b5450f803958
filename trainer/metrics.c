// trainer/metrics.c — metrics JSONL writer and the progress line (formats in metrics.h).
#include "trainer/metrics.h"

#include "core/comm.h"  // mt_comm_launched

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "trainer/tensorboard.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double mt_metrics_elapsed(const mt_metrics *m) { return now_s() - m->t0; }

void mt_format_duration(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, n, "?");
        return;
    }
    if (s >= 1e9) s = 1e9;  // keep the integer conversion defined
    long long t = llround(s);
    if (t >= 3600)
        snprintf(buf, n, "%lldh%02lldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
    else
        snprintf(buf, n, "%llds", t);
}

void mt_format_bytes(char *buf, size_t n, uint64_t b) {
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2fGiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(buf, n, "%.0fMiB", (double)b / (double)(1ull << 20));
    else if (b >= (1ull << 10))
        snprintf(buf, n, "%.0fKiB", (double)b / (double)(1ull << 10));
    else
        snprintf(buf, n, "%" PRIu64 "B", b);
}

int mt_metrics_open_ex(mt_metrics *m, const char *path, int append) {
    memset(m, 0, sizeof *m);
    m->out = stdout;
    // A launcher (mpirun gives its ranks a pseudo-terminal even when its own output is redirected)
    // or TERM=dumb: plain lines, no carriage return or escape.
    const char *term = getenv("TERM");
    m->tty = isatty(fileno(stdout)) && !mt_comm_launched() && !(term && strcmp(term, "dumb") == 0);
    m->every = 1;
    m->t0 = now_s();
    if (!path) return 0;
    if (strlen(path) >= sizeof m->path) {
        mt_error_set("%s: path too long", path);
        return -1;
    }
    strcpy(m->path, path);
    m->jsonl = fopen(path, append ? "a+" : "w");
    if (!m->jsonl) {
        mt_error_set("%s: cannot open the metrics file: %s", path, strerror(errno));
        return -1;
    }
    if (append) {  // end a partial line a crash may have left
        struct stat st;
        if (fstat(fileno(m->jsonl), &st) == 0 && st.st_size > 0 &&
            fseek(m->jsonl, -1, SEEK_END) == 0) {
            int c = fgetc(m->jsonl);
            fseek(m->jsonl, 0, SEEK_END);
            if (c != '\n') fputc('\n', m->jsonl);
        }
    }
    return 0;
}

int mt_metrics_open(mt_metrics *m, const char *path) { return mt_metrics_open_ex(m, path, 0); }

// ---------------------------------------------------------------------------------------------
// JSON writing
// ---------------------------------------------------------------------------------------------

static void put_num(FILE *f, const char *key, double x) {
    if (isfinite(x))
        fprintf(f, ",\"%s\":%.9g", key, x);
    else
        fprintf(f, ",\"%s\":null", key);
}

static void put_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void put_loads(FILE *f, const mt_step_record *r) {
    if (!r->expert_load || r->layers <= 0 || r->experts <= 0) {
        fputs(",\"expert_load\":null", f);
        return;
    }
    fputs(",\"expert_load\":[", f);
    for (int l = 0; l < r->layers; l++) {
        fputs(l ? ",[" : "[", f);
        for (int e = 0; e < r->experts; e++) {
            float x = r->expert_load[(size_t)l * (size_t)r->experts + (size_t)e];
            if (e) fputc(',', f);
            if (isfinite(x))
                fprintf(f, "%.6g", (double)x);
            else
                fputs("null", f);
        }
        fputc(']', f);
    }
    fputc(']', f);
}

// ---------------------------------------------------------------------------------------------
// Progress
// ---------------------------------------------------------------------------------------------

static void end_line(mt_metrics *m) {
    if (m->line_open && m->out) {
        fputc('\n', m->out);
        fflush(m->out);
    }
    m->line_open = 0;
}

static void fmt_fixed(char *buf, size_t n, const char *fmt, double x) {
    if (isfinite(x))
        snprintf(buf, n, fmt, x);
    else
        snprintf(buf, n, "%s", isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
}

static void progress(mt_metrics *m, const mt_step_record *r) {
    if (!m->out) return;
    int first = m->records == 1, last = r->total > 0 && r->step >= r->total;
    int every = m->every > 0 ? m->every : 1;
    if (!m->tty && !(first || last || r->skipped || r->step % every == 0)) return;
    char loss[32], aux[32], lr[32], gn[32], tps[32], eta[32], peak[32];
    fmt_fixed(loss, sizeof loss, "%.4f", r->loss);
    fmt_fixed(aux, sizeof aux, "%.4f", r->aux);
    fmt_fixed(lr, sizeof lr, "%.2e", r->lr);
    fmt_fixed(gn, sizeof gn, "%.3f", r->grad_norm);
    fmt_fixed(tps, sizeof tps, "%.0f", r->tokens_per_s);
    mt_format_duration(eta, sizeof eta, r->eta_s);
    mt_format_bytes(peak, sizeof peak, r->peak_bytes);
    char line[512];
    snprintf(line, sizeof line,
             "step=%" PRId64 "/%" PRId64 " loss=%s aux=%s lr=%s gnorm=%s tok/s=%s eta=%s peak=%s%s",
             r->step, r->total, loss, aux, lr, gn, tps, eta, peak,
             r->skipped ? " SKIPPED (non-finite loss or grad norm)" : "");
    if (m->tty) {
        fprintf(m->out, "\r%s\033[K", line);
        m->line_open = 1;
        if (r->skipped || last) end_line(m);  // keep skips and the final step on screen
    } else {
        fprintf(m->out, "%s\n", line);
    }
    fflush(m->out);
}

int mt_metrics_tensorboard(mt_metrics *m, const char *logdir) {
    mt_tb *tb = mt_xcalloc(1, sizeof *tb);
    if (mt_tb_open(tb, logdir) != 0) {
        free(tb);
        return -1;
    }
    m->tb = tb;
    return 0;
}

// The step's scalars as TensorBoard tags; expert loads one tag per layer and expert.
static void tb_step(mt_metrics *m, const mt_step_record *r) {
    static const char *const names[] = {"train/loss", "train/aux", "train/learning_rate", "train/grad_norm",
                                        "train/tokens_per_s"};
    int loads = r->expert_load && r->layers > 0 && r->experts > 0 ? r->layers * r->experts : 0, n = 5 + loads;
    const char **tags = mt_xcalloc((size_t)n, sizeof *tags);
    float *v = mt_xcalloc((size_t)n, sizeof *v);
    char *text = mt_xcalloc((size_t)loads + 1, 48);
    const double head[5] = {r->loss, r->aux, r->lr, r->grad_norm, r->tokens_per_s};
    for (int i = 0; i < 5; i++) tags[i] = names[i], v[i] = (float)head[i];
    for (int k = 0; k < loads; k++) {
        snprintf(text + 48 * k, 48, "expert_load/layer_%d/expert_%d", k / r->experts, k % r->experts);
        tags[5 + k] = text + 48 * k, v[5 + k] = r->expert_load[k];
    }
    if (mt_tb_scalars(m->tb, r->step, tags, v, n) != 0) {
        mt_warn("%s; TensorBoard logging stops here (metrics.jsonl goes on)", mt_error_get());
        mt_tb_close(m->tb);
    }
    free(tags), free(v), free(text);
}

void mt_metrics_step(mt_metrics *m, const mt_step_record *r) {
    if (r->skipped) m->skips++;
    m->records++;
    if (m->jsonl) {
        FILE *f = m->jsonl;
        fprintf(f, "{\"type\":\"step\",\"step\":%" PRId64 ",\"total\":%" PRId64, r->step, r->total);
        put_num(f, "loss", r->loss);
        put_num(f, "ce", r->ce);
        put_num(f, "aux", r->aux);
        put_num(f, "z", r->z);
        if (r->has_seq_aux) put_num(f, "seq_aux", r->seq_aux);
        put_num(f, "lr", r->lr);
        put_num(f, "grad_norm", r->grad_norm);
        put_num(f, "tokens_per_s", r->tokens_per_s);
        put_num(f, "eta_s", r->eta_s);
        fprintf(f, ",\"peak_bytes\":%" PRIu64 ",\"host_syncs\":%" PRIu64 ",\"skipped\":%s,\"skips\":%" PRId64,
                r->peak_bytes, r->host_syncs, r->skipped ? "true" : "false", m->skips);
        put_num(f, "elapsed_s", mt_metrics_elapsed(m));
        put_loads(f, r);
        fputs("}\n", f);
        fflush(f);
    }
    if (m->tb) tb_step(m, r);
    progress(m, r);
}

// "key=value ..." of a parsed object, for the progress stream.
static void print_fields(FILE *out, const cJSON *obj) {
    for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next) {
        if (cJSON_IsNumber(it))
            fprintf(out, " %s=%.6g", it->string, it->valuedouble);
        else if (cJSON_IsString(it))
            fprintf(out, " %s=%s", it->string, it->valuestring);
        else {
            char *s = cJSON_PrintUnformatted(it);
            fprintf(out, " %s=%s", it->string, s ? s : "?");
            cJSON_free(s);
        }
    }
}

void mt_metrics_event(mt_metrics *m, const char *kind, const char *json_fields) {
    if (!kind) kind = "event";
    const char *fields = json_fields ? json_fields : "";
    size_t len = strlen(fields);
    char *wrapped = mt_xmalloc(len + 3);
    snprintf(wrapped, len + 3, "{%s}", fields);
    cJSON *obj = cJSON_Parse(wrapped);
    int ok = cJSON_IsObject(obj);
    if (!ok) mt_warn("metrics: event '%s': fields are not valid JSON: %s", kind, fields);
    if (m->jsonl) {
        FILE *f = m->jsonl;
        fputs("{\"type\":", f);
        put_str(f, kind);
        put_num(f, "elapsed_s", mt_metrics_elapsed(m));
        if (ok && len) {
            // Re-serialised by cJSON: the caller's bytes are never trusted to be one line.
            char *s = cJSON_PrintUnformatted(obj);
            size_t sl = s ? strlen(s) : 0;
            if (sl > 2) fprintf(f, ",%.*s", (int)(sl - 2), s + 1);
            cJSON_free(s);
        } else if (!ok) {
            fputs(",\"bad_fields\":", f);
            put_str(f, fields);
        }
        fputs("}\n", f);
        fflush(f);
    }
    if (m->tb && ok && strcmp(kind, "eval") == 0) {
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step"), *loss = cJSON_GetObjectItemCaseSensitive(obj, "loss");
        const char *tag = "eval/loss";
        float v = cJSON_IsNumber(loss) ? (float)loss->valuedouble : NAN;
        if (cJSON_IsNumber(step) && fabs(step->valuedouble) < 9e15 && mt_tb_scalars(m->tb, (int64_t)step->valuedouble, &tag, &v, 1) != 0) {
            mt_warn("%s; TensorBoard logging stops here (metrics.jsonl goes on)", mt_error_get());
            mt_tb_close(m->tb);
        }
    }
    if (m->out) {
        end_line(m);
        fprintf(m->out, "%s:", kind);
        if (ok)
            print_fields(m->out, obj);
        else
            fprintf(m->out, " %s", fields);
        fputc('\n', m->out);
        fflush(m->out);
    }
    cJSON_Delete(obj);
    free(wrapped);
}

void mt_metrics_close(mt_metrics *m) {
    end_line(m);
    if (m->tb) mt_tb_close(m->tb);
    free(m->tb);
    m->tb = NULL;
    if (m->jsonl) fclose(m->jsonl);
    m->jsonl = NULL;
}
