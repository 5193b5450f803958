// model/config.c — Hugging Face config.json of a supported MoE family: read, check, write, count.
// Which fields exist and their defaults come from the family's description (model/family.h).
//
// Reading is in three steps: a byte scan that bounds nesting depth and number length before
// cJSON sees the text (cJSON's own limit gives no useful message, and it silently cuts long
// numbers), cJSON for the tree, then one typed getter per field that names the field on error.
#include "model/config.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/common.h"
#include "core/fileio.h"

#define CONFIG_MAX_BYTES (4u << 20)
#define JSON_MAX_DEPTH 32      // a config.json is two levels deep; quantization_config adds one
#define JSON_MAX_NUMBER 100    // characters in one number token
#define SIZE_MAX_VALUE 2147483647LL


// ---------------------------------------------------------------------------------------------
// Pre-scan: depth and number length, with the enclosing key for the message.

typedef struct {
    const char *s;
    size_t len;
    const char *key;  // last string followed by ':' (raw, not unescaped)
    size_t key_len;
} scan_state;

static void line_col(const char *s, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (s[i] == '\n') { (*line)++; *col = 1; }
        else (*col)++;
    }
}

static void scan_error(const scan_state *st, size_t off, const char *what) {
    int line, col;
    line_col(st->s, off, &line, &col);
    if (st->key)
        mt_error_set("%.*s: %s (line %d column %d)", (int)MT_MIN(st->key_len, 80), st->key, what,
                     line, col);
    else
        mt_error_set("%s (line %d column %d)", what, line, col);
}

// Returns the offset just past the closing quote (or len when unterminated; cJSON reports it).
static size_t scan_string(const char *s, size_t len, size_t i) {
    for (i++; i < len; i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '"') return i + 1;
    }
    return len;
}

