/*
 * tensor.h — dtypes and the tensor descriptor shared by io, model and backends.
 *
 * A tern_tensor describes memory; it never owns it (the owner is the safetensors
 * mapping, the model, or a backend allocation). Shapes are row-major like PyTorch:
 * shape[ndim-1] is the contiguous (innermost) axis. A Linear weight is [out, in],
 * an expert stack is [E, out, in], an embedding is [V, H].
 *
 * Quantized weights (dtype TERN_DT_Q) use the MLX affine format (reference/gemma4.md §7.3):
 * `data` holds, per row, a little-endian bit stream of `in` unsigned codes of `bits` bits
 * (row bytes = in*bits/8); `scales`/`biases` hold one value per group of `group_size`
 * consecutive inputs, dtype `sdtype`, shape [.., out, in/group_size];
 *   W[o][j] = scales[o][j/gs] * q[o][j] + biases[o][j/gs].
 * shape[] is always the LOGICAL shape (unpacked `in`).
 *
 * Block-scaled FP8 (dtype TERN_DT_F8_E4M3 with scales != NULL; DeepSeek-V3 / GLM-5-FP8
 * checkpoints, `<module>.weight_scale_inv`): `data` holds one e4m3 byte per weight; `scales`
 * is F32 [.., ceil(out/blk_rows), ceil(in/group_size)] (sdtype F32, biases NULL) and
 *   W[o][j] = e4m3(w[o][j]) * scales[o/blk_rows][j/group_size]
 * (the stored "scale_inv" multiplies: it is the inverse of the quantizer's 448/amax).
 * An F8_E4M3 tensor without scales is plain (scale 1).
 *
 * For 3-D stacks that are views into a fused tensor (HF `experts.gate_up_proj` [E, 2I, H]
 * split into gate [E, I, H] and up [E, I, H]) consecutive matrices are `mat_stride` bytes
 * apart (`mat_stride_s` for scales/biases) instead of out*row_bytes. 0 means packed.
 */
#ifndef TERN_TENSOR_H
#define TERN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum tern_dtype {
    TERN_DT_F32 = 0,
    TERN_DT_F16,
    TERN_DT_BF16,
    TERN_DT_F64,
    TERN_DT_F8_E4M3,
    TERN_DT_I8,
    TERN_DT_U8,
    TERN_DT_I16,
    TERN_DT_I32,
    TERN_DT_U32,
    TERN_DT_I64,
    TERN_DT_BOOL,
    TERN_DT_Q, /* MLX affine quantized (see header comment) */
    TERN_DT_COUNT
} tern_dtype;

#define TERN_MAX_DIMS 4

typedef struct tern_tensor {
    tern_dtype dtype;
    int ndim;
    int64_t shape[TERN_MAX_DIMS];
    const void *data;         /* host pointer (io) or device pointer (after upload) */
    /* MLX affine quantization (dtype == TERN_DT_Q) */
    int bits;                 /* 2,3,4,5,6,8 */
    int group_size;           /* 32, 64, 128 */
    tern_dtype sdtype;        /* dtype of scales and biases (BF16/F16/F32) */
    const void *scales;
    const void *biases;
    /* 3-D stacks: bytes between consecutive matrices (0 = tightly packed) */
    size_t mat_stride, mat_stride_s;
    /* block-scaled FP8 (appended): rows per scale block (0 unless dtype F8_E4M3 with scales) */
    int blk_rows;
    /* where it came from, for messages */
    const char *name;
    int device;               /* -1: host memory; >= 0: device index of the backend */
    /* Expert slot view (appended; src/runtime/experts.h): NULL, or an int32 array [shape[0]] in
     * the backend's memory such that logical matrix e of this 3-D stack is stored matrix
     * mat_map[e] (its data/scales/biases at mat_map[e] strides). shape[0] stays the logical E.
     * Honoured by the CPU backends everywhere and by CUDA moe_mlp. */
    const int32_t *mat_map;
    /* (appended) 1: a projection whose outputs feed attention logits (q, k; GLM's q_a/q_b/kv_a and
     * indexer). The CUDA bf16 mode keeps these f32-accurate (x split in hi + lo) when the others
     * run plain bf16 (`--compute bf16`, src/backend/cuda/gemm.c); 0 everywhere else */
    int precise;
    /* (appended) 1: data lies inside another tensor's allocation (vt join_weights put it there); free_weight leaves
     * the bytes to the tensor that owns them (the first of the joined group, freed last by the model) */
    int joined;
} tern_tensor;

/* Name ("F32", "BF16", "Q"...) and element size in bytes (0 for TERN_DT_Q). */
const char *tern_dtype_name(tern_dtype t);
size_t tern_dtype_size(tern_dtype t);

/* Number of logical elements. */
int64_t tern_tensor_nelem(const tern_tensor *t);
/* Bytes of one row of the innermost axis as stored (packed bytes for TERN_DT_Q). */
size_t tern_tensor_row_bytes(const tern_tensor *t);

/* Scalar conversions (exact, round-to-nearest-even for narrowing). */
static inline float tern_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline uint16_t tern_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    uint32_t r = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + r) >> 16);
}
float tern_f16_to_f32(uint16_t h);
uint16_t tern_f32_to_f16(float f);
float tern_f8e4m3_to_f32(uint8_t v);

/* Read element i of a float-like array of dtype t (F32/F16/BF16/F64) as f32. */
float tern_load_f32(const void *p, tern_dtype t, size_t i);

/* Block-scaled FP8: columns of the scale grid (ceil(in/group_size)) and bytes of one matrix's
 * scales (ceil(out/blk_rows) * that * 4). 0 for other tensors. */
int64_t tern_tensor_fp8_scale_cols(const tern_tensor *t);
size_t tern_tensor_fp8_scale_bytes(const tern_tensor *t);
static inline int tern_tensor_is_fp8_block(const tern_tensor *t) {
    return t->dtype == TERN_DT_F8_E4M3 && t->scales != NULL;
}

/* Decode row `row` (of a 2-D view; for 3-D use matrix index*out + row) of any weight
 * tensor into f32 dst[in]. Handles F32/F16/BF16/F8_E4M3 (plain or block-scaled) and TERN_DT_Q.
 * Reference path. */
void tern_tensor_row_f32(const tern_tensor *t, int64_t row, float *dst);

#endif
