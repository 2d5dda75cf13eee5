"""fixtures_mlx.py — numpy-only helpers for the parity fixture generator.

Used by scripts/make_fixtures.py (on the GPU machine) and scripts/check_fixture.py.
Nothing here imports torch, so it can be tested on any machine with numpy.

* bf16 <-> float conversion (round-to-nearest-even, like torch/MLX casts).
* A minimal safetensors reader/writer (the format is an 8-byte little-endian header
  length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw bytes).
* The MLX affine quantizer, written from the description of mlx `affine_quantize`:
  per group of `gs` consecutive input elements take min/max; the edge value with the
  larger magnitude is made exactly representable (q = 0 maps to it); the scale sign
  follows so that q stays in [0, 2^bits - 1]. Here the group statistics are computed
  in float32 and the scales/biases are rounded to bf16 *before* choosing q, so the
  stored (q, scale, bias) triple is self-consistent; the dequantized reference is then
  computed in float64 from exactly what is stored.
* Bit packing: every row is a little-endian bit stream, element j in bits
  [j*bits, (j+1)*bits) (bit 0 = LSB of byte 0), reinterpreted as uint32 words.
"""
import json
import struct

import re

import numpy as np

# ---------------------------------------------------------------- bf16 -------

def f32_to_bf16_bits(x):
    """float array -> uint16 bf16 bit patterns (round to nearest even, no NaNs expected)."""
    u = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)
    rounding = ((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((u + rounding) >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(b):
    b = np.ascontiguousarray(np.asarray(b, dtype=np.uint16))
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------- safetensors ------

_NP_OF = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "BF16": np.uint16,
          "U32": np.uint32, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
          "I8": np.int8, "U16": np.uint16, "I16": np.int16, "BOOL": np.bool_}


def read_safetensors(path):
    """-> (tensors, metadata); tensors: name -> (dtype_str, numpy array of raw elements).
    BF16 tensors come back as uint16 bit patterns (use to_f64)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = np.dtype(_NP_OF[info["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(blob[base + b:base + e], dtype=dt).reshape(info["shape"])
        out[name] = (info["dtype"], arr.astype(dt.newbyteorder("=")))
    return out, meta


def to_f64(dtype, arr):
    if dtype == "BF16":
        return bf16_bits_to_f32(arr).astype(np.float64)
    return np.asarray(arr, dtype=np.float64)


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype_str, numpy array). Written in sorted name order."""
    header = {}
    chunks = []
    off = 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        dt = np.dtype(_NP_OF[dtype]).newbyteorder("<")
        raw = np.ascontiguousarray(arr).astype(dt).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for c in chunks:
            f.write(c)
    return off


# ------------------------------------------------------------ quantizer ------

def mlx_affine_quantize(w, bits, gs):
    """w: float array [..., K] (K % gs == 0, K*bits % 32 == 0).
    -> (packed uint32 [..., K*bits/32], scales bf16 bits [..., K/gs], biases bf16 bits)."""
    w = np.asarray(w, dtype=np.float32)
    K = w.shape[-1]
    if K % gs or (K * bits) % 32:
        raise ValueError(f"quantize: last dim {K} not divisible by group {gs} / packing for {bits} bits")
    n_bins = float((1 << bits) - 1)
    g = w.reshape(w.shape[:-1] + (K // gs, gs))
    wmax = g.max(axis=-1)
    wmin = g.min(axis=-1)
    mask = np.abs(wmin) > np.abs(wmax)
    scale = np.maximum((wmax - wmin) / np.float32(n_bins), np.float32(1e-7)).astype(np.float32)
    scale = np.where(mask, scale, -scale)
    edge = np.where(mask, wmin, wmax)
    q0 = np.round(edge / scale)
    scale = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scale).astype(np.float32)
    bias = np.where(q0 == 0, np.float32(0), edge).astype(np.float32)
    s_bits = f32_to_bf16_bits(scale)
    b_bits = f32_to_bf16_bits(bias)
    s = bf16_bits_to_f32(s_bits)[..., None]
    b = bf16_bits_to_f32(b_bits)[..., None]
    q = np.clip(np.round((g - b) / s), 0, n_bins).astype(np.uint32)
    q = q.reshape(w.shape)
    return pack_bits(q, bits), s_bits, b_bits


def pack_bits(q, bits):
    """q: uint [..., K] with values < 2^bits -> uint32 [..., K*bits/32] (LE bit stream)."""
    q = np.asarray(q, dtype=np.uint32)
    K = q.shape[-1]
    shifts = np.arange(bits, dtype=np.uint32)
    bitarr = ((q[..., None] >> shifts) & np.uint32(1)).astype(np.uint8)
    bitarr = bitarr.reshape(q.shape[:-1] + (K * bits,))
    by = np.packbits(bitarr, axis=-1, bitorder="little")
    return np.ascontiguousarray(by).view("<u4").astype(np.uint32)


def unpack_bits(packed, bits, K):
    packed = np.ascontiguousarray(np.asarray(packed, dtype="<u4"))
    by = packed.view(np.uint8).reshape(packed.shape[:-1] + (packed.shape[-1] * 4,))
    bitarr = np.unpackbits(by, axis=-1, bitorder="little")[..., :K * bits]
    bitarr = bitarr.reshape(packed.shape[:-1] + (K, bits)).astype(np.uint32)
    return (bitarr << np.arange(bits, dtype=np.uint32)).sum(axis=-1).astype(np.uint32)


def mlx_dequantize(packed, s_bits, b_bits, bits, gs):
    """-> float64 [..., K]: scale * q + bias with scale/bias taken from the stored bf16."""
    K = packed.shape[-1] * 32 // bits
    q = unpack_bits(packed, bits, K).astype(np.float64)
    s = np.repeat(bf16_bits_to_f32(s_bits).astype(np.float64), gs, axis=-1)
    b = np.repeat(bf16_bits_to_f32(b_bits).astype(np.float64), gs, axis=-1)
    return s * q + b


def self_test():
    rng = np.random.default_rng(0)
    for bits in (2, 3, 4, 5, 6, 8):
        for gs in (32, 64):
            w = rng.standard_normal((3, 5, 128)).astype(np.float32)
            p, s, b = mlx_affine_quantize(w, bits, gs)
            assert p.shape == (3, 5, 128 * bits // 32) and s.shape == (3, 5, 128 // gs)
            K = 128
            q = unpack_bits(p, bits, K)
            assert q.max() <= (1 << bits) - 1
            assert np.array_equal(pack_bits(q, bits), p)
            d = mlx_dequantize(p, s, b, bits, gs)
            err = np.abs(d - w).max() / np.abs(w).max()
            assert err < 2.0 / (1 << bits), (bits, gs, err)
    # packing layout: 4-bit, first element in the low nibble of word 0
    p = pack_bits(np.array([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=np.uint32), 4)
    assert p[0, 0] == 0x87654321, hex(p[0, 0])
    p = pack_bits(np.array([[1, 2, 3, 4]], dtype=np.uint32), 8)
    assert p[0, 0] == 0x04030201
    return True


def mlx_emitter(bits0, gs0, rules, out, qcfg):
    """Quantize modules by a plan, the way mlx-lm's converter writes them.

    rules: [(regex, (bits, group) | False)], first match wins; no match = (bits0, gs0).
    The returned emit(path, w) writes "<path>.weight" (+ ".scales"/".biases" when quantized)
    into `out`, records per-module overrides (or False) in `qcfg`, and returns the float64
    weights the reference model must use (dequantized, or the bf16-rounded original)."""
    def choice(path):
        for rx, val in rules:
            if re.search(rx, path):
                return val
        return (bits0, gs0)

    def emit(path, w):
        c = choice(path)
        if c is False:
            qcfg[path] = False
            out[path + ".weight"] = ("BF16", f32_to_bf16_bits(w))
            return w.astype(np.float64)
        bits, gs = c
        p, s, b = mlx_affine_quantize(w, bits, gs)
        out[path + ".weight"] = ("U32", p)
        out[path + ".scales"] = ("BF16", s)
        out[path + ".biases"] = ("BF16", b)
        if (bits, gs) != (bits0, gs0):
            qcfg[path] = {"group_size": gs, "bits": bits}
        return mlx_dequantize(p, s, b, bits, gs)

    return emit


if __name__ == "__main__":
    print("fixtures_mlx self-test:", self_test())
