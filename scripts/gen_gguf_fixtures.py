#!/usr/bin/env python3
"""Writes the small GGUF files that tests/test_gguf.c reads, with the gguf
Python package (gguf-py, llama.cpp's own writer), so that our reader is
checked against files we did not write ourselves.

    python3 scripts/gen_gguf_fixtures.py [OUT_DIR]   (default tests/data/gguf)

Files:
  fixture.gguf    every value type as a scalar, arrays of every element
                  type gguf-py can write, and tensors of F32 (1-D, 3-D,
                  4-D), F16, BF16, Q8_0, TQ2_0 and Q4_0 (a type bitnet does
                  not size itself, placed between others); default
                  alignment 32.
  align64.gguf    general.alignment = 64 and two tensors.

Every value below is repeated in tests/test_gguf.c; change both together.

With --check PATH instead, reads PATH with gguf.GGUFReader and prints its
key/values and tensors (used to cross-check files our C writer produced).
"""
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V


def pattern(n, mul, add):
    """n deterministic bytes: (i * mul + add) & 0xff."""
    return ((np.arange(n, dtype=np.uint32) * mul + add) & 0xFF).astype(np.uint8)


def write_fixture(path):
    w = gguf.GGUFWriter(path, arch="testarch")  # adds general.architecture
    w.add_key_value("t.u8", 200, V.UINT8)
    w.add_key_value("t.i8", -100, V.INT8)
    w.add_key_value("t.u16", 60000, V.UINT16)
    w.add_key_value("t.i16", -30000, V.INT16)
    w.add_key_value("t.u32", 4000000000, V.UINT32)
    w.add_key_value("t.i32", -2000000000, V.INT32)
    w.add_key_value("t.f32", 1.5, V.FLOAT32)
    w.add_key_value("t.bool_true", True, V.BOOL)
    w.add_key_value("t.bool_false", False, V.BOOL)
    w.add_key_value("t.str", "h\u00e9llo w\u00f6rld", V.STRING)
    w.add_key_value("t.u64", 18000000000000000000, V.UINT64)
    w.add_key_value("t.i64", -9000000000000000000, V.INT64)
    w.add_key_value("t.f64", 0.1, V.FLOAT64)
    w.add_key_value("t.u32_small", 7, V.UINT32)
    w.add_key_value("t.arr_str", ["a", "", "\u00fcber", "last one"], V.ARRAY, V.STRING)
    w.add_key_value("t.arr_i32", [1, -2, 2147483647, -2147483648], V.ARRAY, V.INT32)
    w.add_key_value("t.arr_f32", [0.25, -1.0, 3.5], V.ARRAY, V.FLOAT32)
    w.add_key_value("t.arr_u8", [0, 255, 17], V.ARRAY, V.UINT8)
    w.add_key_value("t.arr_i64", [-5, 6000000000], V.ARRAY, V.INT64)
    w.add_key_value("t.arr_u64", [1, 18000000000000000000], V.ARRAY, V.UINT64)
    w.add_key_value("t.arr_bool", [True, False, True], V.ARRAY, V.BOOL)
    w.add_key_value("t.arr_f64", [2.5, -0.125], V.ARRAY, V.FLOAT64)

    # numpy shapes are outermost first; GGUF ne is the reverse.
    w.add_tensor("f32.vec", (np.arange(5, dtype=np.float32) * 0.5 - 1.0))
    w.add_tensor("f32.cube", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    w.add_tensor("f32.4d", np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2))
    w.add_tensor("f16.mat", (np.arange(6, dtype=np.float32) - 2.0).astype(np.float16).reshape(2, 3))
    w.add_tensor("bf16.raw", pattern(2 * 16, 3, 1).reshape(2, 16), raw_dtype=Q.BF16)
    w.add_tensor("q8_0.mat", pattern(2 * 34, 7, 3).reshape(2, 34), raw_dtype=Q.Q8_0)
    w.add_tensor("q4_0.unknown", pattern(18, 5, 9).reshape(1, 18), raw_dtype=Q.Q4_0)
    w.add_tensor("tq2_0.mat", pattern(2 * 66, 11, 5).reshape(2, 66), raw_dtype=Q.TQ2_0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_align64(path):
    w = gguf.GGUFWriter(path, arch="testarch")
    w.add_custom_alignment(64)
    w.add_tensor("a", np.arange(3, dtype=np.float32))
    w.add_tensor("b", np.arange(20, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check(path):
    r = gguf.GGUFReader(path)
    for f in r.fields.values():
        vtype = [t.name for t in f.types]
        if f.types and f.types[0] == V.ARRAY:
            if f.types[-1] == V.STRING:
                val = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
        elif f.types and f.types[0] == V.STRING:
            val = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            val = f.parts[f.data[0]].tolist()[0] if f.data else None
        print(f"kv {f.name} {vtype} {val!r}")
    for t in r.tensors:
        first = bytes(np.asarray(t.data).view(np.uint8).reshape(-1)[:8]).hex()
        print(f"tensor {t.name} {t.tensor_type.name} ne={[int(n) for n in t.shape]} "
              f"bytes={t.n_bytes} offset={t.data_offset} first={first}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
        return
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "gguf")
    os.makedirs(out, exist_ok=True)
    write_fixture(os.path.join(out, "fixture.gguf"))
    write_align64(os.path.join(out, "align64.gguf"))


if __name__ == "__main__":
    main()
