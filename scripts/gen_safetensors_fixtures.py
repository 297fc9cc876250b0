#!/usr/bin/env python3
"""Writes tests/data/hf/: tiny Hugging Face BitNet model directories and
malformed files for tests/test_safetensors.c. The files are committed, so CI
needs neither Python nor these packages.

    pip install safetensors numpy ml_dtypes
    python3 scripts/gen_safetensors_fixtures.py [output dir]

The seed is fixed: regenerating gives the same bytes as long as the
safetensors writer does not change its layout.

What the real checkpoints hold (microsoft/bitnet-b1.58-2B-4T and -bf16),
mirrored here at tiny sizes (hidden 64, 2 layers, 4 heads / 2 kv heads,
FFN 128, vocab 300):

    model.embed_tokens.weight                     BF16 [vocab, hidden]
    model.norm.weight                             BF16 [hidden]
    model.layers.N.input_layernorm.weight         BF16 [hidden]
    model.layers.N.post_attention_layernorm.weight BF16 [hidden]
    model.layers.N.self_attn.attn_sub_norm.weight BF16 [hidden]
    model.layers.N.mlp.ffn_sub_norm.weight        BF16 [ffn]
    model.layers.N.<proj>.weight                  U8 [out/4, in]   (packed)
    model.layers.N.<proj>.weight_scale            BF16 [1]
      <proj> = self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj

No lm_head.weight: the embeddings are tied. Rebuilding the header of the
packed file from this list (542 tensors, metadata {"format": "pt"}) gives
exactly the published file size, 1,178,623,988 bytes; with F32 scales it
would be 2,364 bytes smaller. Packing (transformers integrations/bitnet.py
pack_weights): output row r sits in packed row r % (out/4) at bits
2 * (r // (out/4)), codes 0, 1, 2 for -1, 0, +1.

Outputs:
    tiny/           config.json, generation_config.json, tokenizer.json
                    (a placeholder, only its presence matters), model.safetensors
    sharded/        the same tensors in two shards plus
                    model.safetensors.index.json
    expect.txt      one line per tensor of tiny/ and sharded/:
                    name dtype ndims dims... bytes fnv1a64(data)
    small.safetensors  four tiny tensors (a scalar and an empty one among
                    them) for the truncation battery
    configs/        the two real 2B-4T configs and edge cases, good and bad
    bad/            malformed .safetensors files and broken directories
"""

import json
import os
import shutil
import struct
import sys

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save, save_file

SEED = 20250416
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 64, 2, 4, 2, 128, 300
HEAD_DIM = HIDDEN // HEADS

