/*
 * test_io_safetensors.c — safetensors open/validate: single file, directory, sharded index,
 * unaligned offsets, metadata, and every malformed-input case with its status and message.
 * Files are written by the test itself into a mkdtemp directory (io_util.h).
 */
#include "io/safetensors.h"
#include "io_util.h"
#include "test.h"

static tern_error e;

/* open path, expect status `want` and a message containing a and b (either may be NULL) */
static int expect_fail(const char *path, tern_status want, const char *a, const char *b) {
    tern_st_set *s = NULL;
    memset(&e, 0, sizeof e);
    tern_status st = tern_st_open(&s, path, &e);
    int ok = st == want && !s && (!a || strstr(e.msg, a)) && (!b || strstr(e.msg, b));
    if (!ok) printf("  got status %d (want %d): %s\n", st, want, e.msg);
    tern_st_close(s);
    return ok;
}

TEST(st_single_valid_unaligned) {
    float f[6] = {1, 2, 3, 4, 5, 6.5f};
    uint8_t u[3] = {7, 8, 9};
    uint16_t bf[5];
    for (int i = 0; i < 5; i++) bf[i] = tern_f32_to_bf16((float)i * 0.5f);
    int64_t sc = -42;
    uint32_t w[4] = {1, 2, 3, 0xffffffffu};
    st_t t[] = {
        {"a.u8", "U8", 1, {3}, u, 3},
        {"b.f32", "F32", 2, {2, 3}, f, sizeof f},       /* offset 3: unaligned */
        {"c.bf16", "BF16", 1, {5}, bf, sizeof bf},
        {"d.scalar", "I64", 0, {0}, &sc, 8},            /* offset 37: unaligned 8-byte */
        {"e.u32", "U32", 2, {2, 2}, w, sizeof w},
        {"f.empty", "F16", 2, {0, 4}, NULL, 0},
    };
    const char *p = io_path("single.safetensors");
    io_write_st(p, t, 6, "{\"format\":\"mlx\",\"n\":3}");
    tern_st_set *s = NULL;
    tern_status st = tern_st_open(&s, p, &e);
    CHECK(st == TERN_OK, "%s", e.msg);
    if (st) return;
    CHECK(tern_st_count(s) == 6, "count %d", tern_st_count(s));
    const tern_st_entry *b = tern_st_find(s, "b.f32");
    CHECK(b && b->dtype == TERN_DT_F32 && b->ndim == 2 && b->shape[0] == 2 && b->shape[1] == 3 && b->nbytes == 24, "b");
    if (b) {
        CHECK(((uintptr_t)b->data & 3) != 0, "expected an unaligned pointer");
        float got[6];
        memcpy(got, b->data, sizeof got);
        CHECK(!memcmp(got, f, sizeof f), "b data");
        CHECK(tern_load_f32(b->data, b->dtype, 5) == 6.5f, "unaligned load");
    }
    const tern_st_entry *d = tern_st_find(s, "d.scalar");
    CHECK(d && d->ndim == 0 && d->nbytes == 8, "scalar");
    if (d) {
        int64_t v;
        memcpy(&v, d->data, 8);
        CHECK(v == -42, "scalar value %lld", (long long)v);
    }
    const tern_st_entry *c = tern_st_find(s, "c.bf16");
    CHECK(c && tern_load_f32(c->data, TERN_DT_BF16, 3) == 1.5f, "bf16");
    const tern_st_entry *ee = tern_st_find(s, "f.empty");
    CHECK(ee && ee->nbytes == 0 && ee->shape[0] == 0, "empty tensor");
    CHECK(tern_st_find(s, "nope") == NULL, "absent");
    CHECK(tern_st_metadata(s, "format") && !strcmp(tern_st_metadata(s, "format"), "mlx"), "metadata");
    CHECK(tern_st_metadata(s, "n") == NULL, "non-string metadata is skipped");
    CHECK(strstr(tern_st_file_name(s, 0), "single.safetensors") != NULL, "file name");
    tern_st_close(s);
    tern_st_close(NULL);
}

static void write_two_shards(const char *dir) {
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    st_t s1[] = {{"x.weight", "F32", 2, {2, 2}, a, 16}};
    st_t s2[] = {{"y.weight", "F32", 1, {2}, b, 8}, {"z", "I8", 1, {3}, "abc", 3}};
    char p[512];
    io_mkdir(dir);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", io_path(dir));
    io_write_st(p, s1, 1, NULL);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", io_path(dir));
    io_write_st(p, s2, 2, NULL);
}

