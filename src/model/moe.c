/*
 * moe.c — the model side of expert offload (docs/OFFLOAD.md): what the architectures call for
 * their routed experts, and how expert stacks are registered at load.
 *
 * Without offload (m->experts NULL) tern__moe_mlp is vt->moe_mlp and stacks are uploaded like
 * any weight: today's path, unchanged. With offload, tern__load_stack hands the stored stack
 * (mmap'd safetensors bytes, or host RAM for synthetic weights; per-expert HF tensors as a table
 * of each expert's bytes in the file, never copied into a stack) to the expert store without
 * uploading it, and tern__moe_mlp runs the layer over the store's slots.
 * Names are canonical ("layers.L.experts.gate|up|down"): the layer index and the stack come
 * from the name, so the architectures need no other change than calling tern__moe_mlp.
 */
#include "model/internal.h"
#include "runtime/experts.h"

#include <stdio.h>
#include <string.h>

void tern__moe_mlp(tern_model *m, int l, float *y, const float *x, int n, int H, const int32_t *idx,
                   const float *wts, int k, const tern_tensor *gate, const tern_tensor *up,
                   const tern_tensor *down, int act, float *scratch) {
    if (!tern_experts_layer(m->experts, l)) /* no offload, or stacks this store does not hold (uploaded) */
        m->be->vt->moe_mlp(m->be, y, x, n, H, idx, wts, k, gate, up, down, act, scratch);
    else tern_experts_moe_mlp(m->experts, l, y, x, n, H, idx, wts, k, act, scratch);
}

/* Whether t's bytes lie inside the file mapping of the stored tensor it names. */
static int file_backed(tern_weights *ws, const tern_tensor *t) {
    const tern_st_set *set = ws ? tern_weights_set(ws) : NULL;
    const tern_st_entry *e = set && t->name ? tern_st_find(set, t->name) : NULL;
    if (!e) return 0;
    const uint8_t *p = t->data, *lo = e->data;
    return p >= lo && p < lo + e->nbytes;
}

tern_status tern__experts_register(tern_model *m, const char *name, tern_tensor *t, tern_error *err) {
    int l = -1, pos = 0;
    char which[8] = "";
    if (sscanf(name, "layers.%d.experts.%7s%n", &l, which, &pos) != 2 || name[pos])
        return tern_err(err, TERN_EINVAL, "expert offload: '%s' is not a layers.L.experts.{gate,up,down} stack", name);
    int w = !strcmp(which, "gate") ? 0 : !strcmp(which, "up") ? 1 : !strcmp(which, "down") ? 2 : -1;
    if (w < 0) return tern_err(err, TERN_EINVAL, "expert offload: '%s': unknown stack '%s'", name, which);
    /* per-expert: stored bytes (an expert-parallel rank's stack starts at its first expert) */
    const tern_expert_src *src = tern_weights_expert_views(m->load_ws, t, tern_experts_e0(m->experts));
    if (src) return tern_experts_add_src(m->experts, l, w, t, src, 1, err);
    return tern_experts_add(m->experts, l, w, t, file_backed(m->load_ws, t), err);
}

void tern__experts_router(tern_model *m, const char *name, const tern_tensor *t) {
    int l = -1, pos = 0;
    if (t->ndim != 2) return;
    if ((sscanf(name, "layers.%d.router.proj%n", &l, &pos) == 1 && !name[pos]) ||
        (pos = 0, sscanf(name, "layers.%d.mlp.gate%n", &l, &pos) == 1 && !name[pos]))
        tern_experts_add_router(m->experts, l, t, NULL);
}

const struct tern_experts *tern_model_experts(const tern_model *m) { return m ? m->experts : NULL; }
