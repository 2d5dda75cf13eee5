/*
 * kvq.h — compressed KV page formats: byte layout and the reference codec (the spec that
 * every backend's kv_write/attention for these kinds is tested against).
 *
 * A K or V pool of a layer holds one record per (token, kv head), laid out
 * [n_blocks][block_size][n_head_kv][record]. Records by kind (D = head_dim):
 *   F32     D f32                                   (the original view format)
 *   F16     D f16          BF16   D bf16
 *   AFFINE  [D/g f16 scales][D/g f16 mins][D codes of `bits` bits]   x̂ = scale·q + min
 *   TURBO   [f32 scale][P codes of `bits` bits]     ŷ_j = scale·C_b[q_j], x̂ = Rᵀŷ
 * Codes are packed little-endian as a bit stream (code i occupies bits [i·b, i·b+b)).
 *
 * TURBO: R = H·diag(s)/√P, H the P×P Walsh–Hadamard matrix (P = power of two >= D, x padded
 * with zeros), s random ±1 signs fixed per layer. After rotation each coordinate of a vector
 * of norm ‖x‖ is close to N(0, ‖x‖²/P), so u = y·√P/‖x‖ is quantized per coordinate with the
 * Lloyd–Max codebook C_b of N(0,1) (2^b levels). The scale is ‖y‖/‖C_b[q]‖, so the
 * reconstruction keeps the vector's norm (the "norm correction" practitioners found better
 * than the bare MSE codebook, which shrinks vectors). Since R is orthogonal, q·x̂ = (Rq)·ŷ and
 * Σ p_i x̂_i = Rᵀ Σ p_i ŷ_i: kernels rotate the query once and un-rotate the output once.
 */
#ifndef TERN_KVQ_H
#define TERN_KVQ_H

#include "ops/ops.h"

#define TERN_KVQ_MAX_ROT 1024  /* largest P (head_dim <= 1024) */

/* P for a head dimension: smallest power of two >= max(head_dim, 8). */
int tern_kvq_rot_dim(int head_dim);
/* Check a format for a head dimension (message names `what`, e.g. "layer 3 K"). */
tern_status tern_kvq_check(const tern_kv_fmt *f, int head_dim, const char *what, tern_error *err);
/* Bytes of one record (one token, one kv head); 0 when the format is invalid for head_dim. */
size_t tern_kvq_vec_bytes(const tern_kv_fmt *f, int head_dim);
/* Bits per element including scales, for reports. */
double tern_kvq_bits_per_elem(const tern_kv_fmt *f, int head_dim);
/* Short name: "f32", "f16", "bf16", "q8g64", "q4g32", "turbo3". */
const char *tern_kvq_name(const tern_kv_fmt *f, char *buf, size_t n);

/* The 2^bits Lloyd–Max centroids of N(0,1), ascending (bits 1..4). NULL otherwise. */
const float *tern_kvq_codebook(int bits);
/* Fixed ±1 signs for a layer's rotation (deterministic in seed). */
void tern_kvq_signs(uint64_t seed, float *signs, int n);
/* In-place unnormalised fast Walsh–Hadamard transform of x[n], n a power of two. */
void tern_kvq_fwht(float *x, int n);
/* y[P] = R·pad(x[d]);  x[d] = first d of Rᵀ·y[P] (y is overwritten). */
void tern_kvq_rotate(const float *signs, int P, const float *x, int d, float *y);
void tern_kvq_unrotate(const float *signs, int P, float *y, float *x, int d);

/* Encode x[d] into one record. scratch: TERN_KVQ_MAX_ROT floats (TURBO). Non-finite or
 * out-of-f16-range values are clamped (AFFINE) so a record never holds garbage scales. */
void tern_kvq_encode(const tern_kv_fmt *f, int d, const float *signs, const float *x, void *rec, float *scratch);
/* Decode one record back to x[d] (TURBO: un-rotated). scratch as above. */
void tern_kvq_decode(const tern_kv_fmt *f, int d, const float *signs, const void *rec, float *x, float *scratch);
/* TURBO only: the rotated-space reconstruction ŷ[P]. */
void tern_kvq_decode_rotated(const tern_kv_fmt *f, int P, const void *rec, float *y);

#endif
