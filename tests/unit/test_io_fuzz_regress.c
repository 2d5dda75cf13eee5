/*
 * test_io_fuzz_regress.c — replays every kept fuzz input (tests/fuzz/corpus/TARGET/ files)
 * through the io parsers: safetensors from memory and from a file, config.json and
 * generation_config.json. Each must return OK or an error with a message — never crash.
 * Inputs named seed_* are valid examples and must parse OK with their own parser.
 * Run from the repository root (tests/run.sh does); elsewhere the test SKIPs.
 */
#include "io/config.h"
#include "io/config_internal.h"
#include "io/safetensors.h"
#include "io_util.h"
#include "test.h"

#include <dirent.h>

static int n_files;

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    *n = len > 0 ? fread(b, 1, (size_t)len, f) : 0;
    fclose(f);
    return b;
}

static void replay_one(const char *path, const char *base, int is_st) {
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    CHECK(b != NULL, "read %s", path);
    if (!b) return;
    n_files++;
    int seed = !strncmp(base, "seed_", 5);
    tern_error e;
    memset(&e, 0, sizeof e);
    tern_st_set *s = NULL;
    tern_status st = tern__st_parse_buffer(&s, b, n, base, &e);
    CHECK(st == TERN_OK || e.msg[0], "%s: error without message", base);
    if (is_st && seed) CHECK(st == TERN_OK, "%s: seed must parse: %s", base, e.msg);
    tern_st_close(s);
    if (is_st) { /* same bytes through the mmap path */
        io_write_file(io_path("replay.safetensors"), b, n);
        tern_status st2 = tern_st_open(&s, io_path("replay.safetensors"), &e);
        CHECK(st2 == st, "%s: file path gives %d, buffer %d", base, st2, st);
        tern_st_close(s);
    }
    tern_model_config c;
    memset(&e, 0, sizeof e);
    st = tern_config_parse(&c, (const char *)b, n, "config.json", &e);
    CHECK(st == TERN_OK || e.msg[0], "%s: config error without message", base);
    if (!is_st && seed) CHECK(st == TERN_OK, "%s: seed must parse: %s", base, e.msg);
    if (st == TERN_OK) (void)tern__config_generation(&c, (const char *)b, n, "generation_config.json", &e);
    tern_config_free(&c);
    free(b);
}

static int replay_dir(const char *dir, int is_st) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *de;
    char path[1024];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        replay_one(path, de->d_name, is_st);
    }
    closedir(d);
    return 1;
}

TEST(fuzz_corpus_replay) {
    int a = replay_dir("tests/fuzz/corpus/fuzz_safetensors", 1);
    int b = replay_dir("tests/fuzz/corpus/fuzz_config", 0);
    CHECK(a && b && n_files > 0, "corpus dirs found=%d,%d files=%d", a, b, n_files);
}

int main(void) {
    DIR *d = opendir("tests/fuzz/corpus");
    if (!d) {
        SKIP("fuzz_corpus_replay", "run from the repository root");
        return 0;
    }
    closedir(d);
    RUN(fuzz_corpus_replay);
    printf("  replayed %d inputs\n", n_files);
    io_cleanup();
    return test_done();
}
