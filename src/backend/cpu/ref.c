/*
 * ref.c — the scalar reference backend ("cpu-ref"): the readable spec of every op.
 *
 * Each op is the plainest loop that computes what ops.h says, in f32 (weights decoded with
 * tern_tensor_row_f32, the reference row decoder). It is slow on purpose; the fast CPU backend
 * and the CUDA kernels are tested against it. The one concession: a big matmul splits its output
 * rows over threads (each output is still the one plain loop, so the same bits) — the GPU op tests
 * spent most of their minutes here. Conventions the fast kernels must share:
 *   - matmul: y[r][o] = Σ_j x[r][j] · W[o][j] with W[o][j] exactly as tern_tensor_row_f32
 *     decodes it (s·q + b for MLX affine).
 *   - attention: keys of the row's slot at positions b with lo <= b <= pos (lo = pos-W+1 for
 *     a window W, else 0), plus the row's span range [vis_lo, vis_hi] when rows->vis_lo is
 *     set (tern_key_range_of in ops.h; scanned first..last in position order); a block-table
 *     entry < 0 in that range is skipped (never read).
 *     Three passes: scores, max, exp/sum, then Σ p·v / sum.
 *   - route_topk: softmax over E, k times pick the largest unused probability (lower index
 *     wins ties), renormalise over the chosen k, then multiply per_expert_scale[e].
 *   - compressed KV pages (kv->kf / kv->vf not F32, layout in ops/kvq.h): kv_write encodes
 *     each (token, head) vector with tern_kvq_encode; attention is the same three passes
 *     over keys and values decoded with tern_kvq_decode — i.e. exact attention over the
 *     dequantized cache. Fast kernels may reorder (rotate q, un-rotate the output once).
 *   - bad indices (token ids, expert ids, slots) are skipped / give zero rows, never crash.
 * Scratch buffers here are malloc'd per call (the reference is not a hot path); on
 * allocation failure an op writes NaN so the failure is visible instead of silent.
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_glm.h"
#include "sample/sample_ref.h"
#include "ops/kvq.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- shared with the fast backend ---- */

tern_status tern_cpu_check_weight(const tern_tensor *t, tern_error *err) {
    const char *nm = t->name ? t->name : "(unnamed)";
    if (t->ndim < 1 || t->ndim > 3) return tern_err(err, TERN_EUNSUPPORTED, "weight '%s': %d dims (1..3 supported)", nm, t->ndim);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] <= 0) return tern_err(err, TERN_EFORMAT, "weight '%s': dim %d is %lld", nm, i, (long long)t->shape[i]);
    switch (t->dtype) {
    case TERN_DT_F32: case TERN_DT_F16: case TERN_DT_BF16: return TERN_OK;
    case TERN_DT_F8_E4M3:
        if (!t->scales) return TERN_OK;
        if (t->sdtype != TERN_DT_F32 || t->blk_rows <= 0 || t->group_size <= 0 || t->ndim < 2)
            return tern_err(err, TERN_EUNSUPPORTED, "weight '%s': FP8 block scales must be F32 with a positive block "
                            "size (got %s, %d x %d)", nm, tern_dtype_name(t->sdtype), t->blk_rows, t->group_size);
        return TERN_OK;
    case TERN_DT_Q: break;
    default: return tern_err(err, TERN_EUNSUPPORTED, "weight '%s': dtype %s not supported by the CPU backend", nm, tern_dtype_name(t->dtype));
    }
    int b = t->bits, gs = t->group_size;
    if (b != 2 && b != 3 && b != 4 && b != 5 && b != 6 && b != 8)
        return tern_err(err, TERN_EUNSUPPORTED, "weight '%s': %d-bit quantization not supported (2,3,4,5,6,8)", nm, b);
    if (gs != 32 && gs != 64 && gs != 128)
        return tern_err(err, TERN_EUNSUPPORTED, "weight '%s': group_size %d not supported (32,64,128)", nm, gs);
    if (t->shape[t->ndim - 1] % gs)
        return tern_err(err, TERN_EFORMAT, "weight '%s': in=%lld not a multiple of group_size %d", nm, (long long)t->shape[t->ndim - 1], gs);
    if (t->sdtype != TERN_DT_F32 && t->sdtype != TERN_DT_F16 && t->sdtype != TERN_DT_BF16)
        return tern_err(err, TERN_EUNSUPPORTED, "weight '%s': scales dtype %s not supported", nm, tern_dtype_name(t->sdtype));
    if (!t->scales || !t->biases) return tern_err(err, TERN_EFORMAT, "weight '%s': quantized without scales/biases", nm);
    return TERN_OK;
}

