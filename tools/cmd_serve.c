/*
 * cmd_serve.c — `tern serve [MODEL] [flags]`: run the OpenAI/Anthropic-compatible server
 * (src/server/server.h) until SIGINT/SIGTERM.
 *
 * The socket is bound first and the model loads in the background (/health answers 503 until
 * it is ready); once it is ready the command prints what was loaded and the memory plan, then
 * exactly `listening on http://HOST:PORT` on stdout (with --port 0 the port the kernel
 * picked). If the model fails to load the command prints the reason and exits with the
 * contract's code (2 bad input, 1 other). --temperature/--top-p/--top-k/--min-p/--seed set
 * the sampling a request gets for the fields it omits; --max-queue bounds the requests that
 * wait for a slot (beyond it: 429 with Retry-After). --ctx is --max-ctx.
 * `--fake-engine` serves the test engine of src/server/fake_engine.c (no model needed).
 */
#include "cli.h"
#include "cli_util.h"
#include "server/server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int usage(void) {
    fprintf(stderr,
            "usage: tern serve [MODEL] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--alias NAME]\n"
            "                  [--device cpu|cuda|auto] [--compute f32|bf16|bf16x2|int8] [--threads N] [--ctx|--max-ctx N] [--gpus N]\n"
            "                  [--max-concurrency N] [--max-batch-tokens N] [--max-queue N] [--memory-budget GB] [--kv-memory GB]\n"
            "                  [--prompt-cache GB] [--kv-quant off|8|4|turbo] [--speculative K] [--max-tokens N] [--max-body MB]\n"
            "                  [--timeout S] [--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed N]\n"
            "                  [--expert-cache GB] [--expert-trace FILE]   (MoE expert offload; 0 = off)\n"
            "                  [--no-mmap]   (read the weights into memory instead of mapping the files)\n"
            "MODEL is a model directory or `demo` (default).\n");
    return 2;
}

/* flags that take a value */
static int value_flag(const char *a) {
    static const char *k[] = {"--host", "--port", "--api-key", "--alias", "--device", "--compute", "--threads", "--gpus", "--tp",
                              "--max-ctx", "--max-concurrency", "--max-batch-tokens", "--memory-budget", "--kv-memory", "--prompt-cache",
                              "--kv-quant", "--max-tokens", "--max-body", "--timeout", "--ctx", "--max-queue",
                              "--temperature", "--top-p", "--top-k", "--min-p", "--seed", "--speculative",
                              "--expert-cache", "--expert-trace"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(a, k[i])) return 1;
    return 0;
}

static int dbl(const char *flag, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno || !(x >= 0) || x > 1e6)
        return cli_usage_error("serve", "%s expects a number >= 0, got '%s'", flag, v ? v : "");
    *out = x;
    return 0;
}