PROJECTIONS = [  # name, out, in
    ("self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN),
    ("self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN),
    ("self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN),
    ("self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM),
    ("mlp.gate_proj", FFN, HIDDEN),
    ("mlp.up_proj", FFN, HIDDEN),
    ("mlp.down_proj", HIDDEN, FFN),
]

BF16 = ml_dtypes.bfloat16


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def pack_ternary(codes: np.ndarray) -> np.ndarray:
    """HF layout: (out, in) values in {-1,0,1} -> uint8 (out/4, in)."""
    out = codes.shape[0]
    rows = out // 4
    shifted = (codes + 1).astype(np.uint8)
    packed = np.zeros((rows, codes.shape[1]), dtype=np.uint8)
    for i in range(4):
        packed |= shifted[i * rows:(i + 1) * rows] << (2 * i)
    return packed


def model_tensors(rng: np.random.Generator) -> dict:
    t = {}
    t["model.embed_tokens.weight"] = (rng.standard_normal((VOCAB, HIDDEN)) * 0.5).astype(BF16)
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(BF16)
        t[p + "post_attention_layernorm.weight"] = (
            1 + 0.1 * rng.standard_normal(HIDDEN)).astype(BF16)
        t[p + "self_attn.attn_sub_norm.weight"] = (
            1 + 0.1 * rng.standard_normal(HIDDEN)).astype(BF16)
        t[p + "mlp.ffn_sub_norm.weight"] = (1 + 0.1 * rng.standard_normal(FFN)).astype(BF16)
        for k, (name, out, inp) in enumerate(PROJECTIONS):
            codes = rng.integers(-1, 2, size=(out, inp))
            t[p + name + ".weight"] = pack_ternary(codes)
            # Exact in bf16, so the C test can check the value: 1.5, 1.75, ...
            scale = 1.5 + 0.25 * k + 2.0 * layer
            t[p + name + ".weight_scale"] = np.array([scale], dtype=BF16)
    t["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(BF16)
    return t


def tiny_config() -> dict:
    """The keys of microsoft/bitnet-b1.58-2B-4T's config.json, tiny sizes."""
    return {
        "architectures": ["BitNetForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_bitnet.BitNetConfig",
            "AutoModelForCausalLM": "modeling_bitnet.BitNetForCausalLM",
        },
        "bos_token_id": 256,
        "eos_token_id": 257,
        "hidden_act": "relu2",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": FFN,
        "max_position_embeddings": 128,
        "model_type": "bitnet",
        "rms_norm_eps": 1e-05,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
        "quantization_config": {
            "quant_method": "bitnet",
            "linear_class": "autobitlinear",
            "quantization_mode": "offline",
        },
    }


def real_config(mode: str) -> dict:
    """config.json of microsoft/bitnet-b1.58-2B-4T ("offline", packed) and
    -bf16 ("online"), as published in the model cards."""
    cfg = tiny_config()
    cfg.update({
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_size": 2560,
        "intermediate_size": 6912, "max_position_embeddings": 4096,
        "num_attention_heads": 20, "num_hidden_layers": 30, "num_key_value_heads": 5,
        "vocab_size": 128256,
    })
    cfg["quantization_config"] = dict(cfg["quantization_config"], quantization_mode=mode)
    return cfg


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def raw_safetensors(header, data: bytes = b"", length=None) -> bytes:
    """A file written by hand, for the malformed cases: header is a dict
    (serialized as is, duplicates impossible) or raw text."""
    text = header if isinstance(header, (str, bytes)) else json.dumps(header)
    text = text.encode() if isinstance(text, str) else text
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def write_expectations(path: str, tensors: dict) -> None:
    lines = []
    for name in sorted(tensors):
        a = tensors[name]
        dtype = {"bfloat16": "BF16", "uint8": "U8", "float32": "F32"}[a.dtype.name]
        raw = a.tobytes()
        dims = " ".join(str(d) for d in a.shape)
        lines.append(f"{name} {dtype} {a.ndim} {dims} {len(raw)} {fnv1a64(raw):016x}")
    with open(path, "w") as f:
        f.write("# name dtype ndims dims... bytes fnv1a64 (scripts/gen_safetensors_fixtures.py)\n")
        f.write("\n".join(lines) + "\n")


def check_readback(path: str, tensors: dict) -> None:
    """The reference reader must see exactly what was written."""
    with safe_open(path, framework="numpy") as f:
        for name in f.keys():
            assert f.get_slice(name).get_shape() == list(tensors[name].shape), name


def write_model_dirs(out: str, tensors: dict) -> None:
    tiny = os.path.join(out, "tiny")
    os.makedirs(tiny)
    write_json(os.path.join(tiny, "config.json"), tiny_config())
    write_json(os.path.join(tiny, "generation_config.json"),
               {"_from_model_config": True, "bos_token_id": 256,
                "eos_token_id": [257, 259], "transformers_version": "4.52.0"})
    write_json(os.path.join(tiny, "tokenizer.json"),
               {"version": "1.0", "note": "placeholder: only its presence is tested"})
    save_file(tensors, os.path.join(tiny, "model.safetensors"), metadata={"format": "pt"})
    check_readback(os.path.join(tiny, "model.safetensors"), tensors)

    sharded = os.path.join(out, "sharded")
    os.makedirs(sharded)
    write_json(os.path.join(sharded, "config.json"), tiny_config())
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts = [{}, {}]
    for name, a in tensors.items():
        second = name.startswith("model.layers.1.") or name == "model.norm.weight"
        parts[second][name] = a
    weight_map = {}
    for shard, part in zip(names, parts):
        save_file(part, os.path.join(sharded, shard), metadata={"format": "pt"})
        check_readback(os.path.join(sharded, shard), part)
        weight_map.update({n: shard for n in part})
    total = sum(a.nbytes for a in tensors.values())
    write_json(os.path.join(sharded, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def write_bad_dirs(bad: str, tensors: dict) -> None:
    small = {"model.norm.weight": tensors["model.norm.weight"],
             "model.embed_tokens.weight": tensors["model.embed_tokens.weight"][:4]}
    shard1 = "model-00001-of-00002.safetensors"
    shard2 = "model-00002-of-00002.safetensors"

    # The index names a second shard that was never downloaded.
    d = os.path.join(bad, "dir_missing_shard")
    os.makedirs(d)
    write_json(os.path.join(d, "config.json"), tiny_config())
    save_file({"model.norm.weight": small["model.norm.weight"]}, os.path.join(d, shard1))
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"weight_map": {"model.norm.weight": shard1,
                               "model.embed_tokens.weight": shard2}})

    # The index lists a tensor its shard does not hold.
    d = os.path.join(bad, "dir_index_missing_tensor")
    os.makedirs(d)
    write_json(os.path.join(d, "config.json"), tiny_config())
    save_file({"model.norm.weight": small["model.norm.weight"]}, os.path.join(d, shard1))
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"weight_map": {"model.norm.weight": shard1, "lm_head.weight": shard1}})

    # Two shards both hold the same tensor.
    d = os.path.join(bad, "dir_duplicate_tensor")
    os.makedirs(d)
    write_json(os.path.join(d, "config.json"), tiny_config())
    save_file(small, os.path.join(d, shard1))
    save_file({"model.norm.weight": small["model.norm.weight"]}, os.path.join(d, shard2))
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"weight_map": {"model.norm.weight": shard2,
                               "model.embed_tokens.weight": shard1}})

    # A shard name that would leave the directory.
    d = os.path.join(bad, "dir_shard_escape")
    os.makedirs(d)
    write_json(os.path.join(d, "config.json"), tiny_config())
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"weight_map": {"model.norm.weight": "../tiny/model.safetensors"}})

    # config.json but no weights.
    d = os.path.join(bad, "dir_no_weights")
    os.makedirs(d)
    write_json(os.path.join(d, "config.json"), tiny_config())

    # Not a model at all.
    d = os.path.join(bad, "not_a_model")
    os.makedirs(d)
    with open(os.path.join(d, "README.txt"), "w") as f:
        f.write("This directory has no config.json: bn_hf_dir_open must refuse it.\n")

    # A broken config.json inside an otherwise fine directory.
    d = os.path.join(bad, "dir_bad_config")
    os.makedirs(d)
    cfg = tiny_config()
    del cfg["num_hidden_layers"]
    write_json(os.path.join(d, "config.json"), cfg)
    save_file(small, os.path.join(d, "model.safetensors"))