static int json_prescan(const char *s, size_t len) {
    scan_state st = {s, len, NULL, 0};
    const char *last_str = NULL;
    size_t last_len = 0;
    int depth = 0;
    for (size_t i = 0; i < len;) {
        char c = s[i];
        if (c == '"') {
            size_t end = scan_string(s, len, i);
            last_str = s + i + 1;
            last_len = end > i + 1 ? end - i - 2 : 0;
            i = end;
            continue;
        }
        if (c == ':' && last_str) { st.key = last_str; st.key_len = last_len; }
        if (c == '{' || c == '[') {
            if (++depth > JSON_MAX_DEPTH) {
                char what[96];
                snprintf(what, sizeof what, "nesting deeper than %d levels", JSON_MAX_DEPTH);
                scan_error(&st, i, what);
                return -1;
            }
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            while (j < len && strchr("0123456789+-.eE", s[j]) && s[j]) j++;
            if (j - i > JSON_MAX_NUMBER) {
                char what[128];
                snprintf(what, sizeof what, "a number of %zu characters is too long (limit %d)",
                         j - i, JSON_MAX_NUMBER);
                scan_error(&st, i, what);
                return -1;
            }
            i = j;
            continue;
        }
        i++;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Typed field getters. Each returns 0 (value or default stored), or -1 with "field: problem".

// The field, or NULL when absent; a second copy of it is an error (Python would keep the last,
// cJSON the first, so the two would silently disagree).
static int get_field(const cJSON *obj, const char *key, const cJSON **out) {
    *out = NULL;
    for (const cJSON *c = obj->child; c; c = c->next) {
        if (!c->string || strcmp(c->string, key) != 0) continue;
        if (*out) {
            mt_error_set("%s: appears twice", key);
            return -1;
        }
        *out = c;
    }
    return 0;
}

static const char *json_type_name(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "a list";
    if (cJSON_IsObject(v)) return "an object";
    return "a number";
}

// An integer in [lo, hi]. Absent or null: `def`, or an error when `required`.
static int get_int(const cJSON *obj, const char *key, int required, int64_t def, int64_t lo,
                   int64_t hi, int64_t *out) {
    const cJSON *v;
    if (get_field(obj, key, &v) != 0) return -1;
    if (!v || cJSON_IsNull(v)) {
        if (required) {
            mt_error_set("%s: %s", key, v ? "is null but required" : "missing required field");
            return -1;
        }
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) {
        mt_error_set("%s: expected an integer, got %s", key, json_type_name(v));
        return -1;
    }
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) {
        mt_error_set("%s: %g is not an integer", key, d);
        return -1;
    }
    if (d < (double)lo || d > (double)hi) {
        mt_error_set("%s: %.*g is out of range (%lld to %lld)", key, fabs(d) < 1e18 ? 19 : 6, d,
                     (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int64_t)d;
    return 0;
}

// An optional size whose null means "none" (0) while its absence means the default `def`, as
// where a config class's default is not None (gpt-oss's sliding_window 128, head_dim 64).
static int get_int_null0(const cJSON *obj, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v;
    if (get_field(obj, key, &v) != 0) return -1;
    if (v && cJSON_IsNull(v)) return *out = 0, 0;
    return get_int(obj, key, 0, def, lo, hi, out);
}

// A finite number (integers accepted: "rope_theta": 1000000 is common).
static int get_double(const cJSON *obj, const char *key, double def, double *out) {
    const cJSON *v;
    if (get_field(obj, key, &v) != 0) return -1;
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) {
        mt_error_set("%s: expected a number, got %s", key, json_type_name(v));
        return -1;
    }
    if (!isfinite(v->valuedouble)) {
        mt_error_set("%s: not a finite number", key);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *obj, const char *key, int def, int *out) {
    const cJSON *v;
    if (get_field(obj, key, &v) != 0) return -1;
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) {
        mt_error_set("%s: expected true or false, got %s", key, json_type_name(v));
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

// A string; *out = NULL when absent or null.
static int get_string(const cJSON *obj, const char *key, const char **out) {
    const cJSON *v;
    *out = NULL;
    if (get_field(obj, key, &v) != 0) return -1;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) {
        mt_error_set("%s: expected a string, got %s", key, json_type_name(v));
        return -1;
    }
    *out = v->valuestring;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Field groups.

// The family from architectures[0] and model_type; both, when given, must name the same one.
static int read_architecture(const cJSON *root, mt_model_config *cfg) {
    const cJSON *arch;
    const char *type;
    const mt_family *fam = NULL;
    if (get_field(root, "architectures", &arch) != 0 || get_string(root, "model_type", &type) != 0)
        return -1;
    if (arch && !cJSON_IsNull(arch)) {
        if (!cJSON_IsArray(arch) || cJSON_GetArraySize(arch) != 1 ||
            !cJSON_IsString(arch->child)) {
            mt_error_set("architectures: expected a list of one name, e.g. [\"MixtralForCausalLM\"]");
            return -1;
        }
        const char *name = arch->child->valuestring;
        for (int i = 0; i < MT_FAMILY_COUNT && !fam; i++)
            if (strcmp(name, mt_family_get((mt_family_id)i)->architecture) == 0) fam = mt_family_get((mt_family_id)i);
        if (!fam) {
            char list[512] = "";
            for (int i = 0; i < MT_FAMILY_COUNT; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                         mt_family_get((mt_family_id)i)->architecture);
            mt_error_set("architectures: unsupported architecture '%.80s' (supported: %s)", name, list);
            return -1;
        }
    } else if (!type) {
        mt_error_set("architectures: missing, and no model_type either");
        return -1;
    }
    // Kimi K2 publishes model_type "kimi_k2" with DeepseekV3ForCausalLM and DeepSeek-V3's remote
    // code: it is deepseek_v3 (and is written back so).
    if (type && strcmp(type, "kimi_k2") == 0) type = "deepseek_v3";
    if (type) {
        const mt_family *by_type = mt_family_find(type);
        if (!by_type) {
            mt_error_set("model_type: unsupported model_type '%.80s' (supported: %s)", type, mt_family_list());
            return -1;
        }
        if (fam && fam != by_type) {
            mt_error_set("model_type: '%.40s' does not match architectures ['%s']", type, fam->architecture);
            return -1;
        }
        fam = by_type;
    }
    cfg->family = (mt_family_id)(fam - mt_family_get(MT_FAMILY_MIXTRAL));
    strcpy(cfg->architecture, fam->architecture);
    strcpy(cfg->model_type, fam->model_type);
    return 0;
}

// The number of routed experts. transformers' attribute maps make num_experts and
// num_local_experts one field, and which name a config carries depends on the version that wrote
// it (Qwen3-MoE: num_experts in 4.x, num_local_experts in 5.x): either is read, both must agree.
static int read_experts(const cJSON *root, const mt_family *fam, int64_t *out) {
    // DeepSeek-style configs name it n_routed_experts, which their attribute map makes num_local_experts.
    static const char *const keys[] = {"num_experts", "num_local_experts", "n_routed_experts"};
    *out = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(keys); i++) {
        int64_t v = 0;
        if (get_int(root, keys[i], 0, 0, 1, SIZE_MAX_VALUE, &v) != 0) return -1;
        if (v && *out && v != *out) {
            mt_error_set("%s (%lld) disagrees with another count of experts (%lld): transformers reads them as one "
                         "field", keys[i], (long long)v, (long long)*out);
            return -1;
        }
        if (v) *out = v;
    }
    if (!*out) {
        mt_error_set("%s: missing required field", fam->experts_key);
        return -1;
    }
    return 0;
}

// head_dim may break hidden = heads * head_dim only when the config says so explicitly, and the
// family's attention reads it. Absent: the class default (gpt-oss: 64); null: hidden / heads
// (GptOssConfig's __post_init__).
static int read_head_dim(const cJSON *root, mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    if (get_int_null0(root, "head_dim", fam->default_head_dim, 1, SIZE_MAX_VALUE, &cfg->head_dim) != 0) return -1;
    // OLMoE: transformers 4 ignores head_dim and 5 reads it; only a value both agree on is taken.
    if (fam->head_dim_rule == MT_HEAD_DIM_IGNORED && cfg->head_dim) {
        if (cfg->head_dim * cfg->heads != cfg->hidden) {
            mt_error_set("head_dim: %lld is not hidden_size / num_attention_heads (%lld / %lld): transformers 4 "
                         "ignores it for %s and transformers 5 reads it, so this config means two models",
                         (long long)cfg->head_dim, (long long)cfg->hidden, (long long)cfg->heads, fam->model_type);
            return -1;
        }
        cfg->head_dim = 0;
    }
    if (fam->head_dim_rule == MT_HEAD_DIM_MUST_MATCH && cfg->head_dim &&
        cfg->head_dim * cfg->heads != cfg->hidden) {
        mt_error_set("head_dim: %lld x num_attention_heads %lld != hidden_size %lld (%s requires it)",
                     (long long)cfg->head_dim, (long long)cfg->heads, (long long)cfg->hidden, fam->model_type);
        return -1;
    }
    if (cfg->head_dim == 0) {
        if (cfg->hidden % cfg->heads != 0) {
            mt_error_set("hidden_size (%lld) is not divisible by num_attention_heads (%lld) "
                         "and head_dim is not given",
                         (long long)cfg->hidden, (long long)cfg->heads);
            return -1;
        }
        cfg->head_dim = cfg->hidden / cfg->heads;
    }
    return 0;
}

// The sizes every family has. The model's shape (hidden, layers, heads, experts, vocab) is
// required, not defaulted: a config.json without hidden_size is broken, not a 2048-wide model.
static int read_sizes(const cJSON *root, mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    const int64_t M = SIZE_MAX_VALUE;
    if (get_int(root, "hidden_size", 1, 0, 1, M, &cfg->hidden) != 0 ||
        get_int(root, fam->expert_size_key, 1, 0, 1, M, &cfg->intermediate) != 0 ||
        get_int(root, "num_hidden_layers", 1, 0, 1, M, &cfg->layers) != 0 ||
        get_int(root, "num_attention_heads", 1, 0, 1, M, &cfg->heads) != 0 ||
        get_int(root, "num_key_value_heads", 0, fam->default_kv_heads ? fam->default_kv_heads : cfg->heads, 1, M,
                &cfg->kv_heads) != 0 ||
        read_experts(root, fam, &cfg->experts) != 0 ||
        get_int(root, "num_experts_per_tok", 1, 0, 1, M, &cfg->top_k) != 0 ||
        get_int(root, "vocab_size", 1, 0, 1, M, &cfg->vocab) != 0 ||
        get_int(root, "max_position_embeddings", 0, fam->default_max_positions, 1, M, &cfg->max_positions) != 0 ||
        (fam->has_sliding_window &&  // null is "no window", whatever the class default (gpt-oss: 128)
         get_int_null0(root, "sliding_window", fam->default_sliding_window, 0, M, &cfg->sliding_window) != 0))
        return -1;
    // Qwen: sliding_window applies only with use_sliding_window (and then only above
    // max_window_layers, which the attention does not implement).
    if (fam->has_sliding_flag) {
        int use = 0;
        if (get_bool(root, "use_sliding_window", 0, &use) != 0) return -1;
        if (use) {
            mt_error_set("use_sliding_window: true is not supported (per-layer sliding windows)");
            return -1;
        }
        cfg->sliding_window = 0;
    }
    // MLA's configs overwrite head_dim with qk_rope_head_dim (and save that): read_mla sets it.
    if (!fam->mla && read_head_dim(root, cfg) != 0) return -1;
    // Token ids: null means "none" (-1).
    const cJSON *v;
    if (get_field(root, "bos_token_id", &v) != 0) return -1;
    if (v && cJSON_IsNull(v)) cfg->bos_token_id = -1;
    else if (get_int(root, "bos_token_id", 0, fam->default_bos, 0, M, &cfg->bos_token_id) != 0) return -1;
    if (get_field(root, "eos_token_id", &v) != 0) return -1;
    if (v && cJSON_IsArray(v)) {  // GLM-4.5 lists several: the first ends what moetrain appends
        const cJSON *e0 = v->child;
        if (!e0 || !cJSON_IsNumber(e0) || e0->valuedouble != floor(e0->valuedouble) || e0->valuedouble < 0 ||
            e0->valuedouble > (double)M) {
            mt_error_set("eos_token_id: a list must start with a token id (0 to %lld)", (long long)M);
            return -1;
        }
        cfg->eos_token_id = (int64_t)e0->valuedouble;
    } else if (v && cJSON_IsNull(v)) cfg->eos_token_id = -1;
    else if (get_int(root, "eos_token_id", 0, fam->default_eos, 0, M, &cfg->eos_token_id) != 0) return -1;
    return 0;
}

// partial_rotary_factor: RoPE on the first fraction of each head (GLM-4.5, default 0.5); other
// families turn the whole head, and a factor other than 1 is refused. Given twice (top level and
// rope_parameters), both must agree.
static int read_partial_rotary(const cJSON *obj, const char *where, mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    const cJSON *v;
    double f;
    if (get_field(obj, "partial_rotary_factor", &v) != 0 || get_double(obj, "partial_rotary_factor", 1.0, &f) != 0)
        return -1;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!fam->partial_rotary && f != 1.0) {
        mt_error_set("%s%spartial_rotary_factor: %g is not supported for %s (RoPE over the whole head)", where,
                     *where ? "." : "", f, fam->model_type);
        return -1;
    }
    if (!(f > 0 && f <= 1) || (cfg->partial_rotary_factor && cfg->partial_rotary_factor != f)) {
        mt_error_set("%s%spartial_rotary_factor: %g must be in (0, 1] and agree where given twice", where,
                     *where ? "." : "", f);
        return -1;
    }
    cfg->partial_rotary_factor = f;
    return 0;
}

// The YaRN fields (transformers' _compute_yarn_parameters), with its defaults where a field is
// absent: beta_fast 32, beta_slow 1, truncate true, original_max_position_embeddings =
// max_position_embeddings, attention_factor derived from factor.
static int read_yarn(const cJSON *o, const char *where, mt_model_config *cfg) {
    const cJSON *f;
    if (get_field(o, "factor", &f) != 0) return -1;
    if (get_double(o, "factor", 0.0, &cfg->rope_factor) != 0 ||
        get_double(o, "beta_fast", 32.0, &cfg->rope_beta_fast) != 0 ||
        get_double(o, "beta_slow", 1.0, &cfg->rope_beta_slow) != 0 ||
        get_double(o, "attention_factor", 0.0, &cfg->rope_attention_factor) != 0 ||
        get_double(o, "mscale", 0.0, &cfg->rope_mscale) != 0 ||
        get_double(o, "mscale_all_dim", 0.0, &cfg->rope_mscale_all_dim) != 0 ||
        get_bool(o, "truncate", 1, &cfg->rope_truncate) != 0 ||
        get_int(o, "original_max_position_embeddings", 0, 0, 1, SIZE_MAX_VALUE, &cfg->rope_original_max) != 0)
        return mt_error_prefix("%s", where), -1;
    if (!cfg->rope_original_max) cfg->rope_original_max = cfg->max_positions;
    if (!f || cJSON_IsNull(f)) cfg->rope_factor = (double)cfg->max_positions / (double)cfg->rope_original_max;
    if (!(cfg->rope_factor > 0) || cfg->rope_attention_factor < 0) {
        mt_error_set("%s: factor (%g) must be positive and attention_factor (%g) not negative", where,
                     cfg->rope_factor, cfg->rope_attention_factor);
        return -1;
    }
    return 0;
}

// One RoPE description: rope_scaling (transformers 4) or rope_parameters (5, with rope_theta in
// it). Types: "default" (or absent) and "yarn"; the others (linear, dynamic, longrope, llama3)
// change the frequencies in ways moetrain does not implement, and are refused, as is any key the
// type does not read.
static int read_rope_object(const cJSON *o, const char *where, mt_model_config *cfg) {
    if (!cJSON_IsObject(o)) {
        mt_error_set("%s: expected an object or null, got %s", where, json_type_name(o));
        return -1;
    }
    const char *type = NULL, *key = "rope_type";
    if (get_string(o, key, &type) != 0) return -1;
    if (!type) {  // transformers 4 also wrote the older "type"
        key = "type";
        if (get_string(o, key, &type) != 0) return -1;
    }
    int yarn = type && strcmp(type, "yarn") == 0;
    if (type && !yarn && strcmp(type, "default") != 0) {
        mt_error_set("%s.%s: '%.40s' is not supported (moetrain implements the default RoPE and yarn)", where, key,
                     type);
        return -1;
    }
    static const char *const yarn_keys[] = {"factor", "beta_fast", "beta_slow", "truncate",
                                            "original_max_position_embeddings", "attention_factor",
                                            "mscale", "mscale_all_dim"};
    for (const cJSON *c = o->child; c; c = c->next) {
        int known = strcmp(c->string, "rope_type") == 0 || strcmp(c->string, "type") == 0 ||
                    strcmp(c->string, "rope_theta") == 0 || strcmp(c->string, "partial_rotary_factor") == 0;
        for (size_t i = 0; yarn && i < MT_ARRAY_LEN(yarn_keys); i++) known |= strcmp(c->string, yarn_keys[i]) == 0;
        if (!known) {
            mt_error_set("%s.%.40s: not understood with rope_type '%s' (moetrain reads rope_type, rope_theta, "
                         "partial_rotary_factor 1%s; per-layer-type parameters are not supported)",
                         where, c->string, yarn ? "yarn" : "default",
                         yarn ? ", factor, beta_fast, beta_slow, truncate, original_max_position_embeddings, "
                                "attention_factor, mscale, mscale_all_dim" : "");
            return -1;
        }
    }
    if (read_partial_rotary(o, where, cfg) != 0) return -1;
    cfg->rope_yarn = yarn;
    return yarn ? read_yarn(o, where, cfg) : 0;
}

// RoPE as transformers 4 writes it (rope_theta; rope_scaling, null for plain RoPE) and as 5 does
// (rope_parameters: {"rope_type": ..., "rope_theta": ...}, no top-level rope_theta). Missing
// from both: the family's default (gpt-oss's is YaRN).
static int read_rope(const cJSON *root, const mt_family *fam, mt_model_config *cfg) {
    const cJSON *top, *params, *scaling;
    if (get_field(root, "rope_theta", &top) != 0 || get_field(root, "rope_parameters", &params) != 0 ||
        get_field(root, "rope_scaling", &scaling) != 0 || read_partial_rotary(root, "", cfg) != 0)
        return -1;
    if (get_double(root, "rope_theta", fam->default_rope_theta, &cfg->rope_theta) != 0) return -1;
    int has_scaling = scaling && !cJSON_IsNull(scaling), has_params = params && !cJSON_IsNull(params);
    if (has_scaling && read_rope_object(scaling, "rope_scaling", cfg) != 0) return -1;
    if (has_params) {
        if (has_scaling) {  // two descriptions of one thing: which one transformers takes depends on its version
            mt_error_set("rope_scaling and rope_parameters are both given: keep one (transformers 4 reads "
                         "rope_scaling, 5 rope_parameters)");
            return -1;
        }
        if (read_rope_object(params, "rope_parameters", cfg) != 0) return -1;
        const cJSON *t;
        if (get_field(params, "rope_theta", &t) != 0) return -1;
        if (t && !cJSON_IsNull(t)) {
            double inner;
            if (get_double(params, "rope_theta", 0, &inner) != 0) return mt_error_prefix("rope_parameters"), -1;
            if (top && !cJSON_IsNull(top) && inner != cfg->rope_theta) {
                mt_error_set("rope_theta (%g) and rope_parameters.rope_theta (%g) disagree", cfg->rope_theta, inner);
                return -1;
            }
            cfg->rope_theta = inner;
        }
    }
    if (!has_scaling && !has_params && fam->default_rope_yarn) {  // GptOssConfig's class default
        cfg->rope_yarn = 1, cfg->rope_factor = 32.0, cfg->rope_beta_fast = 32.0, cfg->rope_beta_slow = 1.0;
        cfg->rope_truncate = 0, cfg->rope_original_max = 4096, cfg->rope_attention_factor = 0.0;
    }
    return 0;
}

// layer_types (transformers 5; gpt-oss in 4 too): the attention of each layer. Families with
// per-layer attention (has_layer_types) take sliding_attention and full_attention (absent: the
// class default, sliding on even layers); the others run every layer alike, so only a list of
// "full_attention" is accepted.
static int read_layer_types(const cJSON *root, mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    const cJSON *v;
    if (get_field(root, "layer_types", &v) != 0) return -1;
    if (fam->has_layer_types) {
        if (cfg->layers > MT_CONFIG_MAX_LAYERS) {
            mt_error_set("num_hidden_layers: %lld layers, more than the %d moetrain reads layer_types for",
                         (long long)cfg->layers, MT_CONFIG_MAX_LAYERS);
            return -1;
        }
        cfg->has_layer_types = 1;
        for (int64_t L = 0; L < cfg->layers; L++) cfg->layer_sliding[L] = L % 2 == 0;
    }
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != cfg->layers) {
        mt_error_set("layer_types: expected a list of %lld names (one per layer)", (long long)cfg->layers);
        return -1;
    }
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        int full = cJSON_IsString(c) && strcmp(c->valuestring, "full_attention") == 0;
        int sliding = fam->has_layer_types && cJSON_IsString(c) && strcmp(c->valuestring, "sliding_attention") == 0;
        if (!full && !sliding) {
            mt_error_set("layer_types[%d]: %s%.40s%s is not supported (%s)", i, cJSON_IsString(c) ? "'" : "",
                         cJSON_IsString(c) ? c->valuestring : json_type_name(c), cJSON_IsString(c) ? "'" : "",
                         fam->has_layer_types ? "full_attention or sliding_attention" : "every layer full_attention");
            return -1;
        }
        if (fam->has_layer_types) cfg->layer_sliding[i] = (uint8_t)sliding;
    }
    return 0;
}