/* ---- memory ---- */

static void ref_close(tern_backend *be) { free(be); }
static void *ref_alloc(tern_backend *be, size_t bytes) { (void)be; return tern_aalloc(bytes ? bytes : 1); }
static void ref_free(tern_backend *be, void *p) { (void)be; tern_afree(p); }
static void ref_copy(tern_backend *be, void *dst, const void *src, size_t bytes) { (void)be; if (bytes) memmove(dst, src, bytes); }
static void ref_sync(tern_backend *be) { (void)be; }
static tern_status ref_upload_weight(tern_backend *be, tern_tensor *t, tern_error *err) {
    (void)be;
    tern_status s = tern_cpu_check_weight(t, err);
    if (s == TERN_OK) t->device = -1;
    return s;
}
static void ref_free_weight(tern_backend *be, tern_tensor *t) { (void)be; (void)t; }

static void fill_nan(float *y, size_t n) { for (size_t i = 0; i < n; i++) y[i] = NAN; }

/* ---- linear algebra ---- */

/* y[n, out] = x[n, in] · W[mat]ᵀ, outputs [o0, o1) */
static void ref_matmul_rows(float *y, const float *x, int n, const tern_tensor *w, int mat, int64_t o0, int64_t o1) {
    int64_t in = w->shape[w->ndim - 1], out = w->ndim >= 2 ? w->shape[w->ndim - 2] : 1;
    float *row = malloc((size_t)in * sizeof *row);
    if (!row) {
        for (int r = 0; r < n; r++) fill_nan(y + (size_t)r * (size_t)out + (size_t)o0, (size_t)(o1 - o0));
        return;
    }
    for (int64_t o = o0; o < o1; o++) {
        tern_tensor_row_f32(w, (int64_t)mat * out + o, row);
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * (size_t)in;
            float acc = 0.0f;
            for (int64_t j = 0; j < in; j++) acc += xr[j] * row[j];
            y[(size_t)r * (size_t)out + (size_t)o] = acc;
        }
    }
    free(row);
}

typedef struct ref_mm_part {
    float *y;
    const float *x;
    const tern_tensor *w;
    int n, mat;
    int64_t o0, o1;
} ref_mm_part;
static void *ref_mm_thread(void *arg) {
    const ref_mm_part *p = arg;
    ref_matmul_rows(p->y, p->x, p->n, p->w, p->mat, p->o0, p->o1);
    return NULL;
}

/* the whole matmul; from 2^24 multiply-adds its outputs in up to 16 contiguous parts on threads (a part whose thread
 * cannot start runs here) */
static void ref_matmul_mat(float *y, const float *x, int n, const tern_tensor *w, int mat) {
    int64_t in = w->shape[w->ndim - 1], out = w->ndim >= 2 ? w->shape[w->ndim - 2] : 1;
    long nc = (double)n * (double)out * (double)in >= 16777216.0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
    int T = (int)(nc < 1 ? 1 : nc > 16 ? 16 : nc);
    if (T > out) T = (int)out;
    if (T <= 1) {
        ref_matmul_rows(y, x, n, w, mat, 0, out);
        return;
    }
    ref_mm_part part[16];
    pthread_t th[16];
    int started[16] = {0};
    for (int i = 0; i < T; i++) {
        part[i] = (ref_mm_part){y, x, w, n, mat, out * i / T, out * (i + 1) / T};
        started[i] = i > 0 && pthread_create(&th[i], NULL, ref_mm_thread, &part[i]) == 0;
    }
    for (int i = 0; i < T; i++)
        if (!started[i]) ref_mm_thread(&part[i]);
    for (int i = 1; i < T; i++)
        if (started[i]) pthread_join(th[i], NULL);
}

static void ref_matmul(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w) {
    (void)be;
    ref_matmul_mat(y, x, n, w, 0);
}

static void ref_matmul_expert(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int e) {
    (void)be;
    ref_matmul_mat(y, x, n, w, e);
}

static void ref_embed(tern_backend *be, float *y, const int32_t *ids, int n, const tern_tensor *emb, float scale) {
    (void)be;
    int64_t V = emb->shape[0], H = emb->shape[emb->ndim - 1];
    for (int r = 0; r < n; r++) {
        float *yr = y + (size_t)r * (size_t)H;
        if (ids[r] < 0 || ids[r] >= V) { memset(yr, 0, (size_t)H * sizeof *yr); continue; }
        tern_tensor_row_f32(emb, ids[r], yr);
        for (int64_t j = 0; j < H; j++) yr[j] *= scale;
    }
}