TEST(st_directory_and_sharded) {
    write_two_shards("plain");
    tern_st_set *s = NULL;
    CHECK(tern_st_open(&s, io_path("plain"), &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_st_count(s) == 3 && tern_st_file_count(s) == 2, "count");
    const tern_st_entry *y = tern_st_find(s, "y.weight");
    CHECK(y && y->file == 1 && tern_load_f32(y->data, TERN_DT_F32, 1) == 6.0f, "y");
    tern_st_close(s);

    write_two_shards("sharded");
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", io_path("sharded"));
    io_write_text(p, "{\"metadata\":{\"total_size\":27},\"weight_map\":{"
                     "\"x.weight\":\"model-00001-of-00002.safetensors\","
                     "\"y.weight\":\"model-00002-of-00002.safetensors\","
                     "\"z\":\"model-00002-of-00002.safetensors\"}}");
    s = NULL;
    CHECK(tern_st_open(&s, io_path("sharded"), &e) == TERN_OK, "%s", e.msg);
    const tern_st_entry *x = tern_st_find(s, "x.weight");
    CHECK(x && strstr(tern_st_file_name(s, x->file), "00001") && tern_load_f32(x->data, TERN_DT_F32, 3) == 4.0f, "x");
    tern_st_close(s);

    /* index names a missing shard */
    io_write_text(p, "{\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\","
                     "\"y.weight\":\"model-00009-of-00002.safetensors\"}}");
    CHECK(expect_fail(io_path("sharded"), TERN_ENOTFOUND, "model-00009-of-00002.safetensors", "y.weight"), "missing shard");
    /* index puts a tensor in the wrong shard */
    io_write_text(p, "{\"weight_map\":{\"x.weight\":\"model-00002-of-00002.safetensors\","
                     "\"y.weight\":\"model-00001-of-00002.safetensors\"}}");
    CHECK(expect_fail(io_path("sharded"), TERN_EFORMAT, "x.weight", "model-00001-of-00002"), "wrong shard");
    /* index names a tensor that is nowhere */
    io_write_text(p, "{\"weight_map\":{\"ghost\":\"model-00002-of-00002.safetensors\"}}");
    CHECK(expect_fail(io_path("sharded"), TERN_EFORMAT, "ghost", "no shard"), "ghost tensor");
    io_write_text(p, "{\"weight_map\":[1,2]}");
    CHECK(expect_fail(io_path("sharded"), TERN_EFORMAT, "weight_map", NULL), "weight_map not object");
    io_write_text(p, "{\"weight_map\":{\"x\":\"../etc/passwd\"}}");
    CHECK(expect_fail(io_path("sharded"), TERN_EFORMAT, "weight_map", NULL), "path in shard name");
    io_write_text(p, "not json");
    CHECK(expect_fail(io_path("sharded"), TERN_EFORMAT, "index.json", "not valid JSON"), "index not json");

    /* duplicate names across shards (directory form) */
    io_mkdir("dups");
    float a[1] = {1};
    st_t d1[] = {{"same.weight", "F32", 1, {1}, a, 4}};
    snprintf(p, sizeof p, "%s/a.safetensors", io_path("dups"));
    io_write_st(p, d1, 1, NULL);
    snprintf(p, sizeof p, "%s/b.safetensors", io_path("dups"));
    io_write_st(p, d1, 1, NULL);
    CHECK(expect_fail(io_path("dups"), TERN_EFORMAT, "same.weight", "duplicated"), "dup across shards");
    io_mkdir("empty");
    CHECK(expect_fail(io_path("empty"), TERN_ENOTFOUND, "empty", NULL), "empty dir");
    CHECK(expect_fail(io_path("nonexistent.safetensors"), TERN_ENOTFOUND, "nonexistent", NULL), "missing file");
}

/* write a raw header file and expect a failure */
static int bad_header(const char *fname, const char *hdr, size_t dn, tern_status want, const char *a, const char *b) {
    const char *p = io_path(fname);
    io_write_raw(p, hdr, NULL, dn, 0);
    return expect_fail(p, want, a ? a : fname, b);
}

TEST(st_bad_inputs) {
    const char *p = io_path("short.safetensors");
    io_write_file(p, "\x05\0\0\0", 4);
    CHECK(expect_fail(p, TERN_EFORMAT, "short.safetensors", "shorter than"), "short");
    p = io_path("past.safetensors");
    io_write_raw(p, "{}", NULL, 0, 1000);
    CHECK(expect_fail(p, TERN_EFORMAT, "past.safetensors", "past the end"), "past end");
    p = io_path("absurd.safetensors");
    io_write_raw(p, "{}", NULL, 0, 200000000ull);
    CHECK(expect_fail(p, TERN_EFORMAT, "absurd.safetensors", "absurd"), "absurd");
    p = io_path("huge.safetensors");
    io_write_raw(p, "{}", NULL, 0, 0xffffffffffffffffull);
    CHECK(expect_fail(p, TERN_EFORMAT, "huge.safetensors", "absurd"), "u64 max");

    CHECK(bad_header("nojson.safetensors", "{\"a\": [1,", 0, TERN_EFORMAT, NULL, "not valid JSON"), "not json");
    CHECK(bad_header("array.safetensors", "[1,2]", 0, TERN_EFORMAT, NULL, "expected a JSON object"), "array");
    CHECK(bad_header("dtype.safetensors", "{\"w\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                     TERN_EFORMAT, "'w'", "F12"), "unknown dtype");
    CHECK(bad_header("e5m2.safetensors", "{\"w8\":{\"dtype\":\"F8_E5M2\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                     TERN_EUNSUPPORTED, "'w8'", "F8_E5M2"), "e5m2");
    CHECK(bad_header("dtnum.safetensors", "{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                     TERN_EFORMAT, "'w'", "dtype"), "dtype not string");
    CHECK(bad_header("neg.safetensors", "{\"wneg\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]}}", 4,
                     TERN_EFORMAT, "'wneg'", "shape[1]"), "negative dim");
    CHECK(bad_header("frac.safetensors", "{\"wf\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                     TERN_EFORMAT, "'wf'", "1.5"), "fractional dim");
    CHECK(bad_header("shp.safetensors", "{\"ws\":{\"dtype\":\"F32\",\"shape\":\"4\",\"data_offsets\":[0,4]}}", 4,
                     TERN_EFORMAT, "'ws'", "shape"), "shape not array");
    CHECK(bad_header("dims.safetensors", "{\"w5\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                     TERN_EUNSUPPORTED, "'w5'", "dimensions"), "5 dims");
    CHECK(bad_header("off3.safetensors", "{\"wo\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 2,
                     TERN_EFORMAT, "'wo'", "data_offsets"), "offsets len 3");
    CHECK(bad_header("offrev.safetensors", "{\"wr\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[3,1]}}", 4,
                     TERN_EFORMAT, "'wr'", "begin > end"), "begin > end");
    CHECK(bad_header("offneg.safetensors", "{\"wn\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 4,
                     TERN_EFORMAT, "'wn'", "data_offsets[0]"), "negative offset");
    CHECK(bad_header("beyond.safetensors", "{\"wb\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
                     TERN_EFORMAT, "'wb'", "beyond the data section"), "end beyond");
    CHECK(bad_header("nbytes.safetensors", "{\"wu\":{\"dtype\":\"U32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16,
                     TERN_EFORMAT, "'wu'", "[2, 2]"), "nbytes U32");
    CHECK(bad_header("ovf.safetensors",
                     "{\"wv\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
                     TERN_EFORMAT, "'wv'", "needs more than"), "size overflow");
    CHECK(bad_header("overlap.safetensors",
                     "{\"p\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                     TERN_EFORMAT, "'p'", "overlap"), "overlap");
    CHECK(bad_header("dupkey.safetensors",
                     "{\"k\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                     "\"k\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2,
                     TERN_EFORMAT, "'k'", "duplicated"), "dup in file");
    CHECK(bad_header("notobj.safetensors", "{\"t\":[1]}", 0, TERN_EFORMAT, "'t'", "expected an object"), "entry not obj");
    CHECK(bad_header("md.safetensors", "{\"__metadata__\":[1]}", 0, TERN_EFORMAT, "__metadata__", NULL), "metadata");
    /* buffer entry point */
    tern_st_set *s = NULL;
    CHECK(tern__st_parse_buffer(&s, "\x02\0\0\0\0\0\0\0{}", 10, "buf", &e) == TERN_OK && tern_st_count(s) == 0,
          "%s", e.msg);
    tern_st_close(s);
}

int main(void) {
    RUN(st_single_valid_unaligned);
    RUN(st_directory_and_sharded);
    RUN(st_bad_inputs);
    io_cleanup();
    return test_done();
}