static int read_floats(const cJSON *root, mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    if (read_rope(root, fam, cfg) != 0 || read_layer_types(root, cfg) != 0 ||
        get_double(root, "rms_norm_eps", fam->default_rms_eps, &cfg->rms_norm_eps) != 0 ||
        get_double(root, "router_aux_loss_coef", fam->default_aux_coef, &cfg->router_aux_loss_coef) != 0 ||
        (fam->has_jitter && get_double(root, "router_jitter_noise", 0.0, &cfg->router_jitter_noise) != 0) ||
        get_double(root, "initializer_range", 0.02, &cfg->initializer_range) != 0 ||
        get_bool(root, "tie_word_embeddings", 0, &cfg->tie_word_embeddings) != 0)
        return -1;
    // Fields the forward pass does not implement: refuse values other than Mixtral's.
    const char *act;
    double dropout;
    if (get_string(root, "hidden_act", &act) != 0 ||
        get_double(root, "attention_dropout", 0.0, &dropout) != 0)
        return -1;
    if (act && strcmp(act, "silu") != 0) {
        mt_error_set("hidden_act: unsupported activation '%.40s' (only silu)", act);
        return -1;
    }
    if (dropout != 0.0) {
        mt_error_set("attention_dropout: %g is not supported (only 0)", dropout);
        return -1;
    }
    return 0;
}

// mlp_only_layers: a list of layer indices (null: none).
static int read_mlp_only(const cJSON *root, mt_model_config *cfg) {
    const cJSON *v;
    if (get_field(root, "mlp_only_layers", &v) != 0) return -1;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v)) {
        mt_error_set("mlp_only_layers: expected a list of layer indices, got %s", json_type_name(v));
        return -1;
    }
    for (const cJSON *c = v->child; c; c = c->next) {
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || c->valuedouble < 0 ||
            c->valuedouble >= (double)cfg->layers) {
            mt_error_set("mlp_only_layers: each entry must be a layer index 0 to %lld", (long long)cfg->layers - 1);
            return -1;
        }
        if (cfg->n_mlp_only == MT_CONFIG_MAX_MLP_ONLY) {
            mt_error_set("mlp_only_layers: more than %d entries", MT_CONFIG_MAX_MLP_ONLY);
            return -1;
        }
        int32_t L = (int32_t)c->valuedouble;
        int i = cfg->n_mlp_only++;
        while (i > 0 && cfg->mlp_only_layers[i - 1] > L) cfg->mlp_only_layers[i] = cfg->mlp_only_layers[i - 1], i--;
        if (i > 0 && cfg->mlp_only_layers[i - 1] == L) {  // a repeat changes nothing in transformers
            memmove(cfg->mlp_only_layers + i, cfg->mlp_only_layers + i + 1,
                    (size_t)(--cfg->n_mlp_only - i) * sizeof(int32_t));
            continue;
        }
        cfg->mlp_only_layers[i] = L;
    }
    return 0;
}

// A string field that must be one of `ok` (absent: fine).
static int want_string(const cJSON *root, const char *key, const char *const *ok, int n, const char **out) {
    if (get_string(root, key, out) != 0) return -1;
    if (!*out) return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(*out, ok[i]) == 0) return 0;
    mt_error_set("%s: '%.40s' is not supported here (expected %s%s%s)", key, *out, ok[0], n > 1 ? " or " : "",
                 n > 1 ? ok[1] : "");
    return -1;
}

// MLA's sizes (DeepseekV2/V3Config); head_dim becomes the query/key head, nope + rope.
static int read_mla(const cJSON *root, mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    const int64_t M = SIZE_MAX_VALUE;
    cfg->mla = 1;
    if (get_int(root, "q_lora_rank", 0, fam->default_q_lora_rank, 0, M, &cfg->q_lora_rank) != 0 ||
        get_int(root, "kv_lora_rank", 0, 512, 1, M, &cfg->kv_lora_rank) != 0 ||
        get_int(root, "qk_nope_head_dim", 0, fam->default_qk_nope, 1, M, &cfg->qk_nope_dim) != 0 ||
        get_int(root, "qk_rope_head_dim", 0, 64, 2, M, &cfg->qk_rope_dim) != 0 ||
        get_int(root, "v_head_dim", 0, fam->default_v_head, 1, M, &cfg->v_head_dim) != 0)
        return -1;
    const cJSON *q;
    if (get_field(root, "q_lora_rank", &q) != 0) return -1;
    if (q && cJSON_IsNull(q)) cfg->q_lora_rank = 0;  // null: a plain q_proj (DeepSeek-V2-Lite)
    if (cfg->qk_rope_dim % 2) {
        mt_error_set("qk_rope_head_dim: %lld must be even (RoPE turns pairs)", (long long)cfg->qk_rope_dim);
        return -1;
    }
    cfg->head_dim = cfg->qk_nope_dim + cfg->qk_rope_dim;
    cfg->rotary_dim = cfg->qk_rope_dim;
    int64_t qk = 0;  // transformers 5 saves its derived qk_head_dim too
    if (get_int(root, "qk_head_dim", 0, cfg->head_dim, 1, M, &qk) != 0) return -1;
    if (qk != cfg->head_dim) {
        mt_error_set("qk_head_dim: %lld is not qk_nope_head_dim + qk_rope_head_dim (%lld)", (long long)qk,
                     (long long)cfg->head_dim);
        return -1;
    }
    cfg->rope_interleave = fam->rope_interleave_default > 0;
    if (fam->rope_interleave_default < 0 && get_bool(root, "rope_interleave", 1, &cfg->rope_interleave) != 0) return -1;
    return 0;
}

// GLM-4.7-Flash: transformers builds the dense layers from mlp_layer_types (absent: only layer 0)
// and ignores first_k_dense_replace, which other readers use: where both are given they must name
// the same layers, or one checkpoint would be two models. A leading run of dense layers is kept as
// first_k_dense, any other dense layer in mlp_only_layers.
static int read_mlp_layer_types(const cJSON *root, mt_model_config *cfg) {
    const cJSON *v, *k;
    if (get_field(root, "mlp_layer_types", &v) != 0 || get_field(root, "first_k_dense_replace", &k) != 0) return -1;
    int64_t given = cfg->first_k_dense, lead = 1;
    cfg->n_mlp_only = 0;
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != cfg->layers) {
            mt_error_set("mlp_layer_types: expected a list of num_hidden_layers (%lld) entries \"dense\" or "
                         "\"sparse\"", (long long)cfg->layers);
            return -1;
        }
        int L = 0, past_lead = 0;
        lead = 0;
        for (const cJSON *c = v->child; c; c = c->next, L++) {
            int dense = cJSON_IsString(c) && strcmp(c->valuestring, "dense") == 0;
            if (!dense && !(cJSON_IsString(c) && strcmp(c->valuestring, "sparse") == 0)) {
                mt_error_set("mlp_layer_types[%d]: expected \"dense\" or \"sparse\"", L);
                return -1;
            }
            if (!dense) past_lead = 1;
            else if (!past_lead) lead++;
            else if (cfg->n_mlp_only == MT_CONFIG_MAX_MLP_ONLY) {
                mt_error_set("mlp_layer_types: more than %d dense layers after the first sparse one",
                             MT_CONFIG_MAX_MLP_ONLY);
                return -1;
            } else cfg->mlp_only_layers[cfg->n_mlp_only++] = L;
        }
    }
    if (lead > cfg->layers) lead = cfg->layers;
    if (k && !cJSON_IsNull(k) && (given != lead || cfg->n_mlp_only)) {
        mt_error_set("first_k_dense_replace (%lld) and mlp_layer_types (%lld leading dense layer(s)%s) disagree: "
                     "transformers' %s builds the layers by mlp_layer_types (absent: layer 0 dense), other readers "
                     "by first_k_dense_replace; refused", (long long)given, (long long)lead,
                     cfg->n_mlp_only ? " and more later" : "", cfg->model_type);
        return -1;
    }
    cfg->first_k_dense = lead;
    return 0;
}

