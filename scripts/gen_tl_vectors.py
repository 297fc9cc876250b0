#!/usr/bin/env python3
"""
gen_tl_vectors.py - test vectors for Microsoft bitnet.cpp's TL1 / TL2 weight
encodings (ggml types 38 / 39), written into tests/data/tl_vectors.bin.

This is an independent numpy re-implementation of what bitnet.cpp's converter
(utils/convert-hf-to-gguf-bitnet.py: preprocess_weights_tl1 / process_tl1,
preprocess_weights_tl2 / preprocess_three_weights_tl2 /
preprocess_two_weights_tl2) writes as a tensor's data. It was written from the
layout description in src/quant/fmt_tl.c (derived from reading that source),
as explicit index arithmetic rather than the converter's reshape chain, so a
mistake in either the C code or this script shows up as a disagreement.

Regenerate (fixed seed, deterministic output):

    python3 scripts/gen_tl_vectors.py            # writes tests/data/tl_vectors.bin

File format (little-endian):

    magic    8 bytes  b"BNTLVEC1"
    count    uint32   number of cases
    then `count` cases, each:
      type     uint32   38 = TL1, 39 = TL2 (ggml type id)
      rows     uint32   N, output features (GGUF ne[1])
      cols     uint32   K, input features  (GGUF ne[0])
      BM       uint32   rows per block        (kernel_config.ini "bm")
      BK       uint32   columns per block     (kernel_config.ini "bk")
      bm       uint32   rows per compute tile (kernel_config.ini "bmm")
      nbytes   uint64   size of the packed tensor data
      codes    uint8[rows*cols/4]  ternary codes, row-major [rows][cols], four
                                   per byte: element i is (bits 2*(i%4) of byte
                                   i/4) - 1 (stored compactly to keep the file
                                   small; this is not a bitnet.cpp format)
      packed   uint8[nbytes]       the bytes the converter writes for them
"""

import argparse
import pathlib
import struct

import numpy as np

SEED = 20250601
MAGIC = b"BNTLVEC1"
TYPE_TL1 = 38
TYPE_TL2 = 39

# The 32-byte TL2 tiles store their four 8-row groups in the order 0, 2, 1, 3
# (so that AVX2 unpacklo/unpackhi see rows 0..15 and 16..31). The map is its
# own inverse: position group g holds row group GROUP_ORDER[g].
GROUP_ORDER = (0, 2, 1, 3)


def pair_index(codes, first_col, n_pairs):
    """TL1-style 4-bit index of weight pairs: 3*w0 + w1 + 4 (0..8)."""
    a = codes[:, first_col:first_col + 2 * n_pairs:2].astype(np.int32)
    b = codes[:, first_col + 1:first_col + 2 * n_pairs:2].astype(np.int32)
    return 3 * a + b + 4