int tern_cmd_serve(int argc, char **argv) {
    tern_server_opts o = tern_server_default_opts();
    long x;
    double d;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else if (!strcmp(a, "--fake-engine")) { o.fake_engine = 1; takes = 0; }
        else if (!strcmp(a, "--no-mmap")) { o.engine.no_mmap = 1; takes = 0; } /* weights into 2 MB-page memory */
        else if (a[0] == '-' && !value_flag(a)) return cli_usage_error("serve", "unknown flag '%s' (try tern serve --help)", a);
        else if (!v && a[0] == '-') return cli_usage_error("serve", "%s needs a value", a);
        else if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--port")) { if (cli_int("serve", a, v, 0, 65535, &x)) return 2; o.port = (int)x; }
        else if (!strcmp(a, "--api-key")) o.api_key = v;
        else if (!strcmp(a, "--alias")) o.model_alias = v;
        else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto"))
                return cli_usage_error("serve", "--device expects cpu, cuda or auto, got '%s'", v);
            o.engine.device = v;
        } else if (!strcmp(a, "--compute")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16") && strcmp(v, "bf16x2") && strcmp(v, "int8"))
                return cli_usage_error("serve", "--compute expects f32, bf16, bf16x2 or int8, got '%s'", v);
            o.engine.compute_bf16 = !strcmp(v, "int8") ? 3 : !strcmp(v, "bf16x2") ? 2 : !strcmp(v, "bf16");
        } else if (!strcmp(a, "--threads")) { if (cli_int("serve", a, v, 0, 1024, &x)) return 2; o.engine.n_threads = (int)x; }
        else if (!strcmp(a, "--gpus") || !strcmp(a, "--tp")) { if (cli_int("serve", a, v, 1, 16, &x)) return 2; o.engine.gpus = (int)x; }
        else if (!strcmp(a, "--max-ctx") || !strcmp(a, "--ctx")) { if (cli_int("serve", a, v, 1, 1 << 24, &x)) return 2; o.engine.max_ctx = (int)x; }
        else if (!strcmp(a, "--max-concurrency")) {
            if (cli_int("serve", a, v, 1, 4096, &x)) return 2;
            o.engine.max_concurrency = (int)x;
        } else if (!strcmp(a, "--max-batch-tokens")) { /* rows per step: prefill chunk (default GPU 8192, 2048 under 70 GiB; CPU 512) */
            if (cli_int("serve", a, v, 1, 1 << 20, &x)) return 2;
            o.engine.max_batch_tokens = (int)x;
        } else if (!strcmp(a, "--memory-budget")) { if (dbl(a, v, &d)) return 2; o.engine.memory_budget_gb = d; }
        else if (!strcmp(a, "--kv-memory")) { if (dbl(a, v, &d)) return 2; o.engine.kv_memory_gb = d; }
        else if (!strcmp(a, "--prompt-cache")) { if (dbl(a, v, &d)) return 2; o.engine.prompt_cache_gb = d; }
        else if (!strcmp(a, "--kv-quant")) o.engine.kv_quant = v;
        else if (!strcmp(a, "--expert-cache")) { if (dbl(a, v, &d)) return 2; o.engine.expert_cache_gb = d; }
        else if (!strcmp(a, "--expert-trace")) o.engine.expert_trace = v;
        else if (!strcmp(a, "--speculative")) {
            if (cli_int("serve", a, v, 0, TERN_SPEC_MAX_K, &x)) return 2;
            o.engine.speculative_k = (int)x;
        }
        else if (!strcmp(a, "--max-tokens")) { if (cli_int("serve", a, v, 1, 1 << 24, &x)) return 2; o.default_max_tokens = (int)x; }
        else if (!strcmp(a, "--max-body")) { if (dbl(a, v, &d) || d < 0.001) return 2; o.max_body = (size_t)(d * 1048576.0); }
        else if (!strcmp(a, "--timeout")) { if (cli_int("serve", a, v, 1, 86400, &x)) return 2; o.timeout_s = (int)x; }
        else if (!strcmp(a, "--max-queue")) { if (cli_int("serve", a, v, 0, 1 << 20, &x)) return 2; o.max_queue = (int)x; }
        else if (!strcmp(a, "--temperature")) {
            if (dbl(a, v, &d) || d > 100) return d > 100 ? cli_usage_error("serve", "--temperature: %g outside [0, 100]", d) : 2;
            o.sampling.temperature = (float)d;
            o.sampling_set |= TERN_SRV_SET_TEMPERATURE;
        } else if (!strcmp(a, "--top-p")) {
            if (dbl(a, v, &d) || d <= 0 || d > 1) return cli_usage_error("serve", "--top-p expects a number in (0, 1], got '%s'", v);
            o.sampling.top_p = (float)d;
            o.sampling_set |= TERN_SRV_SET_TOP_P;
        } else if (!strcmp(a, "--min-p")) {
            if (dbl(a, v, &d) || d > 1) return cli_usage_error("serve", "--min-p expects a number in [0, 1], got '%s'", v);
            o.sampling.min_p = (float)d;
        } else if (!strcmp(a, "--top-k")) { if (cli_int("serve", a, v, 0, 1 << 24, &x)) return 2; o.sampling.top_k = (int)x; o.sampling_set |= TERN_SRV_SET_TOP_K; }
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long sv = strtoull(v, &end, 10);
            if (!*v || *end || errno || v[0] == '-') return cli_usage_error("serve", "--seed expects an integer >= 0, got '%s'", v);
            o.sampling.seed = sv;
            o.has_seed = 1;
        }
        else if (a[0] == '-') return cli_usage_error("serve", "unknown flag '%s' (try tern serve --help)", a);
        else if (!o.engine.model) { o.engine.model = a; takes = 0; }
        else return cli_usage_error("serve", "unexpected argument '%s'", a);
        i += takes;
    }
    if (!o.engine.model) o.engine.model = "demo";

    /* Signals are taken synchronously by this thread; block them before any thread starts. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    tern_server *s = NULL;
    tern_error err = {0};
    if (tern_server_start(&s, &o, &err)) return cli_fail("serve", &err);
    const char *h = tern_server_host(s);

    int loaded = 0, rc = 0;
    for (;;) {
        /* poll the load without blocking signals out (short naps: the demo loads in ms) */
        struct timespec ts = {0, (loaded ? 100 : 2) * 1000000L};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM) break;
        if (!loaded) {
            int st = tern__server_load_state(s);
            if (st == 1) {
                loaded = 1;
                fputs(tern_server_summary(s), stdout);
                printf(strchr(h, ':') ? "listening on http://[%s]:%d\n" : "listening on http://%s:%d\n", h,
                       tern_server_port(s));
                fflush(stdout);
            } else if (st == 2) {
                tern_server_wait_loaded(s, &err);
                rc = cli_fail("serve", &err);
                break;
            }
        }
    }
    tern_server_stop(s);
    return rc;
}