// DeepSeek-style routing, shared experts and dense first layers (docs/families.md "DeepSeek-style"),
// with the published checkpoints' own fields checked where they must agree with transformers'
// modeling (scoring_func, topk_method, moe_layer_freq).
static int read_deepseek(const cJSON *root, mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    const int64_t M = SIZE_MAX_VALUE;
    const char *s;
    int64_t freq;
    if (get_int_null0(root, "n_group", fam->default_n_group, 1, M, &cfg->n_group) != 0 ||
        get_int_null0(root, "topk_group", fam->default_topk_group, 1, M, &cfg->topk_group) != 0 ||
        get_double(root, "routed_scaling_factor", fam->default_routed_scaling, &cfg->routed_scaling) != 0 ||
        get_int(root, "n_shared_experts", 0, fam->default_shared_intermediate, 1, M, &cfg->n_shared_experts) != 0 ||
        get_int(root, "first_k_dense_replace", 0, fam->default_first_k_dense, 0, M, &cfg->first_k_dense) != 0 ||
        get_int(root, "intermediate_size", 0, fam->default_dense_intermediate, 1, M, &cfg->dense_intermediate) != 0 ||
        get_int(root, "num_nextn_predict_layers", 0, 0, 0, M, &cfg->mtp_layers) != 0 ||
        get_int(root, "moe_layer_freq", 0, 1, 1, M, &freq) != 0 || get_bool(root, "seq_aux", 0, &cfg->seq_aux) != 0 ||
        get_double(root, "aux_loss_alpha", 0.0, &cfg->aux_loss_alpha) != 0)
        return -1;
    if (!(cfg->aux_loss_alpha >= 0) || !isfinite(cfg->aux_loss_alpha)) {
        mt_error_set("aux_loss_alpha (%g) must be 0 or positive", cfg->aux_loss_alpha);
        return -1;
    }
    if (!cfg->n_group) cfg->n_group = 1;  // null: no groups
    if (!cfg->topk_group) cfg->topk_group = 1;
    if (freq != 1) {  // DeepSeek's remote code only; transformers makes every layer past first_k_dense_replace MoE
        mt_error_set("moe_layer_freq: %lld is not supported (transformers' modeling reads 1)", (long long)freq);
        return -1;
    }
    cfg->shared_intermediate = cfg->n_shared_experts * cfg->intermediate;
    static const char *const v2_methods[] = {"greedy", "group_limited_greedy"}, *const v3_methods[] = {"noaux_tc"};
    static const char *const softmax[] = {"softmax"}, *const sigmoid[] = {"sigmoid"};
    int grouped_sigmoid = fam->route == MT_ROUTE_SIGMOID_GROUPED;
    if (want_string(root, "topk_method", grouped_sigmoid ? v3_methods : v2_methods, grouped_sigmoid ? 1 : 2, &s) != 0)
        return -1;
    cfg->route_grouped = grouped_sigmoid || (s && strcmp(s, "group_limited_greedy") == 0);
    if (want_string(root, "scoring_func", grouped_sigmoid ? sigmoid : softmax, 1, &s) != 0) return -1;
    if (fam->mla && read_mla(root, cfg) != 0) return -1;
    if (fam->mlp_layer_types && read_mlp_layer_types(root, cfg) != 0) return -1;
    if (fam->qk_norm_flag) {
        int on = 0;
        if (get_bool(root, "use_qk_norm", 0, &on) != 0) return -1;
        cfg->qk_norm = on ? fam->qk_norm : MT_QK_NORM_NONE;
    }
    int mlp_bias = 0;
    if (get_bool(root, "mlp_bias", 0, &mlp_bias) != 0) return -1;
    if (mlp_bias) {
        mt_error_set("mlp_bias: true is not supported (the MLPs and experts have no biases here)");
        return -1;
    }
    if (fam->route == MT_ROUTE_SOFTMAX_GROUPED && cfg->norm_topk_prob) {
        // transformers' DeepseekV2 router never normalises (DeepSeek's own code does): one config, two models
        mt_error_set("norm_topk_prob: true means two different models for %s (transformers ignores it, DeepSeek's "
                     "code normalises); refused", fam->model_type);
        return -1;
    }
    return 0;
}

// The optional parts of the family (model/family.h), with its class defaults.
static int read_family(const cJSON *root, mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    const int64_t M = SIZE_MAX_VALUE;
    cfg->norm_topk_prob = 1;
    cfg->decoder_sparse_step = 1;
    cfg->qk_norm = fam->qk_norm;
    cfg->n_group = cfg->topk_group = 1;
    cfg->routed_scaling = 1.0;
    if (!fam->norm_topk_fixed && get_bool(root, "norm_topk_prob", fam->default_norm_topk, &cfg->norm_topk_prob) != 0)
        return -1;
    if (get_bool(root, "output_router_logits", 0, &cfg->output_router_logits) != 0) return -1;
    if (fam->has_dense_layers) {
        if (get_int(root, "intermediate_size", 0, fam->default_dense_intermediate, 1, M, &cfg->dense_intermediate) != 0 ||
            get_int(root, "decoder_sparse_step", 0, 1, 1, M, &cfg->decoder_sparse_step) != 0 ||
            read_mlp_only(root, cfg) != 0)
            return -1;
    }
    if (fam->route != MT_ROUTE_SOFTMAX || fam->mla) {
        if (read_deepseek(root, cfg) != 0) return -1;
    } else if (fam->shared_expert &&
        get_int(root, "shared_expert_intermediate_size", 0, fam->default_shared_intermediate, 1, M,
                &cfg->shared_intermediate) != 0)
        return -1;
    if (fam->qkv_bias_key && get_bool(root, fam->qkv_bias_key, fam->qkv_bias_default, &cfg->qkv_bias) != 0)
        return -1;
    if (fam->attn_bias_key) {
        int b = 0;
        if (get_bool(root, fam->attn_bias_key, fam->attn_bias_default, &b) != 0) return -1;
        cfg->qkv_bias = cfg->qkv_bias || b;
        cfg->o_bias = b;
    }
    if (fam->clamped_swiglu) {
        if (get_double(root, "swiglu_alpha", 1.702, &cfg->swiglu_alpha) != 0 ||
            get_double(root, "swiglu_limit", 7.0, &cfg->swiglu_limit) != 0)
            return -1;
        if (!(cfg->swiglu_limit > 0) || !(cfg->swiglu_alpha > 0)) {
            mt_error_set("swiglu_limit (%g) and swiglu_alpha (%g) must be positive", cfg->swiglu_limit,
                         cfg->swiglu_alpha);
            return -1;
        }
    }
    if (fam->has_clip_qkv) {
        if (get_double(root, "clip_qkv", 0.0, &cfg->clip_qkv) != 0) return -1;
        const cJSON *v;
        if (get_field(root, "clip_qkv", &v) != 0) return -1;
        if (v && !cJSON_IsNull(v) && !(cfg->clip_qkv > 0)) {
            mt_error_set("clip_qkv: %g must be positive (or null: no clipping)", cfg->clip_qkv);
            return -1;
        }
    }
    return 0;
}

static int parse_torch_dtype(const char *s, mt_dtype *out) {
    if (strcmp(s, "bfloat16") == 0) *out = MT_BF16;
    else if (strcmp(s, "float32") == 0) *out = MT_F32;
    else if (strcmp(s, "float16") == 0) *out = MT_F16;
    else return -1;
    return 0;
}

static const char *torch_dtype_name(mt_dtype t) {
    return t == MT_F32 ? "float32" : t == MT_F16 ? "float16" : "bfloat16";
}

static int read_dtype(const cJSON *root, mt_model_config *cfg) {
    // transformers v5 writes "dtype"; v4 writes "torch_dtype".
    const char *key = "torch_dtype", *s, *s5;
    if (get_string(root, key, &s) != 0 || get_string(root, "dtype", &s5) != 0) return -1;
    if (s && s5 && strcmp(s, s5) != 0) {
        mt_error_set("torch_dtype ('%.40s') and dtype ('%.40s') disagree", s, s5);
        return -1;
    }
    if (!s) key = "dtype", s = s5;
    cfg->torch_dtype = MT_BF16;
    if (s && parse_torch_dtype(s, &cfg->torch_dtype) != 0) {
        mt_error_set("%s: unsupported dtype '%.40s' (expected bfloat16, float32 or float16)", key, s);
        return -1;
    }
    return 0;
}

// quant_method "fp8": DeepSeek-V3's and Kimi K2's block FP8 (docs/formats.md "Block FP8").
// Absent fields take FineGrainedFP8Config's defaults; modules_to_not_convert needs no reading
// (each weight's stored dtype says whether it is FP8); anything else is refused by name.
static int read_fp8(const cJSON *q, mt_model_config *cfg) {
    cfg->fp8_block[0] = cfg->fp8_block[1] = 128;
    for (const cJSON *c = q->child; c; c = c->next) {
        const char *k = c->string, *want = NULL;
        if (strcmp(k, "quant_method") == 0 || strcmp(k, "modules_to_not_convert") == 0) continue;
        if (strcmp(k, "fmt") == 0) {
            if (!cJSON_IsString(c) || strcmp(c->valuestring, "e4m3") != 0) want = "\"e4m3\"";
        } else if (strcmp(k, "activation_scheme") == 0) {
            if (!cJSON_IsString(c) || strcmp(c->valuestring, "dynamic") != 0) want = "\"dynamic\"";
        } else if (strcmp(k, "scale_fmt") == 0) {  // DeepSeek-V3.1: how its kernels round activation
            // scales; its weights' scale_inv are F32 powers of two, read as any other
            if (cJSON_IsString(c) && strcmp(c->valuestring, "ue8m0") == 0) cfg->fp8_scale_ue8m0 = 1;
            else if (!cJSON_IsNull(c)) want = "\"ue8m0\" or null";
        } else if (strcmp(k, "weight_block_size") == 0) {
            int n = 0;
            for (const cJSON *d = cJSON_IsArray(c) ? c->child : NULL; d; d = d->next, n++) {
                double v = cJSON_IsNumber(d) ? d->valuedouble : 0;
                if (n < 2 && v >= 1 && v <= SIZE_MAX_VALUE && v == floor(v)) cfg->fp8_block[n] = (int)v;
                else n = 3;
            }
            if (n != 2) want = "two positive integers [rows, cols]";
        } else {
            mt_error_set("%.40s: not understood with quant_method fp8", k);
            return -1;
        }
        if (want) {
            char *v = cJSON_PrintUnformatted(c);
            mt_error_set("%.40s: %.60s is not supported (expected %s)", k, v ? v : "?", want);
            free(v);
            return -1;
        }
    }
    return 0;
}