static void ref_rmsnorm(tern_backend *be, float *y, const float *x, int rows, int d, const float *w, float eps) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        float ss = 0.0f;
        for (int j = 0; j < d; j++) ss += xr[j] * xr[j];
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int j = 0; j < d; j++) yr[j] = xr[j] * inv * (w ? w[j] : 1.0f);
    }
}

static void ref_rope(tern_backend *be, float *x, int n, int nh, int d, const int32_t *pos, const float *inv_freq, float mscale) {
    (void)be;
    int half = d / 2;
    for (int r = 0; r < n; r++)
        for (int h = 0; h < nh; h++) {
            float *v = x + ((size_t)r * nh + h) * d;
            for (int i = 0; i < half; i++) {
                float th = (float)pos[r] * inv_freq[i];
                float c = cosf(th), s = sinf(th);
                float a = v[i], b = v[i + half];
                v[i] = (a * c - b * s) * mscale;
                v[i + half] = (b * c + a * s) * mscale;
            }
        }
}

/* ---- paged KV ---- */

/* Address of the K (or V) vector of head kvh at position p of slot s, or NULL if the block
 * is not resident. */
static float *kv_at(const tern_kv_layer *kv, void *pool, int s, int p, int kvh) {
    if (s < 0 || p < 0 || p / kv->block_size >= kv->max_blocks) return NULL;
    int32_t blk = kv->block_table[(size_t)s * kv->max_blocks + p / kv->block_size];
    if (blk < 0) return NULL;
    size_t tok = (size_t)blk * kv->block_size + (size_t)(p % kv->block_size);
    return (float *)pool + (tok * kv->n_head_kv + kvh) * kv->head_dim;
}

/* Record of head kvh at position p of slot s in a pool of format f (NULL if not resident). */
static uint8_t *kv_rec(const tern_kv_layer *kv, void *pool, const tern_kv_fmt *f, int s, int p, int kvh) {
    if (s < 0 || p < 0 || p / kv->block_size >= kv->max_blocks) return NULL;
    int32_t blk = kv->block_table[(size_t)s * kv->max_blocks + p / kv->block_size];
    if (blk < 0) return NULL;
    size_t tok = (size_t)blk * kv->block_size + (size_t)(p % kv->block_size);
    return (uint8_t *)pool + (tok * kv->n_head_kv + kvh) * tern_kvq_vec_bytes(f, kv->head_dim);
}

static void ref_kv_write_q(const tern_kv_layer *kv, const tern_rows *rows, const float *k, const float *v) {
    float scratch[TERN_KVQ_MAX_ROT];
    size_t hd = (size_t)kv->head_dim, nkv = (size_t)kv->n_head_kv;
    for (int r = 0; r < rows->n; r++)
        for (int h = 0; h < kv->n_head_kv; h++) {
            uint8_t *kd = kv_rec(kv, kv->k, &kv->kf, rows->slot[r], rows->pos[r], h);
            uint8_t *vd = kv_rec(kv, kv->v, &kv->vf, rows->slot[r], rows->pos[r], h);
            if (!kd || !vd) continue;
            tern_kvq_encode(&kv->kf, kv->head_dim, kv->rot, k + ((size_t)r * nkv + h) * hd, kd, scratch);
            tern_kvq_encode(&kv->vf, kv->head_dim, kv->rot, v + ((size_t)r * nkv + h) * hd, vd, scratch);
        }
}

static void ref_kv_write(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k, const float *v) {
    (void)be;
    if (kv->kf.kind != TERN_KV_F32 || kv->vf.kind != TERN_KV_F32) { ref_kv_write_q(kv, rows, k, v); return; }
    size_t hd = (size_t)kv->head_dim, nkv = (size_t)kv->n_head_kv;
    for (int r = 0; r < rows->n; r++) {
        float *kd = kv_at(kv, kv->k, rows->slot[r], rows->pos[r], 0);
        float *vd = kv_at(kv, kv->v, rows->slot[r], rows->pos[r], 0);
        if (!kd || !vd) continue;
        memcpy(kd, k + (size_t)r * nkv * hd, nkv * hd * sizeof(float));
        memcpy(vd, v + (size_t)r * nkv * hd, nkv * hd * sizeof(float));
    }
}

/* Row kvh of position p of slot s in pool (format f) as floats: the f32 record itself, or decoded into x (scratch:
 * TURBO's); NULL if not resident */
