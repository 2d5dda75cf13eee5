/* test_engine_gen_defaults.c — generation_config.json sampling defaults reach tern_model_info
 * (the server and CLI use them when neither a flag nor the request sets a field). */
#include "tern.h"
#include "test.h"

#include <stdlib.h>

TEST(demo_generation_config_defaults) {
    char tmpl[] = "/tmp/tern_gen_XXXXXX";
    char *dir = mkdtemp(tmpl);
    CHECK(dir != NULL, "mkdtemp");
    if (!dir) return;
    setenv("TERN_CACHE", dir, 1);
    tern_engine_opts o = tern_engine_default_opts();
    o.model = "demo";
    o.device = "cpu";
    o.n_threads = 1;
    tern_engine *e = NULL;
    tern_error err = {0};
    CHECK(tern_engine_open(&e, &o, &err) == TERN_OK, "open: %s", err.msg);
    if (!e) return;
    tern_model_info mi;
    tern_engine_model_info(e, &mi);
    CHECK(fabsf(mi.gen_temperature - 0.8f) < 1e-6f, "temperature %g", mi.gen_temperature);
    CHECK(fabsf(mi.gen_top_p - 0.95f) < 1e-6f, "top_p %g", mi.gen_top_p);
    CHECK(mi.gen_top_k == -1, "top_k %d (absent -> -1)", mi.gen_top_k);
    tern_engine_close(e);
    tern_model_info none;
    tern_engine_model_info(NULL, &none);
    CHECK(none.gen_temperature < 0 && none.gen_top_p < 0 && none.gen_top_k < 0, "no engine -> absent");
    /* compute: bf16 where a GPU runs the model, f32 on the CPU (-1); 0 keeps f32 everywhere */
    CHECK(tern_engine_default_opts().compute_bf16 == -1, "default compute_bf16 %d", tern_engine_default_opts().compute_bf16);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

int main(void) {
    RUN(demo_generation_config_defaults);
    return test_done();
}