def write_bad_files(bad: str) -> None:
    f32 = lambda shape, offs: {"dtype": "F32", "shape": shape, "data_offsets": offs}
    cases = {
        "short": b"\x05\x00\x00",
        "header_past_end": raw_safetensors({"w": f32([1], [0, 4])}, b"\0" * 4, length=1000),
        "header_huge": raw_safetensors("{}", b"", length=(1 << 63) + 5),
        "header_zero": raw_safetensors("", b"\0" * 8, length=0),
        "not_json": raw_safetensors('{"w": {"dtype": "F32", "shape": [1]', b"\0" * 4),
        "not_object": raw_safetensors("[1, 2, 3]"),
        "nul_in_header": raw_safetensors(b'{"w": 1}\0  ', b""),
        "entry_not_object": raw_safetensors({"w": 5}),
        "dtype_unknown": raw_safetensors(
            {"w": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2),
        "dtype_unsupported": raw_safetensors(
            {"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),
        "dtype_missing": raw_safetensors({"w": {"shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "dtype_not_string": raw_safetensors(
            {"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "shape_missing": raw_safetensors({"w": {"dtype": "F32", "data_offsets": [0, 4]}}, b"\0" * 4),
        "shape_not_array": raw_safetensors(
            {"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}}, b"\0" * 16),
        "shape_negative": raw_safetensors({"w": f32([-1, 4], [0, 16])}, b"\0" * 16),
        "shape_fraction": raw_safetensors({"w": f32([2.5], [0, 10])}, b"\0" * 10),
        "shape_string": raw_safetensors({"w": f32(["4"], [0, 16])}, b"\0" * 16),
        "shape_too_many_dims": raw_safetensors({"w": f32([1] * 9, [0, 4])}, b"\0" * 4),
        "shape_overflow": raw_safetensors(
            {"w": f32([1 << 32, 1 << 32, 1 << 32], [0, 0])}),
        "offsets_missing": raw_safetensors({"w": {"dtype": "F32", "shape": [1]}}, b"\0" * 4),
        "offsets_one_value": raw_safetensors({"w": f32([1], [4])}, b"\0" * 4),
        "offsets_reversed": raw_safetensors({"w": f32([1], [8, 4])}, b"\0" * 8),
        "offsets_past_end": raw_safetensors({"w": f32([16], [0, 64])}, b"\0" * 16),
        "offsets_negative": raw_safetensors({"w": f32([1], [-4, 0])}, b"\0" * 4),
        # The example the reader's messages were designed around.
        "offsets_mismatch": raw_safetensors(
            {"model.layers.0.mlp.down_proj.weight":
             {"dtype": "BF16", "shape": [2560, 6912], "data_offsets": [0, 100]}}, b"\0" * 100),
        "overlap": raw_safetensors(
            {"a": f32([2], [0, 8]), "b": f32([2], [4, 12])}, b"\0" * 12),
        "duplicate_name": raw_safetensors(
            '{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
            '"w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}', b"\0" * 2),
        "metadata_not_string": raw_safetensors({"__metadata__": {"format": 1}}),
        "metadata_not_object": raw_safetensors({"__metadata__": "pt"}),
    }
    for name, data in cases.items():
        write_bytes(os.path.join(bad, name + ".safetensors"), data)


def write_configs(out: str) -> None:
    d = os.path.join(out, "configs")
    os.makedirs(d)
    write_json(os.path.join(d, "bitnet-b1.58-2B-4T.json"), real_config("offline"))
    write_json(os.path.join(d, "bitnet-b1.58-2B-4T-bf16.json"), real_config("online"))

    # Only the required fields: every default shows.
    write_json(os.path.join(d, "minimal.json"), {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 300, "model_type": "bitnet"})
    write_json(os.path.join(d, "llama_defaults.json"), {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 300, "model_type": "llama",
        "num_key_value_heads": None, "eos_token_id": [128001, 128008, 128009],
        "head_dim": 32, "quantization_config": {"quant_method": "bitnet"}})

    bad = {
        "bad_missing_hidden_size": ("hidden_size", None),
        "bad_hidden_size_string": ("hidden_size", "2560"),
        "bad_layers_fraction": ("num_hidden_layers", 2.5),
        "bad_heads_zero": ("num_attention_heads", 0),
        "bad_kv_heads": ("num_key_value_heads", 3),
        "bad_rope_theta": ("rope_theta", "big"),
        "bad_rms_eps_negative": ("rms_norm_eps", -1e-5),
        "bad_tie_string": ("tie_word_embeddings", "true"),
        "bad_eos_list": ("eos_token_id", [1, "two"]),
        "bad_eos_too_many": ("eos_token_id", list(range(9))),
        "bad_architectures": ("architectures", "BitNetForCausalLM"),
        "bad_hidden_act_long": ("hidden_act", "a-very-long-activation-name"),
        "bad_quant_not_object": ("quantization_config", "bitnet"),
        "bad_linear_class": ("quantization_config", {"quant_method": "bitnet",
                                                     "linear_class": "bitlinear2"}),
        "bad_quant_method_missing": ("quantization_config", {"linear_class": "bitlinear"}),
    }
    for name, (key, value) in bad.items():
        cfg = tiny_config()
        if value is None:
            del cfg[key]
        else:
            cfg[key] = value
        write_json(os.path.join(d, name + ".json"), cfg)
    with open(os.path.join(d, "bad_syntax.json"), "w") as f:
        f.write('{\n  "hidden_size": 64,\n  "vocab_size": 300\n  "num_hidden_layers": 2\n}\n')
    with open(os.path.join(d, "bad_not_object.json"), "w") as f:
        f.write("[64, 128]\n")


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "hf")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)

    rng = np.random.default_rng(SEED)
    tensors = model_tensors(rng)
    write_model_dirs(out, tensors)
    write_expectations(os.path.join(out, "expect.txt"), tensors)

    small = {"a.f32": np.arange(6, dtype=np.float32).reshape(2, 3),
             "b.u8": np.array([1, 2, 3, 250], dtype=np.uint8),
             "c.scalar": np.array(7, dtype=np.int64),
             "d.empty": np.zeros((0, 3), dtype=np.float32)}
    write_bytes(os.path.join(out, "small.safetensors"),
                save(small, metadata={"format": "pt"}))

    bad = os.path.join(out, "bad")
    os.makedirs(bad)
    write_bad_files(bad)
    write_bad_dirs(bad, tensors)
    write_configs(out)

    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    print(f"wrote {out}: {total} bytes")


if __name__ == "__main__":
    main()
