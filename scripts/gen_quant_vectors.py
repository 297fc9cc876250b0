#!/usr/bin/env python3
"""Writes tests/data/quant_vectors.bin: reference results of the gguf Python
package (gguf-py, the numpy quantizers llama.cpp's converters use) for the
encodings bitnet reads and writes. tests/test_quant_gguf.c checks our C code
against them bit for bit, so CI needs neither Python nor gguf.

    pip install gguf numpy
    python3 scripts/gen_quant_vectors.py [output path]

The inputs come from a fixed seed, so regenerating gives the same file as long
as gguf-py's arithmetic does not change.

File format (all little-endian):

    header   char magic[4] = "BNQV"
             u32  version  = 1
             u32  record_count
    record   char label[24]     ASCII, NUL-padded (for failure messages)
             u32  ggml_type     GGML type id: F32 0, F16 1, Q8_0 8, Q4_K 12,
                                Q6_K 14, BF16 30, TQ1_0 34, TQ2_0 35
             u32  flags         bit 0 set: the record starts with input floats
                                and `bytes` is what gguf-py's quantize made
                                of them; clear: `bytes` are raw blocks that
                                only feed the dequantizer
             u32  n_elems       element count, a multiple of the block size
             u32  n_bytes       n_elems / block_elems * block_bytes
             f32  input[n_elems]      only when flags bit 0 is set
             u8   bytes[n_bytes]
             f32  dequant[n_elems]    gguf-py's dequantize(bytes)

Inputs avoid the cases where the references themselves are undefined or
platform-dependent: NaN inside block formats, block maxima so small that
1/d overflows, and signalling NaNs for F16 (numpy converts those in software
or with F16C depending on the build).
"""

import struct
import sys
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
import gguf.quants as gq

SEED = 0x5EED_B17
MAGIC = b"BNQV"
VERSION = 1
FLAG_QUANTIZE = 1

rng = np.random.Generator(np.random.PCG64(SEED))


def f32(values):
    return np.asarray(values, dtype=np.float32)