static const float *kv_row(const tern_kv_layer *kv, void *pool, const tern_kv_fmt *f, int s, int p, int kvh, float *x,
                           float *scratch) {
    const uint8_t *rec = kv_rec(kv, pool, f, s, p, kvh);
    if (!rec || f->kind == TERN_KV_F32) return (const float *)rec;
    tern_kvq_decode(f, kv->head_dim, kv->rot, rec, x, scratch);
    return x;
}

/* Attention over the (dequantized) cache: the spec every backend's attention is held to, f32 and compressed pages */
static void ref_attention(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                          const tern_kv_layer *kv, float scale, float softcap) {
    (void)be;
    int d = kv->head_dim, group = nh / kv->n_head_kv;
    float x[TERN_KVQ_MAX_ROT], scratch[TERN_KVQ_MAX_ROT];
    for (int r = 0; r < rows->n; r++) {
        int s = rows->slot[r];
        tern_key_range kr = tern_key_range_of(kv, rows, r);
        int lo = kr.first, a = kr.last, nk = a - lo + 1;
        float *sc = malloc((size_t)(nk > 0 ? nk : 1) * sizeof *sc);
        for (int h = 0; h < nh; h++) {
            const float *qv = q + ((size_t)r * nh + h) * d;
            float *o = out + ((size_t)r * nh + h) * d;
            if (!sc) { fill_nan(o, (size_t)d); continue; }
            int kvh = h / group;
            float m = -INFINITY;
            for (int b = lo; b <= a; b++) {
                const float *kk = tern_key_visible(&kr, b) ? kv_row(kv, kv->k, &kv->kf, s, b, kvh, x, scratch) : NULL;
                if (!kk) { sc[b - lo] = -INFINITY; continue; }
                float dot = 0.0f;
                for (int i = 0; i < d; i++) dot += qv[i] * kk[i];
                dot *= scale;
                if (softcap > 0.0f) dot = softcap * tanhf(dot / softcap);
                sc[b - lo] = dot;
                if (dot > m) m = dot;
            }
            float sum = 0.0f;
            for (int b = lo; b <= a; b++) {
                sc[b - lo] = sc[b - lo] == -INFINITY ? 0.0f : expf(sc[b - lo] - m);
                sum += sc[b - lo];
            }
            for (int i = 0; i < d; i++) o[i] = 0.0f;
            for (int b = lo; b <= a; b++) {
                if (sc[b - lo] == 0.0f) continue;
                const float *vv = kv_row(kv, kv->v, &kv->vf, s, b, kvh, x, scratch);
                if (!vv) continue;
                for (int i = 0; i < d; i++) o[i] += sc[b - lo] * vv[i];
            }
            if (sum > 0.0f)
                for (int i = 0; i < d; i++) o[i] /= sum;
        }
        free(sc);
    }
}

/* ---- elementwise ---- */

float tern__gelu_tanh(float x); /* shared with the fast backend */
float tern__gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static void ref_add(tern_backend *be, float *y, const float *a, const float *b, size_t n) { (void)be; for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i]; }
static void ref_mul(tern_backend *be, float *y, const float *a, const float *b, size_t n) { (void)be; for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i]; }
static void ref_scale(tern_backend *be, float *y, const float *x, float s, size_t n) { (void)be; for (size_t i = 0; i < n; i++) y[i] = x[i] * s; }
static void ref_scale_dev(tern_backend *be, float *y, const float *x, const float *s, size_t n) { (void)be; float v = s[0]; for (size_t i = 0; i < n; i++) y[i] = x[i] * v; }
static void ref_gelu_tanh_mul(tern_backend *be, float *y, const float *g, const float *u, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] = tern__gelu_tanh(g[i]) * (u ? u[i] : 1.0f);
}
static void ref_silu_mul(tern_backend *be, float *y, const float *g, const float *u, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * (u ? u[i] : 1.0f);
}
static void ref_softcap(tern_backend *be, float *y, size_t n, float cap) { (void)be; for (size_t i = 0; i < n; i++) y[i] = cap * tanhf(y[i] / cap); }
static void ref_add_bias(tern_backend *be, float *y, const float *bias, int n, int d) {
    (void)be;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < d; j++) y[(size_t)r * d + j] += bias[j];
}
static void ref_copy_cols(tern_backend *be, float *dst, const float *src, int n, int w, int ss, int off) {
    (void)be;
    for (int r = 0; r < n; r++) memmove(dst + (size_t)r * w, src + (size_t)r * ss + off, (size_t)w * sizeof(float));
}