// quantization_config of a pre-quantized bitsandbytes 4-bit checkpoint (docs/formats.md "Serialized quant_state").
static int read_quant(const cJSON *q, mt_model_config *cfg) {
    const char *method, *type, *storage;
    int in4 = 0, in8 = 0, in4_private = 0, in8_private = 0;
    if (!cJSON_IsObject(q)) {
        mt_error_set("expected an object, got %s", json_type_name(q));
        return -1;
    }
    if (get_string(q, "quant_method", &method) != 0 || get_bool(q, "load_in_4bit", 0, &in4) != 0 ||
        get_bool(q, "load_in_8bit", 0, &in8) != 0 || get_bool(q, "_load_in_4bit", 0, &in4_private) != 0 ||
        get_bool(q, "_load_in_8bit", 0, &in8_private) != 0 ||
        get_string(q, "bnb_4bit_quant_type", &type) != 0 ||
        get_bool(q, "bnb_4bit_use_double_quant", 0, &cfg->double_quant) != 0 ||
        get_string(q, "bnb_4bit_quant_storage", &storage) != 0)
        return -1;
    if (method && strcmp(method, "mxfp4") == 0) {  // gpt-oss's release: the experts in MXFP4, the rest dense
        for (const cJSON *c = q->child; c; c = c->next)
            if (strcmp(c->string, "quant_method") != 0 && strcmp(c->string, "modules_to_not_convert") != 0) {
                mt_error_set("%.40s: not understood with quant_method mxfp4", c->string);
                return -1;
            }
        cfg->mxfp4 = 1;
        return 0;
    }
    if (method && strcmp(method, "fp8") == 0) return read_fp8(q, cfg);
    if (method && strcmp(method, "bitsandbytes") != 0) {
        mt_error_set("quant_method: unsupported method '%.40s' (bitsandbytes 4-bit, mxfp4 or fp8)", method);
        return -1;
    }
    if (in8 || in8_private) {
        mt_error_set("load_in_8bit: 8-bit checkpoints are not supported (only 4-bit nf4/fp4)");
        return -1;
    }
    if (!in4 && !in4_private) {
        mt_error_set("load_in_4bit: not true, so this is not a 4-bit checkpoint");
        return -1;
    }
    if (!type) type = "fp4";  // BitsAndBytesConfig's default
    if (strcmp(type, "nf4") != 0 && strcmp(type, "fp4") != 0) {
        mt_error_set("bnb_4bit_quant_type: unsupported '%.40s' (expected nf4 or fp4)", type);
        return -1;
    }
    if (storage && strcmp(storage, "uint8") != 0) {
        mt_error_set("bnb_4bit_quant_storage: unsupported '%.40s' (expected uint8)", storage);
        return -1;
    }
    strcpy(cfg->quant_type, type);
    cfg->quantized = 1;
    return 0;
}

// Every field either read, known not to matter, or refused (model/config_keys.c): a field
// transformers reads and moetrain ignored would train a different model without a word.
static int check_fields(const cJSON *root, const mt_model_config *cfg) {
    const mt_family *fam = mt_config_family(cfg);
    for (const cJSON *c = root->child; c; c = c->next) {
        if (mt_config_key_classify(fam, c->string) != MT_CONFIG_KEY_UNKNOWN) continue;
        char *v = cJSON_PrintUnformatted(c);
        if (mt_config_allows_unknown()) {
            mt_warn("config.json: %.60s = %.60s is not a field moetrain knows for %s; ignored (--allow-unknown-config)",
                    c->string, v ? v : "?", fam->model_type);
        } else {
            mt_error_set("%.60s: %.60s is not a field moetrain knows for %s; it may change the model's math, so it is "
                         "refused rather than ignored (--allow-unknown-config ignores it, at your risk)",
                         c->string, v ? v : "?", fam->model_type);
            free(v);
            return -1;
        }
        free(v);
    }
    return 0;
}

static int read_config(const cJSON *root, mt_model_config *cfg) {
    if (!cJSON_IsObject(root)) {
        mt_error_set("expected a JSON object at the top level, got %s", json_type_name(root));
        return -1;
    }
    if (read_architecture(root, cfg) != 0 || check_fields(root, cfg) != 0 || read_sizes(root, cfg) != 0 ||
        read_floats(root, cfg) != 0 || read_family(root, cfg) != 0 || read_dtype(root, cfg) != 0)
        return -1;
    // transformers: int(head_dim · partial_rotary_factor), GLM-4.5's default 0.5; MLA turns qk_rope_head_dim
    const mt_family *fam = mt_config_family(cfg);
    if (!cfg->partial_rotary_factor) cfg->partial_rotary_factor = fam->partial_rotary ? 0.5 : 1.0;
    if (!cfg->mla) cfg->rotary_dim = (int64_t)((double)cfg->head_dim * cfg->partial_rotary_factor);
    const cJSON *q;
    if (get_field(root, "quantization_config", &q) != 0) return -1;
    if (q && !cJSON_IsNull(q) && read_quant(q, cfg) != 0) {
        mt_error_prefix("quantization_config");
        return -1;
    }
    return 0;
}

int mt_model_config_parse(const char *json, size_t len, const char *source, mt_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    if (json_prescan(json, len) != 0) {
        mt_error_prefix("%s", source);
        return -1;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        int line, col;
        size_t off = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        line_col(json, off, &line, &col);
        mt_error_set("%s: not valid JSON (line %d column %d)", source, line, col);
        return -1;
    }
    while (end < json + len && strchr(" \t\r\n", *end) && *end) end++;
    int rc = 0;
    if (end != json + len) {
        int line, col;
        line_col(json, (size_t)(end - json), &line, &col);
        mt_error_set("trailing characters after the JSON object (line %d column %d)", line, col);
        rc = -1;
    }
    if (rc == 0) rc = read_config(root, cfg);
    if (rc == 0) rc = mt_model_config_check(cfg);
    cJSON_Delete(root);
    if (rc != 0) mt_error_prefix("%s", source);
    return rc;
}

int mt_model_config_load(const char *path, mt_model_config *cfg) {
    char file[4200];
    if (mt_is_dir(path)) snprintf(file, sizeof file, "%s/config.json", path);
    else snprintf(file, sizeof file, "%s", path);
    memset(cfg, 0, sizeof *cfg);
    // A weights file named in place of its folder: say so instead of parsing its bytes as JSON.
    size_t plen = strlen(path);
    const char *slash = strrchr(path, '/');
    if (!mt_is_dir(path) && ((plen > 12 && strcmp(path + plen - 12, ".safetensors") == 0) ||
                             (plen > 4 && (strcmp(path + plen - 4, ".bin") == 0 || strcmp(path + plen - 4, ".pth") == 0)))) {
        mt_error_set("%s is a weights file: --model takes the checkpoint folder (%.*s) or its config.json", path,
                     slash ? (int)(slash - path) : 1, slash ? path : ".");
        return -1;
    }
    char *buf;
    size_t len;
    if (mt_read_file(file, CONFIG_MAX_BYTES, &buf, &len) != 0) return -1;
    size_t lead = 0;
    while (lead < len && (buf[lead] == ' ' || buf[lead] == '\n' || buf[lead] == '\r' || buf[lead] == '\t')) lead++;
    if (lead == len || buf[lead] != '{') {
        free(buf);
        mt_error_set("%s is not a config.json (it does not start with '{'): --model takes a checkpoint folder or its "
                     "config.json", file);
        return -1;
    }
    int rc = mt_model_config_parse(buf, len, file, cfg);
    free(buf);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Consistency and parameter counts.

// Parameter counts with overflow detection; 0 when some product overflows int64.
typedef struct { int64_t attn, expert, router, shared, dense, layer, total, active; } param_counts;

static int64_t cmul(int64_t a, int64_t b, int *ovf) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) *ovf = 1;
    return r;
}
static int64_t cadd(int64_t a, int64_t b, int *ovf) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) *ovf = 1;
    return r;
}

int64_t mt_config_layer_window(const mt_model_config *c, int64_t L) {
    if (!c->has_layer_types) return c->sliding_window;
    return L >= 0 && L < MT_CONFIG_MAX_LAYERS && c->layer_sliding[L] ? c->sliding_window : 0;
}

int64_t mt_config_rotary_dim(const mt_model_config *c) { return c->rotary_dim ? c->rotary_dim : c->head_dim; }

int64_t mt_config_v_head_dim(const mt_model_config *c) { return c->mla ? c->v_head_dim : c->head_dim; }

double mt_config_attn_scale(const mt_model_config *c) {
    if (!c->mla) return 1.0f / sqrtf((float)c->head_dim);  // the kernels' own 1/sqrt(hd), as before MLA
    double scale = 1.0 / sqrt((double)c->head_dim);
    // DeepSeek's attention: the softmax scale times yarn_get_mscale(factor, mscale_all_dim)², in Python doubles
    if (c->mla && c->rope_yarn && c->rope_mscale_all_dim != 0 && c->rope_factor > 1) {
        double ms = 0.1 * c->rope_mscale_all_dim * log(c->rope_factor) + 1.0;
        scale = scale * ms * ms;
    }
    return scale;
}

int mt_config_layer_is_moe(const mt_model_config *c, int64_t L) {
    if (L < c->first_k_dense) return 0;  // DeepSeek-style: first_k_dense_replace
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only_layers[i] == L) return 0;
    // A step of 0 is a config built in code without the field (plan.c): every layer is MoE.
    return c->decoder_sparse_step <= 1 || (L + 1) % c->decoder_sparse_step == 0;
}

int64_t mt_config_moe_layers(const mt_model_config *c) {
    int64_t n = 0;
    for (int64_t L = 0; L < c->layers; L++) n += mt_config_layer_is_moe(c, L);
    return n;
}

// MLA's projections of one layer (docs/families.md "DeepSeek-style"), norms and biases included.
static int64_t mla_params(const mt_model_config *c, int *o) {
    int64_t h = c->hidden, nh = c->heads, qr = c->q_lora_rank, kvr = c->kv_lora_rank;
    int64_t qo = cmul(nh, c->head_dim, o), kva = kvr + c->qk_rope_dim;
    int64_t n = qr ? cadd(cadd(cmul(h, qr, o), qr, o), cmul(qr, qo, o), o) : cmul(h, qo, o);  // q_a, its norm, q_b
    n = cadd(n, cadd(cmul(h, kva, o), kvr, o), o);                                             // kv_a, its norm
    n = cadd(n, cmul(kvr, cmul(nh, c->qk_nope_dim + c->v_head_dim, o), o), o);                 // kv_b
    n = cadd(n, cmul(cmul(nh, c->v_head_dim, o), h, o), o);                                    // o
    if (c->o_bias) n = cadd(n, cadd(cadd(qr, kva, o), h, o), o);  // attention_bias: q_a, kv_a, o
    return n;
}

