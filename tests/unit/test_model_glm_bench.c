/*
 * test_model_glm_bench.c — smoke test of bench/bench_glm_gpu.c (the GLM-5 per-layer and latent
 * attention benchmark) on the CPU at toy sizes (preset glm5-tiny: 8 heads, latent 64, top-64):
 * every section runs (rates, dense + MoE layer in q4 and bf16, prefill chunks below and above
 * index_topk, decode after them, attention dense vs DSA around the top-k) and returns 0; bad
 * arguments are refused with 2. The numbers themselves are not checked (a shared CI machine).
 */
#define BENCH_GLM_GPU_NO_MAIN
#include "../../bench/bench_glm_gpu.c"

#include "test.h"

TEST(glm_bench_cpu_smoke) {
    char *argv[] = {"bench_glm_gpu", "--device", "cpu", "--preset", "glm5-tiny", "--quant", "q4,bf16", "--chunks",
                    "32,96", "--ctx", "64,160", "--rows", "1,4", "--gen", "2", "--threads", "2"};
    int rc = bench_glm_gpu_main((int)TERN_ARRAY_LEN(argv), argv);
    CHECK(rc == 0, "bench_glm_gpu on the CPU returned %d", rc);
}

TEST(glm_bench_bad_args) {
    char *a1[] = {"bench_glm_gpu", "--quant", "q9"};
    char *a2[] = {"bench_glm_gpu", "--chunks", "0"};
    char *a3[] = {"bench_glm_gpu", "--device", "tpu", "--no-layers"};
    char *a4[] = {"bench_glm_gpu", "--preset", "nope"};
    CHECK(bench_glm_gpu_main(3, a1) == 2, "bad --quant accepted");
    CHECK(bench_glm_gpu_main(3, a2) == 2, "bad --chunks accepted");
    CHECK(bench_glm_gpu_main(4, a3) == 2, "bad --device accepted");
    CHECK(bench_glm_gpu_main(3, a4) == 2, "bad --preset accepted");
}

int main(void) {
    RUN(glm_bench_cpu_smoke);
    RUN(glm_bench_bad_args);
    return test_done();
}