def f32_bits(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def finite_fp16(count, allow_negative=True):
    """Random finite half-precision bit patterns (exponent != 31)."""
    h = rng.integers(0, 0x10000, size=count, dtype=np.uint32).astype(np.uint16)
    h = np.where((h & 0x7C00) == 0x7C00, h & 0x83FF, h).astype(np.uint16)
    if not allow_negative:
        h &= 0x7FFF
    return h


def random_scaled_blocks(block, count, lo=-3.0, hi=3.0):
    """Normal values, each block scaled by its own power of ten."""
    x = rng.standard_normal((count, block)).astype(np.float32)
    scale = np.float32(10.0) ** rng.uniform(lo, hi, size=(count, 1)).astype(np.float32)
    return (x * scale).astype(np.float32).ravel()


class Writer:
    def __init__(self):
        self.records = []
        self.counts = {}

    def _add(self, label, qtype, flags, n_elems, data_bytes, dequant, inputs=None):
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        assert n_elems % block_elems == 0, label
        assert len(data_bytes) == n_elems // block_elems * block_bytes, label
        assert dequant.dtype == np.float32 and dequant.size == n_elems, label
        name = label.encode("ascii")
        assert len(name) < 24, label
        out = bytearray(name.ljust(24, b"\0"))
        out += struct.pack("<IIII", int(qtype), flags, n_elems, len(data_bytes))
        if inputs is not None:
            out += inputs.astype("<f4").tobytes()
        out += bytes(data_bytes)
        out += dequant.astype("<f4").tobytes()
        self.records.append(bytes(out))
        self.counts[qtype.name] = self.counts.get(qtype.name, 0) + 1

    def quantized(self, label, qtype, inputs):
        """inputs -> gguf-py quantize -> bytes -> gguf-py dequantize."""
        inputs = f32(inputs).ravel()
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            data = gq.quantize(inputs.reshape(1, -1), qtype)
            data = np.ascontiguousarray(data).view(np.uint8).ravel()
            dequant = gq.dequantize(data.reshape(1, -1), qtype).astype(np.float32).ravel()
        self._add(label, qtype, FLAG_QUANTIZE, inputs.size, data.tobytes(), dequant, inputs)

    def raw(self, label, qtype, data):
        """raw block bytes -> gguf-py dequantize."""
        data = np.asarray(data, dtype=np.uint8).ravel()
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n_elems = data.size // block_bytes * block_elems
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            dequant = gq.dequantize(data.reshape(1, -1), qtype).astype(np.float32).ravel()
        self._add(label, qtype, 0, n_elems, data.tobytes(), dequant)

    def write(self, path):
        blob = MAGIC + struct.pack("<II", VERSION, len(self.records)) + b"".join(self.records)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        return len(blob)


# ---------------------------------------------------------------------------
# Scalar formats
# ---------------------------------------------------------------------------

def half_edge_floats():
    """Float inputs around every interesting fp16 boundary."""
    v = [
        0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.14159265, -2.71828183, 1e-3, 1e3,
        65504.0, -65504.0, 65519.99, 65520.0, -65520.0, 65536.0, 1e10, -3e38,
        np.inf, -np.inf,
        2.0 ** -14, -(2.0 ** -14), 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 5 * 2.0 ** -25,
        2.0 ** -14 - 2.0 ** -25, 2.0 ** -14 - 2.0 ** -24, 2.0 ** -26, 1e-8, -1e-8, 1e-45,
        -1e-45, 1e-40,
    ]
    bits = [
        0x3F801000,  # 1 + 2^-11: tie, rounds down to even
        0x3F803000,  # 1 + 3*2^-11: tie, rounds up to even
        0x3F801001,  # just above a tie
        0x3F800FFF,  # just below a tie
        0x477FEFFF,  # just below 65520
        0x33000001,  # just above 2^-25
        0x387FE000,  # largest-subnormal / smallest-normal tie
        0x7FC00000, 0xFFC00000, 0x7FC02000, 0xFFE00001,  # quiet NaNs
        0x00000001, 0x80000001, 0x007FFFFF,               # float subnormals
    ]
    return np.concatenate([f32(v), f32_bits(bits)])


def bf16_edge_floats():
    v = [0.0, -0.0, 1.0, -1.0, 3.0e38, -3.4e38, np.inf, -np.inf, 1e-38, 1e-45, -1e-45]
    bits = [
        0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties and neighbours
        0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,              # overflow to inf / not
        0x00008000, 0x00018000, 0x00000001, 0x807FFFFF,  # subnormals, rounded
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,  # quiet and signalling NaN
        0x7FBFFFFF, 0x7FC0FFFF,
    ]
    return np.concatenate([f32(v), f32_bits(bits)])


def random_float_bits(count):
    """Random bit patterns over the whole float range, NaNs removed."""
    b = rng.integers(0, 1 << 32, size=count, dtype=np.uint64).astype(np.uint32)
    x = b.view(np.float32)
    return x[~np.isnan(x)]


def scalar_records(w):
    # F32: quantize is a copy; still worth one record (NaN payloads, -0).
    w.quantized("f32 edges", T.F32,
                np.concatenate([bf16_edge_floats(), random_scaled_blocks(1, 64)]))

    # F16: edges; values in and around the half range; whole float range.
    w.quantized("f16 edges", T.F16, half_edge_floats())
    in_range = (rng.uniform(-1, 1, 512) * 10.0 ** rng.uniform(-9, 5, 512)).astype(np.float32)
    w.quantized("f16 in range", T.F16, in_range)
    w.quantized("f16 any float", T.F16, random_float_bits(512))
    h = rng.integers(0, 0x10000, size=256, dtype=np.uint32).astype(np.uint16)
    # Signalling NaN halves become quiet: numpy's software and F16C paths differ there.
    h = np.where(((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0), h | 0x200, h).astype(np.uint16)
    w.raw("f16 raw halves", T.F16, h.view(np.uint8))

    # BF16: gguf-py's quantizer is integer arithmetic, so any input is fair.
    w.quantized("bf16 edges", T.BF16, bf16_edge_floats())
    w.quantized("bf16 any float", T.BF16,
                rng.integers(0, 1 << 32, size=512, dtype=np.uint64).astype(np.uint32).view(np.float32))
    w.raw("bf16 raw", T.BF16, rng.integers(0, 256, size=512, dtype=np.uint8))


# ---------------------------------------------------------------------------
# Q8_0
# ---------------------------------------------------------------------------

def q8_0_records(w):
    w.quantized("q8_0 random", T.Q8_0, random_scaled_blocks(32, 16))

    blocks = []
    # d = 1 exactly (amax 127): x = k + 0.5 are ties, rounded away from zero.
    b = f32(np.arange(-15.5, 16.0, 1.0)); b[0] = 127.0; blocks.append(b)
    b = -f32(np.arange(-15.5, 16.0, 1.0)); b[-1] = -127.0; blocks.append(b)
    # d = 1/8, 1/x exact: ties again at (k + 0.5) / 8.
    b = f32(np.arange(-15.5, 16.0, 1.0) / 8); b[3] = 127.0 / 8; blocks.append(b)
    # d = 0.5: 0.25 -> 0.5 -> 1, -0.25 -> -1, 0.2 -> 0.
    b = f32([63.5, -0.25, 0.25, 0.75, -0.75, 0.2, -0.2, 0.0, -0.0] + [1.25] * 23); blocks.append(b)
    w.quantized("q8_0 ties", T.Q8_0, np.concatenate(blocks))

    blocks = [
        np.zeros(32, np.float32),                     # all zero: d = 0
        np.full(32, -0.0, np.float32),                # all negative zero
        np.concatenate([f32([1e-30]), rng.standard_normal(31).astype(np.float32) * 1e-31]),
        rng.standard_normal(32).astype(np.float32) * 1e-5,   # d a subnormal half
        rng.standard_normal(32).astype(np.float32) * 1e6,    # d large but finite
        rng.standard_normal(32).astype(np.float32) * 1e7,    # d overflows to inf
        np.concatenate([f32([3e38, -3e38]), np.zeros(30, np.float32)]),
        np.concatenate([f32([-5.0]), f32_bits(np.arange(1, 32, dtype=np.uint32) * 977)]),
    ]
    w.quantized("q8_0 special", T.Q8_0, np.concatenate(blocks))

    w.quantized("q8_0 sensitive", T.Q8_0, q8_0_sensitive_blocks(16))

    raw = rng.integers(0, 256, size=(8, 34), dtype=np.uint8)
    raw[:, 0:2] = finite_fp16(8).view(np.uint8).reshape(8, 2)
    w.raw("q8_0 raw", T.Q8_0, raw)


def near_ties(centers):
    """Each center moved by -3..3 units in the last place (float32)."""
    centers = f32(centers)
    steps = rng.integers(-3, 4, size=centers.shape)
    out = centers.copy()
    for i in range(out.size):
        for _ in range(abs(int(steps.flat[i]))):
            out.flat[i] = np.nextafter(out.flat[i], np.float32(np.inf if steps.flat[i] > 0 else -np.inf))
    return out


def q8_0_sensitive_blocks(count):
    """Blocks whose values sit within a few ulps of the rounding points, kept
    only when a plausible but wrong evaluation order (d = amax * (1/127), or
    x / d instead of x * (1/d)) quantizes them differently from gguf-py."""
    kept = []
    with np.errstate(all="ignore"):
        while len(kept) < count:
            amax = np.float32(10.0 ** rng.uniform(-2, 3))
            d = np.float32(amax / np.float32(127))
            k = rng.integers(-127, 127, size=32).astype(np.float32) + np.float32(0.5)
            x = near_ties(k * d)
            x[rng.integers(0, 32)] = amax * (1 if rng.random() < 0.5 else -1)
            x = np.clip(x, -amax, amax).astype(np.float32)
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
            want = gq.np_roundf(x * inv)
            d_alt = np.float32(amax * (np.float32(1) / np.float32(127)))
            alt1 = gq.np_roundf(x * (np.float32(1) / d_alt))
            alt2 = gq.np_roundf(x / d)
            if (want != alt1).any() or (want != alt2).any():
                kept.append(x)
    return np.concatenate(kept)


def tq_sensitive_block():
    """Values within a few ulps of +-amax/2, where x / amax and x * (1/amax)
    can round to different digits; the block keeps only elements that do."""
    while True:
        amax = np.float32(10.0 ** rng.uniform(-3, 3))
        x = near_ties(np.full(4096, amax / np.float32(2)) * rng.choice(f32([1, -1]), 4096))
        inv = np.float32(1) / amax
        differs = gq.np_roundf(x * inv) != gq.np_roundf(x / amax)
        if differs.sum() >= 8:
            picked = np.concatenate([x[differs][:128], x[~differs][:127]])
            block = np.concatenate([picked, f32([amax])])
            return rng.permutation(block).astype(np.float32)


# ---------------------------------------------------------------------------
# TQ1_0 / TQ2_0
# ---------------------------------------------------------------------------

def ternary_blocks(count, zero_fraction=0.3):
    codes = rng.integers(-1, 2, size=(count, 256)).astype(np.float32)
    codes[rng.random((count, 256)) < zero_fraction] = 0
    return codes


def tq_records(w, qtype, name):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    w.quantized(f"{name} random", qtype, random_scaled_blocks(256, 6))

    blocks = []
    # amax = 2: x = +-1 are ties (0.5), rounded away from zero; 0.99999994 is not.
    b = rng.choice(f32([2.0, -2.0, 1.0, -1.0, 0.99999994, -0.99999994, 0.0, -0.0, 0.5]), 256)
    b[17] = 2.0; blocks.append(b)
    # amax = 3 (1/3 inexact); values near the 1.5 threshold.
    b = rng.choice(f32([3.0, -3.0, 1.5, -1.5, 1.4999999, -1.5000001, 0.1]), 256)
    b[0] = -3.0; blocks.append(b)
    w.quantized(f"{name} ties", qtype, np.concatenate(blocks))

    blocks = [
        np.zeros(256, np.float32),
        np.full(256, -0.0, np.float32),
        ternary_blocks(1)[0] * np.float32(0.0123),     # exactly codes * scale
        ternary_blocks(1)[0] * np.float32(1e-30),      # d rounds to 0 in fp16
        rng.standard_normal(256).astype(np.float32) * 1e-6,   # d a subnormal half
        rng.standard_normal(256).astype(np.float32) * 1e5,    # d overflows to inf
    ]
    w.quantized(f"{name} special", qtype, np.concatenate(blocks))
    w.quantized(f"{name} sensitive", qtype, np.concatenate([tq_sensitive_block() for _ in range(2)]))

    # Arbitrary bytes: digit values ggml never writes (TQ2_0 code 3, TQ1_0
    # bytes that are not ceil(v*256/243)) must still decode like gguf-py.
    raw = rng.integers(0, 256, size=(4, block_bytes), dtype=np.uint8)
    raw[:, block_bytes - 2:] = finite_fp16(4).view(np.uint8).reshape(4, 2)
    w.raw(f"{name} raw", qtype, raw)


# ---------------------------------------------------------------------------
# Q4_K / Q6_K: gguf-py has no quantizer, so raw blocks only
# ---------------------------------------------------------------------------

def k_quant_records(w):
    raw = rng.integers(0, 256, size=(8, 144), dtype=np.uint8)
    raw[:, 0:2] = finite_fp16(8).view(np.uint8).reshape(8, 2)
    raw[:, 2:4] = finite_fp16(8).view(np.uint8).reshape(8, 2)
    raw[0, 0:4] = np.array([0x7BFF, 0x7BFF], np.uint16).view(np.uint8)   # both 65504
    raw[0, 4:] = 0xFF                                                     # all 63, all 15
    raw[1, 0:4] = np.array([0x0001, 0x8001], np.uint16).view(np.uint8)   # subnormal halves
    raw[2, 0:4] = np.array([0x0000, 0x8000], np.uint16).view(np.uint8)   # zero d, -0 dmin
    w.raw("q4_k raw", T.Q4_K, raw)
    realistic = rng.integers(0, 256, size=(4, 144), dtype=np.uint8)
    realistic[:, 0:2] = (rng.uniform(1e-4, 1e-2, 4).astype(np.float16)).view(np.uint8).reshape(4, 2)
    realistic[:, 2:4] = (rng.uniform(1e-4, 1e-2, 4).astype(np.float16)).view(np.uint8).reshape(4, 2)
    w.raw("q4_k realistic", T.Q4_K, realistic)

    raw = rng.integers(0, 256, size=(8, 210), dtype=np.uint8)
    raw[:, 208:210] = finite_fp16(8).view(np.uint8).reshape(8, 2)
    raw[0, 208:210] = np.array([0x7BFF], np.uint16).view(np.uint8)
    raw[0, 192:208] = np.array([127, -128] * 8, np.int8).view(np.uint8)
    raw[1, 208:210] = np.array([0x0001], np.uint16).view(np.uint8)
    raw[2, 208:210] = np.array([0x8000], np.uint16).view(np.uint8)
    w.raw("q6_k raw", T.Q6_K, raw)
    realistic = rng.integers(0, 256, size=(4, 210), dtype=np.uint8)
    realistic[:, 192:208] = rng.integers(-40, 40, size=(4, 16), dtype=np.int8).view(np.uint8)
    realistic[:, 208:210] = (rng.uniform(1e-5, 1e-3, 4).astype(np.float16)).view(np.uint8).reshape(4, 2)
    w.raw("q6_k realistic", T.Q6_K, realistic)


def main():
    root = Path(__file__).resolve().parent.parent
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests" / "data" / "quant_vectors.bin"
    w = Writer()
    scalar_records(w)
    q8_0_records(w)
    tq_records(w, T.TQ1_0, "tq1_0")
    tq_records(w, T.TQ2_0, "tq2_0")
    k_quant_records(w)
    size = w.write(out)
    gguf_version = version("gguf")
    print(f"wrote {out} ({size} bytes, {len(w.records)} records, seed {SEED:#x}, "
          f"gguf {gguf_version}, numpy {np.__version__})")
    for name, count in w.counts.items():
        print(f"  {name:6s} {count} records")


if __name__ == "__main__":
    main()