def tl1_pack(codes, BM, BK, bm):
    rows, cols = codes.shape
    by = 256 // bm
    idx = pair_index(codes, 0, cols // 2)          # [rows][cols/2]
    out = bytearray(rows * cols // 4)
    pos = 0
    for r0 in range(0, rows, BM):                  # BM-row block
        for c0 in range(0, cols, BK):              # BK-column block
            for r1 in range(r0, r0 + BM, bm):      # bm-row compute tile
                for c1 in range(c0, c0 + BK, by):  # by-column compute tile
                    for r2 in range(r1, r1 + bm, 16):      # 16 rows
                        for c2 in range(c1, c1 + by, 4):   # 4 columns = 2 pairs
                            p = c2 // 2
                            hi = idx[r2:r2 + 16, p]
                            lo = idx[r2:r2 + 16, p + 1]
                            out[pos:pos + 16] = bytes((hi << 4 | lo).astype(np.uint8))
                            pos += 16
    assert pos == len(out)
    return bytes(out)


def tl2_size(rows, cols):
    """The size the converter pads the tensor to (Python floor division)."""
    return (cols - 256) * rows // 3 * 5 // 8 + 256 * rows // 2 * 4 // 8


def regroup(tile_rows):
    """Rows of a 32-row tile, in the order the 32 bytes store them."""
    return np.concatenate([tile_rows[8 * g:8 * g + 8] for g in GROUP_ORDER])


def tl2_pack(codes, BM, BK, bm):
    assert bm == 32
    rows, cols = codes.shape
    k2 = cols % BK
    k3 = cols - k2
    c = codes.astype(np.int32)
    triple = 9 * c[:, 0:k3:3] + 3 * c[:, 1:k3:3] + c[:, 2:k3:3]   # [rows][k3/3]
    mag = np.abs(triple)
    neg = (triple < 0).astype(np.uint16)
    nib = bytearray()
    sgn = bytearray()
    two = bytearray()
    tpb = BK // 3                                  # triples per column block
    for r0 in range(0, rows, BM):
        for t0 in range(0, k3 // 3, tpb):
            for r1 in range(r0, r0 + BM, 32):
                # magnitudes: one 32-byte tile per 2 triples (6 weights)
                for t1 in range(t0, t0 + tpb, 2):
                    hi = mag[r1:r1 + 32, t1]
                    lo = mag[r1:r1 + 32, t1 + 1]
                    nib += bytes(regroup((hi << 4 | lo).astype(np.uint8)))
    for r0 in range(0, rows, BM):
        for t0 in range(0, k3 // 3, tpb):
            for r1 in range(r0, r0 + BM, 32):
                # signs: one 32-byte tile (16 uint16) per 8 triples (24 weights)
                for t1 in range(t0, t0 + tpb, 8):
                    words = np.zeros(16, dtype=np.uint16)
                    for q in range(8):
                        for s in range(32):
                            a = 2 * q + s // 16
                            words[s % 16] |= neg[r1 + s, t1 + q] << (15 - a)
                    sgn += words.astype("<u2").tobytes()
    if k2:
        idx = pair_index(codes, k3, k2 // 2)        # [rows][k2/2]
        for r0 in range(0, rows, BM):
            for p0 in range(0, k2 // 2, 16):        # 32-column block
                for r1 in range(r0, r0 + BM, 32):
                    for p1 in range(p0, p0 + 16, 2):  # 4 columns = 2 pairs
                        hi = idx[r1:r1 + 32, p1]
                        lo = idx[r1:r1 + 32, p1 + 1]
                        two += bytes(regroup((hi << 4 | lo).astype(np.uint8)))
    data = bytes(nib + sgn + two)
    size = tl2_size(rows, cols)
    assert size >= len(data)
    return data + bytes(size - len(data))


# (type, rows, cols, BM, BK, bm, why). Small shapes that still have several
# blocks in each direction; the layout rules do not depend on the size.
CASES = [
    (TYPE_TL1, 32, 128, 32, 128, 32, "default rule for this shape"),
    (TYPE_TL1, 64, 64, 64, 64, 64, "bm = 64 (by = 4), like large 1536x1536"),
    (TYPE_TL1, 160, 64, 160, 64, 32, "BM = 160, like 3B 3200x8640"),
    (TYPE_TL1, 64, 256, 32, 128, 32, "2 x 2 blocks (2560x2560-like)"),
    (TYPE_TL1, 128, 128, 64, 64, 32, "2 x 2 blocks, BK = 64"),
    (TYPE_TL2, 32, 288, 32, 96, 32, "K % BK == 0: no two-weight tail"),
    (TYPE_TL2, 32, 352, 32, 96, 32, "ragged: 64-column tail (2560 % 96 == 64)"),
    (TYPE_TL2, 64, 320, 32, 96, 32, "ragged: 32-column tail (3200 % 96 == 32)"),
    (TYPE_TL2, 32, 384, 32, 192, 32, "BK = 192, like large 1536x1536"),
    (TYPE_TL2, 160, 256, 160, 96, 32, "BM = 160, minimum K, 64-column tail"),
    (TYPE_TL2, 32, 256, 32, 96, 32, "default rule for this shape"),
]


def pack_codes_2bit(codes):
    """Reference codes for the file: four per byte, value + 1, LSB first."""
    flat = (codes.reshape(-1).astype(np.int32) + 1).astype(np.uint8)
    assert flat.size % 4 == 0
    q = flat.reshape(-1, 4)
    return bytes(q[:, 0] | q[:, 1] << 2 | q[:, 2] << 4 | q[:, 3] << 6)


def main():
    here = pathlib.Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=pathlib.Path,
                    default=here.parent / "tests" / "data" / "tl_vectors.bin")
    args = ap.parse_args()

    rng = np.random.default_rng(SEED)
    blob = bytearray(MAGIC + struct.pack("<I", len(CASES)))
    for qtype, rows, cols, BM, BK, bm, _why in CASES:
        codes = rng.integers(-1, 2, size=(rows, cols), dtype=np.int8)
        if qtype == TYPE_TL1:
            packed = tl1_pack(codes, BM, BK, bm)
        else:
            packed = tl2_pack(codes, BM, BK, bm)
        blob += struct.pack("<6IQ", qtype, rows, cols, BM, BK, bm, len(packed))
        blob += pack_codes_2bit(codes)
        blob += packed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(bytes(blob))
    print(f"wrote {args.out} ({len(blob)} bytes, {len(CASES)} cases, seed {SEED})")


if __name__ == "__main__":
    main()