static int count_params(const mt_model_config *c, param_counts *p) {
    int o = 0;
    const mt_family *fam = mt_config_family(c);
    int64_t q = cmul(c->heads, c->head_dim, &o), kv = cmul(c->kv_heads, c->head_dim, &o);
    int64_t h2 = cmul(2, c->hidden, &o);
    p->attn = cadd(cmul(h2, q, &o), cmul(h2, kv, &o), &o);
    if (c->qkv_bias) p->attn = cadd(p->attn, cadd(q, cmul(2, kv, &o), &o), &o);
    if (c->o_bias) p->attn = cadd(p->attn, c->hidden, &o);
    if (c->mla) p->attn = mla_params(c, &o);
    if (c->qk_norm == MT_QK_NORM_HEAD) p->attn = cadd(p->attn, cmul(2, c->head_dim, &o), &o);
    if (c->qk_norm == MT_QK_NORM_PROJ) p->attn = cadd(p->attn, cadd(q, kv, &o), &o);
    if (fam->attn_sinks) p->attn = cadd(p->attn, c->heads, &o);
    p->expert = cmul(cmul(3, c->hidden, &o), c->intermediate, &o);
    if (fam->fused_experts) p->expert = cadd(p->expert, cadd(cmul(2, c->intermediate, &o), c->hidden, &o), &o);  // biases
    p->router = cmul(fam->router_bias ? c->hidden + 1 : c->hidden, c->experts, &o);
    p->shared = c->shared_intermediate ? cadd(cmul(cmul(3, c->hidden, &o), c->shared_intermediate, &o),
                                              fam->shared_gate ? c->hidden : 0, &o)
                                       : 0;  // the shared expert and its [1, H] gate (Qwen2-MoE)
    p->dense = cmul(cmul(3, c->hidden, &o), c->dense_intermediate, &o);
    int64_t common = cadd(p->attn, h2, &o);  // + 2 RMSNorms
    int64_t moe_common = cadd(cadd(common, p->router, &o), p->shared, &o);
    p->layer = cadd(moe_common, cmul(c->experts, p->expert, &o), &o);
    int64_t n_moe = mt_config_moe_layers(c), n_dense = c->layers - n_moe;
    int64_t dense_layer = cadd(common, p->dense, &o);
    int64_t embed = cmul(cmul(c->vocab, c->hidden, &o), c->tie_word_embeddings ? 1 : 2, &o);
    int64_t outer = cadd(cadd(embed, c->hidden, &o), cmul(n_dense, dense_layer, &o), &o);  // + final norm
    p->total = cadd(cmul(n_moe, p->layer, &o), outer, &o);
    int64_t active_layer = cadd(moe_common, cmul(c->top_k, p->expert, &o), &o);
    p->active = cadd(cmul(n_moe, active_layer, &o), outer, &o);
    return !o;
}

static int check_positive(const char *field, int64_t v) {
    if (v > 0) return 0;
    mt_error_set("%s (%lld) must be positive", field, (long long)v);
    return -1;
}

static int check_sizes(const mt_model_config *c) {
    if (check_positive("hidden_size", c->hidden) || check_positive("intermediate_size", c->intermediate) ||
        check_positive("num_hidden_layers", c->layers) ||
        check_positive("num_attention_heads", c->heads) ||
        check_positive("num_key_value_heads", c->kv_heads) || check_positive("head_dim", c->head_dim) ||
        check_positive("num_local_experts", c->experts) || check_positive("vocab_size", c->vocab) ||
        check_positive("max_position_embeddings", c->max_positions))
        return -1;
    if (c->heads % c->kv_heads != 0) {
        mt_error_set("num_key_value_heads (%lld) does not divide num_attention_heads (%lld)",
                     (long long)c->kv_heads, (long long)c->heads);
        return -1;
    }
    if (c->top_k < 1 || c->top_k > c->experts) {
        mt_error_set("num_experts_per_tok (%lld) must be between 1 and num_local_experts (%lld)",
                     (long long)c->top_k, (long long)c->experts);
        return -1;
    }
    if (c->sliding_window < 0) {
        mt_error_set("sliding_window (%lld) must be 0 (none) or positive", (long long)c->sliding_window);
        return -1;
    }
    const char *tok[2] = {"bos_token_id", "eos_token_id"};
    int64_t id[2] = {c->bos_token_id, c->eos_token_id};
    for (int i = 0; i < 2; i++)
        if (id[i] < -1 || id[i] >= c->vocab) {
            mt_error_set("%s (%lld) is outside the vocabulary (vocab_size %lld)", tok[i],
                         (long long)id[i], (long long)c->vocab);
            return -1;
        }
    param_counts p;
    if (!count_params(c, &p)) {
        mt_error_set("the parameter count overflows 64 bits (hidden_size %lld, intermediate_size "
                     "%lld, num_local_experts %lld)",
                     (long long)c->hidden, (long long)c->intermediate, (long long)c->experts);
        return -1;
    }
    return 0;
}

static int check_floats(const mt_model_config *c) {
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps)) {
        mt_error_set("rms_norm_eps (%g) must be positive", c->rms_norm_eps);
        return -1;
    }
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta)) {
        mt_error_set("rope_theta (%g) must be positive", c->rope_theta);
        return -1;
    }
    if (!(c->router_aux_loss_coef >= 0) || !isfinite(c->router_aux_loss_coef)) {
        mt_error_set("router_aux_loss_coef (%g) must be 0 or positive", c->router_aux_loss_coef);
        return -1;
    }
    if (!(c->router_jitter_noise >= 0 && c->router_jitter_noise < 1)) {
        mt_error_set("router_jitter_noise (%g) must be in [0, 1)", c->router_jitter_noise);
        return -1;
    }
    if (!(c->initializer_range >= 0) || !isfinite(c->initializer_range)) {
        mt_error_set("initializer_range (%g) must be 0 or positive", c->initializer_range);
        return -1;
    }
    return 0;
}

// DeepSeek-style routing and MLA: the groups split the experts evenly and leave top_k to choose
// from; everything absent elsewhere.
static int check_deepseek(const mt_model_config *c) {
    const mt_family *fam = mt_config_family(c);
    int64_t rot = mt_config_rotary_dim(c);
    if (rot < 2 || rot % 2 || rot > c->head_dim) {
        mt_error_set("RoPE's dims (%lld: head_dim x partial_rotary_factor) must be even, at least 2 and at most "
                     "head_dim %lld", (long long)rot, (long long)c->head_dim);
        return -1;
    }
    if (fam->route == MT_ROUTE_SOFTMAX && !fam->mla) {  // a config built in code may leave these 0
        if (c->n_group > 1 || c->first_k_dense || c->mla || (c->routed_scaling != 0 && c->routed_scaling != 1)) {
            mt_error_set("n_group, first_k_dense_replace, routed_scaling_factor, MLA: %s has none of them",
                         fam->model_type);
            return -1;
        }
        return 0;
    }
    if (c->n_group < 1 || c->topk_group < 1 || c->experts % c->n_group || c->topk_group > c->n_group ||
        c->top_k > c->topk_group * (c->experts / c->n_group) ||
        (fam->route == MT_ROUTE_SIGMOID_GROUPED && c->n_group > 1 && c->experts / c->n_group < 2)) {
        mt_error_set("n_group %lld, topk_group %lld: the groups must split the %lld experts evenly (at least 2 each "
                     "for a sigmoid router) and hold num_experts_per_tok %lld",
                     (long long)c->n_group, (long long)c->topk_group, (long long)c->experts, (long long)c->top_k);
        return -1;
    }
    if (!(c->routed_scaling > 0) || !isfinite(c->routed_scaling)) {
        mt_error_set("routed_scaling_factor (%g) must be positive", c->routed_scaling);
        return -1;
    }
    if (c->first_k_dense < 0 || c->first_k_dense > c->layers || (c->first_k_dense && !fam->first_k_dense)) {
        mt_error_set("first_k_dense_replace (%lld) must be between 0 and num_hidden_layers (%lld) where the family "
                     "has it", (long long)c->first_k_dense, (long long)c->layers);
        return -1;
    }
    if (c->mla != fam->mla || (c->mla && (c->kv_lora_rank < 1 || c->qk_nope_dim < 1 || c->qk_rope_dim < 2 ||
                                          c->qk_rope_dim % 2 || c->v_head_dim < 1 || c->q_lora_rank < 0 ||
                                          c->head_dim != c->qk_nope_dim + c->qk_rope_dim))) {
        mt_error_set("MLA sizes (kv_lora_rank %lld, qk_nope_head_dim %lld, qk_rope_head_dim %lld, v_head_dim %lld): "
                     "positive, the rope part even, and only for %s", (long long)c->kv_lora_rank,
                     (long long)c->qk_nope_dim, (long long)c->qk_rope_dim, (long long)c->v_head_dim,
                     fam->mla ? fam->model_type : "MLA families");
        return -1;
    }
    return 0;
}