/* ---- MoE ---- */

void tern__route_topk_row(int32_t *idx, float *wts, const float *logits, int E, int k, const float *pes); /* shared */
void tern__route_topk_row(int32_t *idx, float *wts, const float *logits, int E, int k, const float *pes) {
    float m = -INFINITY, sum = 0.0f, ksum = 0.0f;
    for (int e = 0; e < E; e++) if (logits[e] > m) m = logits[e];
    for (int e = 0; e < E; e++) sum += expf(logits[e] - m);
    for (int j = 0; j < k; j++) {
        int best = -1;
        float bp = 0.0f;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (int t = 0; t < j; t++) used |= idx[t] == e;
            if (used) continue;
            float p = expf(logits[e] - m) / sum;
            if (best < 0 || p > bp) { best = e; bp = p; } /* strict >: lower index wins ties */
        }
        idx[j] = best;
        wts[j] = bp;
        ksum += bp;
    }
    for (int j = 0; j < k; j++) {
        wts[j] = ksum > 0.0f ? wts[j] / ksum : 0.0f;
        if (pes && idx[j] >= 0) wts[j] *= pes[idx[j]];
    }
}

static void ref_route_topk(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                           int mode, const float *pes) {
    (void)be; (void)mode;
    for (int r = 0; r < n; r++) tern__route_topk_row(idx + (size_t)r * k, wts + (size_t)r * k, logits + (size_t)r * E, E, k, pes);
}

static void ref_moe_mlp(tern_backend *be, float *y, const float *x, int n, int H, const int32_t *idx, const float *wts,
                        int k, const tern_tensor *gate, const tern_tensor *up, const tern_tensor *down, int act,
                        float *scratch) {
    int E = (int)gate->shape[0], I = (int)gate->shape[1];
    float *g = scratch, *u = scratch + I, *o = malloc((size_t)H * sizeof *o);
    memset(y, 0, (size_t)n * H * sizeof *y);
    if (!o) { fill_nan(y, (size_t)n * H); return; }
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            int e = idx[(size_t)r * k + j];
            if (e < 0 || e >= E) continue;
            const float *xr = x + (size_t)r * H;
            ref_matmul_expert(be, g, xr, 1, gate, e);
            ref_matmul_expert(be, u, xr, 1, up, e);
            if (act == TERN_ACT_SILU) ref_silu_mul(be, g, g, u, (size_t)I);
            else ref_gelu_tanh_mul(be, g, g, u, (size_t)I);
            ref_matmul_expert(be, o, g, 1, down, e);
            float w = wts[(size_t)r * k + j];
            for (int i = 0; i < H; i++) y[(size_t)r * H + i] += w * o[i];
        }
    free(o);
}

static const tern_backend_vt ref_vt = {
    .name = "cpu-ref",
    .close = ref_close,
    .alloc = ref_alloc,
    .free = ref_free,
    .upload = ref_copy,
    .download = ref_copy,
    .sync = ref_sync,
    .upload_weight = ref_upload_weight,
    .free_weight = ref_free_weight,
    .matmul = ref_matmul,
    .matmul_expert = ref_matmul_expert,
    .embed = ref_embed,
    .rmsnorm = ref_rmsnorm,
    .rope = ref_rope,
    .kv_write = ref_kv_write,
    .attention = ref_attention,
    .add = ref_add,
    .mul = ref_mul,
    .scale = ref_scale,
    .scale_dev = ref_scale_dev,
    .gelu_tanh_mul = ref_gelu_tanh_mul,
    .silu_mul = ref_silu_mul,
    .softcap = ref_softcap,
    .add_bias = ref_add_bias,
    .copy_cols = ref_copy_cols,
    .route_topk = ref_route_topk,
    .moe_mlp = ref_moe_mlp,
    .glm = &tern__cpu_glm_ops, /* GLM-5 ops: one scalar spec for both CPU backends */
    .sample = tern_sample_op_host, /* the CPU sampler's draw (src/sample/sample_ref.c) */
};

tern_status tern_backend_cpu_ref_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err) {
    tern_backend *be = calloc(1, sizeof *be);
    if (!be) return tern_err(err, TERN_ENOMEM, "cpu-ref backend: out of memory");
    be->vt = &ref_vt;
    be->device = -1;
    be->compute = opts ? opts->compute : TERN_COMPUTE_F32;
    if (be->compute == TERN_COMPUTE_BF16X2) be->compute = TERN_COMPUTE_BF16; /* one bf16 mode on the CPU */
    *out = be;
    return TERN_OK;
}
