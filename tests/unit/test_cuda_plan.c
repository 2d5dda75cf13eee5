/*
 * test_cuda_plan.c — the CUDA backend's host-side launch planning that needs no GPU: the K split by waves
 * (cuda_internal.h tern__cuda_split_waves, TERN_QGEMM_WAVE / TERN_CUDA_QG4_WAVE=3) on the shapes whose ncu profiles
 * motivated it (bench/NOTES.md (cj)) and on edge cases, and the batch Q4 GEMM's whole K-split rule
 * (tern__cuda_qg4_split) under each TERN_CUDA_QG4_WAVE. Built without CUDA headers it prints one SKIP line.
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

/* the batch Q4 GEMM's slices on 132 SMs, 4 stages, the default mint, 32 MiB of partials */
static int q4s(long mb, int n, int rows, int in, int wave, int wgp) {
    const int nt = n <= 16 ? 2 : n <= 32 ? 4 : 8, nb = (n + nt * 8 - 1) / (nt * 8);
    return tern__cuda_qg4_split(mb * nb, nt, nb, in / 128, (size_t)n * rows, wgp, 132, 0, wave, 4, 0, 8u << 20);
}

TEST(qg4_split_rules) {
    /* 64 rows (ncu, NOTES (ca) / (cj)): the ceiling rule's second, nearly empty waves — llama3-8b q|k|v (48 row
     * blocks, K 4096) 6 slices = 288 blocks for 264 slots, down (32, K 14336) 9 = 288, gemma4-e4b down (20, K 10240) 14
     * = 280 — and the default (4) by waves: 5 (240), 8 (256), 12 (240) */
    static const struct { long mb; int rows, in, s2, s4; const char *what; } r64[] = {
        {48, 6144, 4096, 6, 5, "llama3-8b q|k|v"}, {32, 4096, 14336, 9, 8, "llama3-8b down"},
        {20, 2560, 10240, 14, 12, "e4b down"},
    };
    for (size_t i = 0; i < sizeof r64 / sizeof r64[0]; i++) {
        const int s2 = q4s(r64[i].mb, 64, r64[i].rows, r64[i].in, 2, 0);
        const int s4 = q4s(r64[i].mb, 64, r64[i].rows, r64[i].in, 4, 0);
        CHECK(s2 == r64[i].s2 && s4 == r64[i].s4, "%s at 64 rows: wave 2 S %d (want %d), 4 S %d (want %d)",
              r64[i].what, s2, r64[i].s2, s4, r64[i].s4);
        CHECK(s4 == q4s(r64[i].mb, 64, r64[i].rows, r64[i].in, 3, 0), "%s: 4 is 3 at 64 rows", r64[i].what);
    }
    /* 8 rows (the mma.sync kernel, 3 blocks an SM): 4 keeps the ceiling rule (one wave lost there, session 68) —
     * e4b down 20 slices (400 blocks) where 3 would take 16 (320) */
    CHECK(q4s(20, 8, 2560, 10240, 4, 0) == 20 && q4s(20, 8, 2560, 10240, 2, 0) == 20, "e4b down at 8 rows: the ceiling rule");
    CHECK(q4s(20, 8, 2560, 10240, 3, 0) == 16, "e4b down at 8 rows, wave 3: S %d", q4s(20, 8, 2560, 10240, 3, 0));
    /* 32 rows: 2 rounds down to one wave (264 / 48 = 5), 4 finds the same */
    CHECK(q4s(48, 32, 6144, 4096, 2, 0) == 5 && q4s(48, 32, 6144, 4096, 4, 0) == 5, "llama3-8b q|k|v at 32 rows");
    /* 128 rows (two 64-column tiles): llama3-8b q|k|v 3 slices (288 blocks, 1.09 waves) → 2 (192, one wave) */
    CHECK(q4s(48, 128, 6144, 4096, 2, 0) == 3 && q4s(48, 128, 6144, 4096, 4, 0) == 2, "llama3-8b q|k|v at 128 rows");
    /* the direct gate|up pair keeps its rule (one block a 64-row tile, no split when that fills the SMs) */
    CHECK(q4s(224, 64, 14336, 4096, 4, 1) == 1, "llama3-8b gate|up pair split");
    /* the partials bound: a split whose slices overflow the buffer shrinks (to 1 here) */
    CHECK(tern__cuda_qg4_split(20, 8, 1, 80, (size_t)8 << 20, 0, 132, 0, 4, 4, 0, 8u << 20) == 1, "partials bound");
    /* never more slices than K tiles over the fewest a block walks (mint 2 at one column tile) */
    for (int in = 128; in <= 16384; in += 128)
        for (int wave = 0; wave <= 4; wave++) {
            const int S = q4s(4, 64, 512, in, wave, 0);
            if (S < 1 || (S > 1 && S > (in / 128) / 2)) {
                CHECK(0, "K %d wave %d: S %d", in, wave, S);
                return;
            }
        }
}
#endif

int main(void) {
#if TERN_HAVE_CUDA
    RUN(split_waves_profiled_shapes);
    RUN(split_waves_edges);
    RUN(qg4_split_rules);
#else
    SKIP("cuda_plan", "built without CUDA: nvcc was not found");
#endif
    return test_done();
}