// The family's own fields: present where the family has them, sensible where present.
static int check_family(const mt_model_config *c) {
    const mt_family *fam = mt_config_family(c);
    if (c->decoder_sparse_step < 0 || (fam->has_dense_layers && c->decoder_sparse_step < 1)) {
        mt_error_set("decoder_sparse_step (%lld) must be positive", (long long)c->decoder_sparse_step);
        return -1;
    }
    if (c->n_mlp_only < 0 || c->n_mlp_only > MT_CONFIG_MAX_MLP_ONLY || (c->n_mlp_only && !fam->has_dense_layers && !fam->mlp_layer_types)) {
        mt_error_set("mlp_only_layers: %s has no dense MLP layers", fam->model_type);
        return -1;
    }
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only_layers[i] < 0 || c->mlp_only_layers[i] >= c->layers ||
            (i && c->mlp_only_layers[i] <= c->mlp_only_layers[i - 1])) {
            mt_error_set("mlp_only_layers: entry %d (%d) is not an ascending layer index below %lld", i,
                         c->mlp_only_layers[i], (long long)c->layers);
            return -1;
        }
    if (check_deepseek(c) != 0) return -1;
    if (fam->has_dense_layers || fam->first_k_dense ? c->dense_intermediate <= 0 : c->dense_intermediate != 0) {
        mt_error_set("intermediate_size (dense layers: %lld) must be positive for %s and 0 otherwise",
                     (long long)c->dense_intermediate, fam->model_type);
        return -1;
    }
    if (fam->shared_expert ? c->shared_intermediate <= 0 : c->shared_intermediate != 0) {
        mt_error_set("shared_expert_intermediate_size (%lld) must be positive for %s and absent otherwise",
                     (long long)c->shared_intermediate, fam->model_type);
        return -1;
    }
    if (fam->norm_topk_fixed && !c->norm_topk_prob) {
        mt_error_set("norm_topk_prob: %s always renormalises the top-k weights", fam->model_type);
        return -1;
    }
    if ((c->qkv_bias && !fam->qkv_bias_key && !fam->attn_bias_key) || (c->o_bias && !fam->attn_bias_key)) {
        mt_error_set("attention biases: %s has none", fam->model_type);
        return -1;
    }
    if (!(c->clip_qkv >= 0) || !isfinite(c->clip_qkv) || (c->clip_qkv > 0 && !fam->has_clip_qkv)) {
        mt_error_set("clip_qkv (%g): must be positive or none, and only where the family has it", c->clip_qkv);
        return -1;
    }
    if (!c->mla && fam->head_dim_rule != MT_HEAD_DIM_EXPLICIT && c->head_dim * c->heads != c->hidden) {
        mt_error_set("head_dim (%lld) x num_attention_heads (%lld) must equal hidden_size (%lld) for %s",
                     (long long)c->head_dim, (long long)c->heads, (long long)c->hidden, fam->model_type);
        return -1;
    }
    if (c->router_jitter_noise != 0 && !fam->has_jitter) {
        mt_error_set("router_jitter_noise: %s has no router jitter", fam->model_type);
        return -1;
    }
    if (fam->clamped_swiglu ? !(c->swiglu_limit > 0 && c->swiglu_alpha > 0) : c->swiglu_limit || c->swiglu_alpha) {
        mt_error_set("swiglu_limit, swiglu_alpha (%g, %g): positive for %s, absent otherwise", c->swiglu_limit,
                     c->swiglu_alpha, fam->model_type);
        return -1;
    }
    if (c->has_layer_types && (!fam->has_layer_types || c->layers > MT_CONFIG_MAX_LAYERS)) {
        mt_error_set("layer_types: %s has no per-layer attention types (or more than %d layers)", fam->model_type,
                     MT_CONFIG_MAX_LAYERS);
        return -1;
    }
    if (c->mxfp4 && (!fam->fused_experts || c->quantized)) {
        mt_error_set("quantization_config: mxfp4 is gpt-oss's format for its fused experts (%s), and not with "
                     "bitsandbytes", fam->model_type);
        return -1;
    }
    if (c->rope_yarn && !(c->rope_factor > 0 && c->rope_original_max > 0 && c->rope_attention_factor >= 0)) {
        mt_error_set("rope_scaling (yarn): factor %g and original_max_position_embeddings %lld must be positive",
                     c->rope_factor, (long long)c->rope_original_max);
        return -1;
    }
    return 0;
}

int mt_model_config_check(const mt_model_config *c) {
    if ((unsigned)c->family >= MT_FAMILY_COUNT) {
        mt_error_set("model_type: unknown family %d", (int)c->family);
        return -1;
    }
    const mt_family *fam = mt_config_family(c);
    if (strcmp(c->architecture, fam->architecture) != 0) {
        mt_error_set("architectures: unsupported architecture '%.64s' for model_type %s", c->architecture,
                     fam->model_type);
        return -1;
    }
    if (strcmp(c->model_type, fam->model_type) != 0) {
        mt_error_set("model_type: unsupported model_type '%.32s'", c->model_type);
        return -1;
    }
    if (check_sizes(c) != 0 || check_floats(c) != 0 || check_family(c) != 0) return -1;
    if (c->torch_dtype != MT_BF16 && c->torch_dtype != MT_F32 && c->torch_dtype != MT_F16) {
        mt_error_set("torch_dtype: unsupported dtype '%s'", mt_dtype_name(c->torch_dtype));
        return -1;
    }
    if (c->quantized && strcmp(c->quant_type, "nf4") != 0 && strcmp(c->quant_type, "fp4") != 0) {
        mt_error_set("quantization_config: bnb_4bit_quant_type '%.8s' is not nf4 or fp4",
                     c->quant_type);
        return -1;
    }
    return 0;
}

// The public counts assume a checked config (mt_model_config_check rejects overflow).
int64_t mt_config_attn_params(const mt_model_config *cfg) {
    param_counts p;
    count_params(cfg, &p);
    return p.attn;
}
int64_t mt_config_expert_params(const mt_model_config *cfg) {
    param_counts p;
    count_params(cfg, &p);
    return p.expert;
}
int64_t mt_config_router_params(const mt_model_config *cfg) {
    param_counts p;
    count_params(cfg, &p);
    return p.router;
}
int64_t mt_config_layer_params(const mt_model_config *cfg) {
    param_counts p;
    count_params(cfg, &p);
    return p.layer;
}
int64_t mt_config_shared_expert_params(const mt_model_config *cfg) {
    param_counts p;
    count_params(cfg, &p);
    return p.shared;
}
int64_t mt_config_dense_mlp_params(const mt_model_config *cfg) {
    param_counts p;
    count_params(cfg, &p);
    return p.dense;
}
int64_t mt_config_total_params(const mt_model_config *cfg) {
    param_counts p;
    count_params(cfg, &p);
    return p.total;
}
int64_t mt_config_active_params(const mt_model_config *cfg) {
    param_counts p;
    count_params(cfg, &p);
    return p.active;
}

// ---------------------------------------------------------------------------------------------
// Writing: the layout of transformers' save_pretrained (json.dumps(indent=2, sort_keys=True)),
// floats as Python's repr prints them, so a config we write diffs cleanly against theirs.

