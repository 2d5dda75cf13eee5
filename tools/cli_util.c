/*
 * cli_util.c — common CLI flags, model opening, id parsing, error reporting.
 */
#include "cli_util.h"
#include "io/demo.h"
#include "io/kv_config.h"
#include "io/presets.h"
#include "model/tp.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tern %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

int cli_fail(const char *cmd, const tern_error *e) {
    fprintf(stderr, "tern %s: %s\n", cmd, e->msg[0] ? e->msg : tern_status_str(e->code));
    return tern_status_exit_code(e->code);
}

int cli_int(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi)
        return cli_usage_error(cmd, "%s expects an integer in [%ld, %ld], got '%s'", flag, lo, hi, v ? v : "");
    *out = x;
    return 0;
}

int cli_common_flag(cli_common *c, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long x;
    if (!strcmp(a, "--no-mmap")) { /* takes no value */
        c->no_mmap = 1;
        return 1;
    }
    if (!strcmp(a, "--device")) {
        if (!v || (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto"))) {
            cli_usage_error(argv[0], "--device expects cpu, cuda or auto, got '%s'", v ? v : "");
            return -1;
        }
        c->device = v;
    } else if (!strcmp(a, "--compute")) {
        c->compute_set = 1;
        if (v && !strcmp(v, "f32")) c->compute = TERN_COMPUTE_F32;
        else if (v && !strcmp(v, "bf16")) c->compute = TERN_COMPUTE_BF16;
        else if (v && !strcmp(v, "bf16x2")) c->compute = TERN_COMPUTE_BF16X2; /* CUDA: f32-accurate GEMM inputs */
        else if (v && !strcmp(v, "int8")) c->compute = TERN_COMPUTE_INT8; /* int8 x for Q8/Q4 matmuls (CUDA: Q4 GEMVs) */
        else { cli_usage_error(argv[0], "--compute expects f32, bf16, bf16x2 or int8, got '%s'", v ? v : ""); return -1; }
    } else if (!strcmp(a, "--threads")) {
        if (cli_int(argv[0], a, v, 0, 1024, &x)) return -1;
        c->threads = (int)x;
    } else if (!strcmp(a, "--random")) {
        if (!v || !tern_preset_config(v)) {
            cli_usage_error(argv[0], "--random expects one of: %s", tern_preset_names());
            return -1;
        }
        c->random = v;
    } else if (!strcmp(a, "--quant")) {
        int b = 0;
        if (v && !strcmp(v, "bf16")) b = 0;
        else if (v && v[0] == 'q' && v[1] >= '2' && v[1] <= '8' && v[1] != '7' && !v[2]) b = v[1] - '0';
        else { cli_usage_error(argv[0], "--quant expects bf16, q2, q3, q4, q5, q6 or q8, got '%s'", v ? v : ""); return -1; }
        c->random_bits = b;
    } else if (!strcmp(a, "--group")) {
        if (cli_int(argv[0], a, v, 32, 128, &x)) return -1;
        if (x != 32 && x != 64 && x != 128) { cli_usage_error(argv[0], "--group expects 32, 64 or 128"); return -1; }
        c->random_group = (int)x;
    } else if (!strcmp(a, "--kv-quant")) {
        tern_kv_fmt f[2];
        tern_error e = {0};
        if (!v || (strcmp(v, "auto") && strcmp(v, "config") && tern_kv_quant_parse(v, f, &e))) {
            cli_usage_error(argv[0], "%s", v ? e.msg : "--kv-quant expects a value");
            return -1;
        }
        c->kv_quant = v;
    } else if (!strcmp(a, "--max-ctx")) {
        if (cli_int(argv[0], a, v, 1, 1 << 24, &x)) return -1;
        c->max_ctx = (int)x;
    } else if (!strcmp(a, "--gpus") || !strcmp(a, "--tp")) {
        if (cli_int(argv[0], a, v, 1, TERN_TP_MAX, &x)) return -1;
        c->gpus = (int)x;
    } else if (!strcmp(a, "--expert-cache")) { /* MoE expert offload (runtime/experts.h); 0 = off */
        char *end;
        double d = v ? strtod(v, &end) : -1;
        if (!v || end == v || *end || !(d >= 0 && d < 1e6)) {
            cli_usage_error(argv[0], "--expert-cache expects gigabytes >= 0, got '%s'", v ? v : "");
            return -1;
        }
        c->expert_cache_gb = d;
    } else if (!strcmp(a, "--expert-trace")) {
        if (!v) { cli_usage_error(argv[0], "--expert-trace expects a file"); return -1; }
        c->expert_trace = v;
    } else {
        return 0;
    }
    (*i)++;
    return 1;
}

static tern_status load_model(const cli_common *c, cli_session *s, char *dir, size_t n, tern_error *e) {
    tern_status st = TERN_OK;
    /* expert offload (runtime/experts.h); with --gpus N each rank caches its own experts */
    tern_model_opts mo = {.expert_cache_bytes = (size_t)(c->expert_cache_gb * 1073741824.0),
                          .expert_trace = c->expert_trace, .no_mmap = c->no_mmap, .max_batch = c->max_batch};
    /* MODEL "random:PRESET[:qB]" (what tern serve and the engine take) = --random PRESET [--quant qB] */
    const char *preset = c->random;
    int bits = c->random_bits;
    char rname[64];
    if (!preset && c->model && !strncmp(c->model, "random:", 7)) {
        if ((st = tern_preset_random_spec(c->model + 7, rname, sizeof rname, &bits, e))) return tern_err_wrap(e, st, "model");
        preset = rname;
    }
    if (preset) {
        const char *js = tern_preset_config(preset);
        tern_synth_spec spec = {.bits = bits, .group_size = c->random_group ? c->random_group : 64};
        if (!s->cfg && !(s->cfg = calloc(1, sizeof *s->cfg))) return tern_err(e, TERN_ENOMEM, "out of memory");
        if (!s->ws) {
            st = tern_config_parse(s->cfg, js, strlen(js), preset, e);
            if (!st) st = tern_weights_open_synth(&s->ws, s->cfg, &spec, e);
        }
        if (!st && s->tp) st = tern_tp_load(s->tp, s->cfg, s->ws, &mo, &s->model, e);
        else if (!st) st = tern_model_load_from(&s->model, s->cfg, s->ws, s->be, &mo, e);
        return st;
    }
    st = tern_model_path_resolve(c->model, dir, n, e);
    if (!st && s->tp) st = tern_tp_load_dir(s->tp, dir, &mo, &s->model, e);
    else if (!st) st = tern_model_load(&s->model, dir, s->be, &mo, e);
    if (!st && c->no_mmap) /* start-up line (only when asked: default output unchanged) */
        fprintf(stderr, "tern: weights read into memory (--no-mmap, 2 MB pages)%s\n",
                s->tp ? "; not with --gpus N yet: mapped" : "");
    return st;
}

int cli_open(const cli_common *c, int n_slots, cli_session *s) {
    memset(s, 0, sizeof *s);
    tern_error e = {0};
    tern_backend_opts bo = {.n_threads = c->threads, .device = 0, .compute = c->compute};
    const char *dev = c->device ? c->device : "auto";
    tern_status st = TERN_OK;
    int ranks = c->gpus > 0 ? c->gpus : tern_tp_env();
    if (ranks > 1) { /* tensor parallel (model/tp.h): GPUs 0..ranks-1, or CPU ranks with --device cpu */
        tern_tp_opts to = {.n = ranks, .cuda = strcmp(dev, "cpu") != 0, .n_threads = c->threads, .compute = c->compute};
        if (to.cuda && !c->compute_set) to.compute = TERN_COMPUTE_BF16;
        st = tern_tp_open(&s->tp, &to, &e);
        if (st && !strcmp(dev, "auto")) {
            tern_log(TERN_LOG_INFO, "%s; %d CPU ranks instead", e.msg, ranks);
            to.cuda = 0;
            to.compute = c->compute;
            st = tern_tp_open(&s->tp, &to, &e);
        }
        if (st) return cli_fail("open", &e);
        s->be = tern_tp_backend(s->tp, 0);
    }
    if (!s->be && (!strcmp(dev, "cuda") || !strcmp(dev, "auto"))) {
        tern_backend_opts go = bo;
        if (!c->compute_set) go.compute = TERN_COMPUTE_BF16; /* the GPU's default */
        st = tern_backend_cuda_open(&s->be, &go, &e);
        if (st && !strcmp(dev, "cuda")) return cli_fail("open", &e);
    }
    if (!s->be) {
        st = tern_backend_cpu_open(&s->be, &bo, &e);
        if (st) return cli_fail("open", &e);
    }
    char dir[4096] = "";
    st = load_model(c, s, dir, sizeof dir, &e);
    if (st == TERN_EUNSUPPORTED && !strcmp(dev, "auto") && s->be->device >= 0 && !s->tp) {
        /* --device auto: a model the GPU backend cannot run yet goes to the CPU */
        tern_log(TERN_LOG_INFO, "%s; using the CPU", e.msg);
        tern_model_free(s->model);
        s->model = NULL;
        tern_backend_close(s->be);
        s->be = NULL;
        st = tern_backend_cpu_open(&s->be, &bo, &e);
        if (!st) st = load_model(c, s, dir, sizeof dir, &e);
    }
    if (st) {
        cli_close(s);
        return cli_fail("load", &e);
    }
    if (n_slots > 0) {
        tern_kv_fmt *formats = NULL;
        const char *kvq = tern_kv_quant_default(c->kv_quant, s->be->device >= 0, /* auto on a GPU: bf16 pages (bf16 mode) */
                                                s->be->compute == TERN_COMPUTE_BF16 &&
                                                    !(c->compute_set && c->compute == TERN_COMPUTE_BF16X2));
        st = tern_kv_quant_plan(kvq, c->random ? NULL : dir, tern_model_cfg(s->model), &formats, NULL, &e);
        tern_kv_opts ko = {.n_slots = n_slots, .max_ctx = c->max_ctx, .formats = formats,
                           .chunk = tern_model_max_batch(s->model)};
        if (!st) st = s->tp ? tern_tp_kv_open(s->tp, &ko, &s->kv, &e) : tern_kv_open(&s->kv, s->be, tern_model_cfg(s->model), &ko, &e);
        free(formats);
        if (st) { cli_close(s); return cli_fail("kv", &e); }
    }
    return 0;
}

void cli_close(cli_session *s) {
    if (s->tp) { /* the group owns every rank's cache, model and backend */
        tern_tp_close(s->tp);
        s->kv = NULL;
        s->model = NULL;
        s->be = NULL;
    }
    tern_kv_close(s->kv);
    tern_model_free(s->model);
    tern_weights_close(s->ws);
    if (s->cfg) { tern_config_free(s->cfg); free(s->cfg); }
    tern_backend_close(s->be);
    memset(s, 0, sizeof *s);
}

int cli_parse_ids(const char *s, int32_t **ids) {
    *ids = NULL;
    if (!s || !*s) { fprintf(stderr, "tern: --ids needs a comma-separated list of token ids\n"); return -1; }
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *out = malloc(sizeof(int32_t) * cap);
    if (!out) return -1;
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "tern: bad token id list at '%.20s' (expected e.g. 2,17,99)\n", p);
            free(out);
            return -1;
        }
        out[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) { fprintf(stderr, "tern: token id list ends with ','\n"); free(out); return -1; }
    }
    *ids = out;
    return n;
}
