/*
 * test_cuda_plan.c — the CUDA backend's host-side launch planning that needs no GPU: the K split by waves
 * (cuda_internal.h tern__cuda_split_waves, TERN_QGEMM_WAVE / TERN_CUDA_QG4_WAVE=3) on the shapes whose ncu profiles
 * motivated it (bench/NOTES.md (cj)) and on edge cases. Built without CUDA headers it prints one SKIP line.
 */
#include "test.h"

#if TERN_HAVE_CUDA
#include "backend/cuda/cuda_internal.h"

/* blocks a plan launches: base tiles × the slices the per-block steps give */
static long plan_blocks(long base, int nk, int S) {
    const int per = (nk + S - 1) / S;
    return base * ((nk + per - 1) / per);
}

TEST(split_waves_profiled_shapes) {
    /* qgemm.cu, one block an SM on 132 SMs: gemma4-e4b's precise q at 64 rows (16 row blocks, 20 K blocks, the fill
     * rule's 10 slices = 160 blocks, a second wave of 28) → 7 slices of 3 K blocks, 112 blocks in one wave */
    int S = tern__cuda_split_waves(16, 132, 20, 10, 1);
    CHECK(S == 7 && plan_blocks(16, 20, S) == 112, "e4b q: S %d, %ld blocks", S, plan_blocks(16, 20, S));
    /* gemma4-26b-a4b's k (16 row blocks, 22 K blocks, 11 slices = 176 blocks) → 8 of 3, 128 blocks */
    S = tern__cuda_split_waves(16, 132, 22, 11, 1);
    CHECK(S == 8 && plan_blocks(16, 22, S) == 128, "26b k: S %d", S);
    /* qg4w at two blocks an SM (264 slots): e4b's down at 64 rows (20 row blocks, 80 K tiles, 14 slices = 280
     * blocks) → 12 slices of 7 tiles, 240 blocks */
    S = tern__cuda_split_waves(20, 264, 80, 14, 1);
    CHECK(S == 12 && plan_blocks(20, 80, S) == 240, "e4b down: S %d", S);
    /* llama3-8b's gate|up-sized launch that already fits one wave keeps its split (112 row blocks, 32 tiles, 2) */
    S = tern__cuda_split_waves(112, 264, 32, 2, 1);
    CHECK(S == 2, "llama3-8b 14336x4096: S %d", S);
}

TEST(split_waves_edges) {
    /* never more slices than smax or K steps; at least one */
    for (int nk = 1; nk <= 40; nk++)
        for (int smax = 1; smax <= 48; smax++)
            for (long base = 1; base <= 300; base += 37) {
                const int S = tern__cuda_split_waves(base, 264, nk, smax, 1);
                if (S < 1 || S > smax || S > nk) {
                    CHECK(0, "base %ld nk %d smax %d: S %d", base, nk, smax, S);
                    return;
                }
                /* S is a slice count the per-block steps reproduce (the launchers round to it) */
                const int per = (nk + S - 1) / S;
                CHECK((nk + per - 1) / per == S, "base %ld nk %d smax %d: S %d not a fixed point", base, nk, smax, S);
            }
    /* a grid bigger than the slots: no split (every split only adds waves) */
    CHECK(tern__cuda_split_waves(1000, 264, 32, 8, 1) == 1, "big grid split");
    /* degenerate arguments do not divide by zero */
    CHECK(tern__cuda_split_waves(0, 0, 4, 4, 1) >= 1, "zero base / slots");
}
#endif

int main(void) {
#if TERN_HAVE_CUDA
    RUN(split_waves_profiled_shapes);
    RUN(split_waves_edges);
#else
    SKIP("cuda_plan", "built without CUDA: nvcc was not found");
#endif
    return test_done();
}