typedef struct { char *p; size_t len, cap; } strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->len + (size_t)n + 1 > b->cap) {
        b->cap = (b->len + (size_t)n + 1) * 2;
        b->p = mt_xrealloc(b->p, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

// Python repr(float): shortest round-trip digits; exponent form outside 1e-4 <= |v| < 1e16.
static void format_py_float(char *out, size_t cap, double v) {
    char e[40];
    int prec = 0;
    for (; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, v);
        if (strtod(e, NULL) == v) break;
    }
    // e = "[-]d[.ddd]e[+-]XX": split into sign, digits and exponent.
    const char *s = e;
    int neg = *s == '-';
    if (neg) s++;
    char digits[24];
    size_t nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    digits[nd] = 0;
    int exp = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    char body[64];
    if (exp < -4 || exp >= 16) {
        snprintf(body, sizeof body, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1,
                 exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        size_t k = 0;
        body[k++] = '0';
        body[k++] = '.';
        for (int i = 0; i < -exp - 1; i++) body[k++] = '0';
        snprintf(body + k, sizeof body - k, "%s", digits);
    } else {
        size_t intlen = (size_t)exp + 1, k = 0;
        for (size_t i = 0; i < intlen; i++) body[k++] = i < nd ? digits[i] : '0';
        body[k++] = '.';
        if (nd > intlen) for (size_t i = intlen; i < nd; i++) body[k++] = digits[i];
        else body[k++] = '0';
        body[k] = 0;
    }
    snprintf(out, cap, "%s%s", neg ? "-" : "", body);
}

static void emit_key(strbuf *b, int indent, int *first, const char *key) {
    sb_printf(b, "%s\n%*s\"%s\": ", *first ? "" : ",", indent, "", key);
    *first = 0;
}
static void emit_int(strbuf *b, int indent, int *first, const char *key, int64_t v) {
    emit_key(b, indent, first, key);
    sb_printf(b, "%lld", (long long)v);
}
static void emit_float(strbuf *b, int indent, int *first, const char *key, double v) {
    char s[72];  // body (< 64) and a sign
    format_py_float(s, sizeof s, v);
    emit_key(b, indent, first, key);
    sb_printf(b, "%s", s);
}
// Raw JSON text: strings here are fixed names checked on load, so need no escaping.
static void emit_raw(strbuf *b, int indent, int *first, const char *key, const char *json) {
    emit_key(b, indent, first, key);
    sb_printf(b, "%s", json);
}
static void emit_str(strbuf *b, int indent, int *first, const char *key, const char *s) {
    emit_key(b, indent, first, key);
    sb_printf(b, "\"%s\"", s);
}
static void emit_token(strbuf *b, int *first, const char *key, int64_t id) {
    if (id < 0) emit_raw(b, 2, first, key, "null");
    else emit_int(b, 2, first, key, id);
}

// transformers' BitsAndBytesConfig.to_dict(), sorted; compute dtype follows the model's.
static void emit_quant(strbuf *b, int *first, const mt_model_config *c) {
    emit_key(b, 2, first, "quantization_config");
    sb_printf(b, "{");
    int f = 1;
    emit_raw(b, 4, &f, "_load_in_4bit", "true");
    emit_raw(b, 4, &f, "_load_in_8bit", "false");
    emit_str(b, 4, &f, "bnb_4bit_compute_dtype", torch_dtype_name(c->torch_dtype));
    emit_str(b, 4, &f, "bnb_4bit_quant_storage", "uint8");
    emit_str(b, 4, &f, "bnb_4bit_quant_type", c->quant_type);
    emit_raw(b, 4, &f, "bnb_4bit_use_double_quant", c->double_quant ? "true" : "false");
    emit_raw(b, 4, &f, "llm_int8_enable_fp32_cpu_offload", "false");
    emit_raw(b, 4, &f, "llm_int8_has_fp16_weight", "false");
    emit_raw(b, 4, &f, "llm_int8_skip_modules", "null");
    emit_float(b, 4, &f, "llm_int8_threshold", 6.0);
    emit_raw(b, 4, &f, "load_in_4bit", "true");
    emit_raw(b, 4, &f, "load_in_8bit", "false");
    emit_str(b, 4, &f, "quant_method", "bitsandbytes");
    sb_printf(b, "\n  }");
}

// The block-FP8 quantization_config as DeepSeek-V3's config.json has it.
static void emit_fp8(strbuf *b, int *first, const mt_model_config *c) {
    emit_key(b, 2, first, "quantization_config");
    sb_printf(b, "{");
    int f = 1;
    emit_str(b, 4, &f, "activation_scheme", "dynamic");
    emit_str(b, 4, &f, "fmt", "e4m3");
    emit_str(b, 4, &f, "quant_method", "fp8");
    if (c->fp8_scale_ue8m0) emit_str(b, 4, &f, "scale_fmt", "ue8m0");
    emit_key(b, 4, &f, "weight_block_size");
    sb_printf(b, "[\n      %d,\n      %d\n    ]\n  }", c->fp8_block[0], c->fp8_block[1]);
}

static void emit_bool(strbuf *b, int *first, const char *key, int v) { emit_raw(b, 2, first, key, v ? "true" : "false"); }

// Keys in sorted order, each where the family has it (model/family.h); the values round-trip
// through mt_model_config_parse.
static void emit_config(strbuf *b, const mt_model_config *c) {
    const mt_family *fam = mt_config_family(c);
    int f = 1, qwen_sizes = strcmp(fam->expert_size_key, "moe_intermediate_size") == 0;
    sb_printf(b, "{");
    emit_key(b, 2, &f, "architectures");
    sb_printf(b, "[\n    \"%s\"\n  ]", c->architecture);
    int ds = fam->route != MT_ROUTE_SOFTMAX || fam->mla, glm_bias = fam->qkv_bias_key && !strcmp(fam->qkv_bias_key, "attention_bias");
    if (fam->attn_bias_key) emit_bool(b, &f, fam->attn_bias_key, c->o_bias);
    if (glm_bias) emit_bool(b, &f, fam->qkv_bias_key, c->qkv_bias);
    emit_float(b, 2, &f, "attention_dropout", 0.0);
    if (ds && (c->seq_aux || c->aux_loss_alpha != 0)) emit_float(b, 2, &f, "aux_loss_alpha", c->aux_loss_alpha);
    emit_token(b, &f, "bos_token_id", c->bos_token_id);
    if (fam->has_clip_qkv) {
        if (c->clip_qkv > 0) emit_float(b, 2, &f, "clip_qkv", c->clip_qkv);
        else emit_raw(b, 2, &f, "clip_qkv", "null");
    }
    if (fam->has_dense_layers) emit_int(b, 2, &f, "decoder_sparse_step", c->decoder_sparse_step);
    emit_token(b, &f, "eos_token_id", c->eos_token_id);
    if (ds && !c->n_mlp_only) emit_int(b, 2, &f, "first_k_dense_replace", c->first_k_dense);
    if (fam->head_dim_rule == MT_HEAD_DIM_EXPLICIT && (c->head_dim * c->heads != c->hidden || fam->default_head_dim))
        emit_int(b, 2, &f, "head_dim", c->head_dim);
    emit_str(b, 2, &f, "hidden_act", "silu");
    emit_int(b, 2, &f, "hidden_size", c->hidden);
    emit_float(b, 2, &f, "initializer_range", c->initializer_range);
    emit_int(b, 2, &f, "intermediate_size", qwen_sizes ? c->dense_intermediate : c->intermediate);
    if (c->mla) emit_int(b, 2, &f, "kv_lora_rank", c->kv_lora_rank);
    if (c->has_layer_types) {
        emit_key(b, 2, &f, "layer_types");
        sb_printf(b, "[");
        for (int64_t L = 0; L < c->layers; L++)
            sb_printf(b, "%s\n    \"%s\"", L ? "," : "", c->layer_sliding[L] ? "sliding_attention" : "full_attention");
        sb_printf(b, "\n  ]");
    }
    emit_int(b, 2, &f, "max_position_embeddings", c->max_positions);
    if (fam->mlp_layer_types) {
        emit_key(b, 2, &f, "mlp_layer_types");
        sb_printf(b, "[");
        for (int64_t L = 0; L < c->layers; L++)
            sb_printf(b, "%s\n    \"%s\"", L ? "," : "", mt_config_layer_is_moe(c, L) ? "sparse" : "dense");
        sb_printf(b, "\n  ]");
    }
    if (fam->has_dense_layers) {
        emit_key(b, 2, &f, "mlp_only_layers");
        if (!c->n_mlp_only) sb_printf(b, "[]");
        else {
            sb_printf(b, "[");
            for (int i = 0; i < c->n_mlp_only; i++) sb_printf(b, "%s\n    %d", i ? "," : "", c->mlp_only_layers[i]);
            sb_printf(b, "\n  ]");
        }
    }
    emit_str(b, 2, &f, "model_type", c->model_type);
    if (qwen_sizes) emit_int(b, 2, &f, "moe_intermediate_size", c->intermediate);
    if (ds) {
        emit_int(b, 2, &f, "n_group", c->n_group);
        emit_int(b, 2, &f, "n_routed_experts", c->experts);
        emit_int(b, 2, &f, "n_shared_experts", c->n_shared_experts);
    }
    if (!fam->norm_topk_fixed) emit_bool(b, &f, "norm_topk_prob", c->norm_topk_prob);
    emit_int(b, 2, &f, "num_attention_heads", c->heads);
    if (strcmp(fam->experts_key, "num_experts") == 0) emit_int(b, 2, &f, "num_experts", c->experts);
    emit_int(b, 2, &f, "num_experts_per_tok", c->top_k);
    emit_int(b, 2, &f, "num_hidden_layers", c->layers);
    emit_int(b, 2, &f, "num_key_value_heads", c->kv_heads);
    if (strcmp(fam->experts_key, "num_local_experts") == 0) emit_int(b, 2, &f, "num_local_experts", c->experts);
    if (ds) emit_int(b, 2, &f, "num_nextn_predict_layers", c->mtp_layers);
    emit_bool(b, &f, "output_router_logits", c->output_router_logits);
    if (fam->partial_rotary) emit_float(b, 2, &f, "partial_rotary_factor", c->partial_rotary_factor);
    if (c->mla) {
        if (c->q_lora_rank) emit_int(b, 2, &f, "q_lora_rank", c->q_lora_rank);
        else emit_raw(b, 2, &f, "q_lora_rank", "null");
        emit_int(b, 2, &f, "qk_nope_head_dim", c->qk_nope_dim);
        emit_int(b, 2, &f, "qk_rope_head_dim", c->qk_rope_dim);
    }
    if (fam->qkv_bias_key && !glm_bias) emit_bool(b, &f, fam->qkv_bias_key, c->qkv_bias);
    if (c->quantized) emit_quant(b, &f, c);
    if (c->mxfp4) {  // gpt-oss's own quantization_config: everything but the experts stays dense
        emit_key(b, 2, &f, "quantization_config");
        sb_printf(b, "{\n    \"modules_to_not_convert\": [\n      \"model.layers.*.self_attn\",\n      "
                     "\"model.layers.*.mlp.router\",\n      \"model.embed_tokens\",\n      \"lm_head\"\n    ],\n"
                     "    \"quant_method\": \"mxfp4\"\n  }");
    }
    if (c->fp8_block[0]) emit_fp8(b, &f, c);
    emit_float(b, 2, &f, "rms_norm_eps", c->rms_norm_eps);
    if (fam->rope_interleave_default < 0) emit_bool(b, &f, "rope_interleave", c->rope_interleave);
    if (c->rope_yarn) {  // transformers 4's rope_scaling, every field written
        emit_key(b, 2, &f, "rope_scaling");
        int g = 1;
        sb_printf(b, "{");
        if (c->rope_attention_factor > 0) emit_float(b, 4, &g, "attention_factor", c->rope_attention_factor);
        emit_float(b, 4, &g, "beta_fast", c->rope_beta_fast);
        emit_float(b, 4, &g, "beta_slow", c->rope_beta_slow);
        emit_float(b, 4, &g, "factor", c->rope_factor);
        if (c->rope_mscale != 0) emit_float(b, 4, &g, "mscale", c->rope_mscale);
        if (c->rope_mscale_all_dim != 0) emit_float(b, 4, &g, "mscale_all_dim", c->rope_mscale_all_dim);
        emit_int(b, 4, &g, "original_max_position_embeddings", c->rope_original_max);
        emit_str(b, 4, &g, "rope_type", "yarn");
        emit_raw(b, 4, &g, "truncate", c->rope_truncate ? "true" : "false");
        sb_printf(b, "\n  }");
    }
    emit_float(b, 2, &f, "rope_theta", c->rope_theta);
    if (ds) emit_float(b, 2, &f, "routed_scaling_factor", c->routed_scaling);
    if (ds && (c->seq_aux || c->aux_loss_alpha != 0)) emit_bool(b, &f, "seq_aux", c->seq_aux);
    emit_float(b, 2, &f, "router_aux_loss_coef", c->router_aux_loss_coef);
    if (fam->has_jitter) emit_float(b, 2, &f, "router_jitter_noise", c->router_jitter_noise);
    if (fam->shared_expert && !fam->shared_from_count)
        emit_int(b, 2, &f, "shared_expert_intermediate_size", c->shared_intermediate);
    if (c->sliding_window > 0) emit_int(b, 2, &f, "sliding_window", c->sliding_window);
    else if (fam->has_sliding_window) emit_raw(b, 2, &f, "sliding_window", "null");
    if (fam->clamped_swiglu) {
        emit_float(b, 2, &f, "swiglu_alpha", c->swiglu_alpha);
        emit_float(b, 2, &f, "swiglu_limit", c->swiglu_limit);
    }
    emit_raw(b, 2, &f, "tie_word_embeddings", c->tie_word_embeddings ? "true" : "false");
    if (ds) emit_int(b, 2, &f, "topk_group", c->topk_group);
    if (fam->route == MT_ROUTE_SOFTMAX_GROUPED) emit_str(b, 2, &f, "topk_method", c->route_grouped ? "group_limited_greedy" : "greedy");
    emit_str(b, 2, &f, "torch_dtype", torch_dtype_name(c->torch_dtype));
    if (fam->qk_norm_flag) emit_bool(b, &f, "use_qk_norm", c->qk_norm != MT_QK_NORM_NONE);
    if (fam->has_sliding_flag) emit_bool(b, &f, "use_sliding_window", 0);
    if (c->mla) emit_int(b, 2, &f, "v_head_dim", c->v_head_dim);
    emit_int(b, 2, &f, "vocab_size", c->vocab);
    sb_printf(b, "\n}\n");
}

int mt_model_config_write(const mt_model_config *cfg, const char *path) {
    // Refuse to write what we would refuse to read.
    if (mt_model_config_check(cfg) != 0) {
        mt_error_prefix("%s", path);
        return -1;
    }
    strbuf b = {0};
    emit_config(&b, cfg);
    int rc = mt_write_file_atomic(path, b.p, b.len);
    free(b.p);
    return rc;
}
