#!/usr/bin/env python3
"""Regenerates the tiny model fixtures in tests/data/models/.

    pip install torch transformers accelerate safetensors numpy gguf tokenizers   (PyPI)
    python3 scripts/gen_model_fixtures.py

Two small random BitNet b1.58 models, each saved in the files people have,
with reference outputs computed by Hugging Face transformers'
BitNetForCausalLM in float32 (eager attention, torch.compile disabled so the
reference is transformers' plain PyTorch code). Everything is seeded; one
command rewrites everything; the outputs are committed so CI needs no
Python.

Model "packed" (dim 256, ffn 256 (TQ1_0/TQ2_0 need rows of 256s; the
bf16 model covers ffn != dim), 4 heads / 2 kv heads, 2 layers, vocab 300,
tied embeddings): ternary codes with one bf16 scale per projection, exactly
what microsoft/bitnet-b1.58-2B-4T ships. Its embeddings are k * 2^-9 with
|k| <= 127 and a +-127 in every 32-element block, so F16, BF16 and Q8_0 all
hold them exactly; a bf16 scale is exact in fp16, so TQ1_0/TQ2_0 block
scales are exact too. Every file below therefore holds the SAME model and
must reproduce the same reference:

  hf_packed/       config.json (autobitlinear, offline), model.safetensors
                   (uint8 (out/4, in) + bf16 weight_scale, bf16 norms and
                   embeddings), tokenizer.json, generation_config.json
  i2s.gguf         "bitnet-25" as Microsoft's official file: I2_S projections
                   (flat 128-element blocks, float32 scale trailer), F16
                   embeddings, F32 norms, tokenizer without tokenizer.ggml.pre
  tq2_0.gguf       upstream llama.cpp "bitnet": TQ2_0 projections, Q8_0
                   embeddings, F32 norms, rope scaling keys, llama-bpe pre
  tq1_0.gguf       upstream "bitnet": TQ1_0 projections, F16 embeddings
  expect_packed.txt  prompt ids, transformers' logits at every prompt
                   position, the greedy continuation (32 tokens) and the
                   smallest top-1/top-2 logit gap along it

Model "bf16" (dim 64, ffn 160, 4 heads / 2 kv heads, 2 layers, vocab 300,
separate LM head): bf16 master weights that transformers quantizes on every
forward (autobitlinear, online), as microsoft/bitnet-b1.58-2B-4T-bf16 ships.
No master weight lies within 0.2 % of an absmean rounding boundary, so any
correct absmean gives the same codes.

  hf_bf16/         config.json (online), model.safetensors, tokenizer.json
  expect_bf16.txt  as above

The tokenizer is a byte-level BPE trained here (LLaMA-3 split regex, 297
tokens + <|begin_of_text|> <|end_of_text|> <|eot_id|>) on the text below.

What makes the references trustworthy (see "exact arithmetic" below):
  - no token's first-layer int8 activation lies within 0.002 of a rounding
    boundary (low-precision embeddings make exact .5 ties common there, and
    fp32 noise would then decide the code);
  - transformers' logits at every position of prompt + continuation agree
    with a float64 implementation of FORMATS.md section 1 written here
    (max difference ~1e-5), so no int8 code in the reference was decided by
    rounding noise, and transformers' BitNet is that math;
  - the prompt (first of a fixed list passing both checks) has a top-1/top-2
    logit gap of at least MIN_GAP at every greedy step.

Needs accelerate (transformers' bitnet quantizer imports it).
"""

import json
import os
import shutil
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # plain eager PyTorch reference
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import gguf  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "models")
SEED = 20250417
GREEDY_STEPS = 32
PROMPT_LEN = 8  # BOS + the first 7 tokens of the text
MIN_GAP = 0.05
I2_S = 36  # Microsoft bitnet.cpp's ggml type id (not in gguf-py)

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = """\
BitNet b1.58 is a transformer whose linear layers hold ternary weights, minus one,
zero or plus one, with one scale per matrix. Activations are quantized to eight
bits per token with the absolute maximum. The model uses rotary position
embeddings, squared ReLU in the feed-forward network and two extra RMS norms,
one before the attention output and one before the down projection. A runtime
for such models reads the weights from the files people have: GGUF files from
bitnet.cpp or llama.cpp, and Hugging Face checkpoints in safetensors. The quick
brown fox jumps over the lazy dog; the lazy dog sleeps in the sun. Hello world,
hello again, and hello once more. Numbers like 1, 22, 333 and 4444 split into
groups of at most three digits. It's, we're, they've, I'm, you'll and he'd are
contractions the pre-tokenizer keeps apart.
"""
PROMPTS = [
    "Hello world, the lazy dog",
    "The quick brown fox jumps",
    "BitNet reads ternary weights",
    "one, 22, 333 and the sun",
    "we're hello again in GGUF",
    "squared ReLU and two norms",
]

PACKED_SHAPE = dict(vocab=300, dim=256, ffn=256, layers=2, heads=4, kv_heads=2, ctx=256,
                    eps=1e-5, theta=500000.0)
BF16_SHAPE = dict(vocab=300, dim=64, ffn=160, layers=2, heads=4, kv_heads=2, ctx=128,
                  eps=1e-5, theta=10000.0)

# HF tensor names and the GGUF names the converters give them.
PROJ_HF = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
           "down": "mlp.down_proj"}
PROJ_GGUF = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
             "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
NORM_HF = {"attn": "input_layernorm", "attn_sub": "self_attn.attn_sub_norm",
           "ffn": "post_attention_layernorm", "ffn_sub": "mlp.ffn_sub_norm"}
NORM_GGUF = {"attn": "attn_norm", "attn_sub": "attn_sub_norm", "ffn": "ffn_norm",
             "ffn_sub": "ffn_sub_norm"}


def proj_shape(s, p):
    hd = s["dim"] // s["heads"]
    q_dim, kv_dim = s["heads"] * hd, s["kv_heads"] * hd
    return {"q": (q_dim, s["dim"]), "k": (kv_dim, s["dim"]), "v": (kv_dim, s["dim"]),
            "o": (s["dim"], q_dim), "gate": (s["ffn"], s["dim"]), "up": (s["ffn"], s["dim"]),
            "down": (s["dim"], s["ffn"])}[p]


def norm_size(s, n):
    return s["ffn"] if n == "ffn_sub" else s["dim"]


def to_bf16(x):
    """float32 values rounded to bfloat16, returned as float32 (exact)."""
    return torch.tensor(np.asarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def bf16_bytes(x):
    """bfloat16 bit patterns (uint16) of float32 values that are bf16-exact."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    assert np.all((u & 0xFFFF) == 0), "value is not bf16-exact"
    return (u >> 16).astype(np.uint16)


# ---- tokenizer ---------------------------------------------------------------

def build_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=297, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() == 300, tok.get_vocab_size()
    return tok


def tokenizer_gguf_keys(w, tok, with_pre):
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    for a in d["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    types = [3 if t in SPECIALS else 1 for t in tokens]  # CONTROL / NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    if with_pre:
        w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[SPECIALS[0]])
    w.add_eos_token_id(vocab[SPECIALS[1]])
    if with_pre:
        w.add_eot_token_id(vocab[SPECIALS[2]])
    w.add_add_bos_token(True)


# ---- weights -------------------------------------------------------------------

def packed_model(rng):
    s = PACKED_SHAPE
    k = rng.integers(-127, 128, size=(s["vocab"], s["dim"]))
    blocks = k.reshape(-1, 32)
    blocks[np.arange(len(blocks)), rng.integers(0, 32, len(blocks))] = \
        rng.choice([-127, 127], len(blocks))
    m = {"embed": (blocks.reshape(s["vocab"], s["dim"]) * 2.0 ** -9).astype(np.float32),
         "norms": {}, "proj": {}, "lm_head": None}
    for layer in range(s["layers"]):
        for n in NORM_HF:
            m["norms"][(layer, n)] = to_bf16(rng.uniform(0.8, 1.2, norm_size(s, n)))
        for p in PROJ_HF:
            rows, cols = proj_shape(s, p)
            codes = rng.integers(-1, 2, size=(rows, cols)).astype(np.int8)
            # o and down write into the residual stream: larger scales keep the
            # tied LM head from simply repeating the last token.
            boost = 3.0 if p in ("o", "down") else 1.0
            scale = float(to_bf16(boost * rng.uniform(0.5, 1.5) / np.sqrt(cols)))
            m["proj"][(layer, p)] = (codes, scale)
    m["norms"]["out"] = to_bf16(rng.uniform(0.8, 1.2, s["dim"]))
    return m


def master_weight(rng, rows, cols):
    """bf16 master weights with no |w / mean|w|| within 0.2 % of 0.5 or 1.5."""
    w = to_bf16(rng.normal(0.0, 0.05, size=(rows, cols)))
    for _ in range(100):
        ratio = np.abs(w.astype(np.float64)) / np.abs(w.astype(np.float64)).mean()
        bad = (np.abs(ratio - 0.5) < 1e-3) | (np.abs(ratio - 1.5) < 3e-3)
        if not bad.any():
            return w
        w[bad] = to_bf16(rng.normal(0.0, 0.05, size=int(bad.sum())))
    raise RuntimeError("could not keep master weights off the rounding boundaries")


def bf16_model(rng):
    s = BF16_SHAPE
    m = {"embed": to_bf16(rng.normal(0.0, 1.0, (s["vocab"], s["dim"]))),
         "lm_head": to_bf16(rng.normal(0.0, 1.0, (s["vocab"], s["dim"]))),
         "norms": {}, "proj": {}}
    for layer in range(s["layers"]):
        for n in NORM_HF:
            m["norms"][(layer, n)] = to_bf16(rng.uniform(0.8, 1.2, norm_size(s, n)))
        for p in PROJ_HF:
            m["proj"][(layer, p)] = master_weight(rng, *proj_shape(s, p))
    m["norms"]["out"] = to_bf16(rng.uniform(0.8, 1.2, s["dim"]))
    return m



# ---- exact arithmetic: ties and a float64 reference ---------------------------
#
# Absmax quantization of an RMS-normed row gives codes round(127 * u / max|u|)
# with u = norm_weight * x: the 1/rms factor cancels. With low-precision
# inputs (bf16 or int8-valued embeddings, bf16 norm weights) that value is
# often exactly k + 0.5 on the first layer, and then fp32 rounding noise in
# transformers (and in any runtime) decides the code, differently in
# different implementations. The fixtures must not depend on such coin
# flips, so no token's first-layer activation may lie within TIE_MARGIN of a
# rounding boundary; reference() then also checks that transformers agrees
# with a float64 implementation of the same math everywhere.

TIE_MARGIN = 2e-3


def near_ties(u):
    """Elements of rows u (float64) whose code 127*u/max|u| is within
    TIE_MARGIN of a .5 rounding boundary."""
    r = 127.0 * u / np.abs(u).max(axis=-1, keepdims=True)
    frac = r - np.floor(r)
    return np.abs(frac - 0.5) < TIE_MARGIN


def remove_first_layer_ties(m, step):
    """Nudges embedding values until no token's attn_norm(x) has a near-tie;
    step(value) returns the next representable value away from zero."""
    w = m["norms"][(0, "attn")].astype(np.float64)
    for _ in range(50):
        bad = near_ties(m["embed"].astype(np.float64) * w)
        if not bad.any():
            return
        rows, cols = np.nonzero(bad)
        for r, c in zip(rows, cols):
            m["embed"][r, c] = step(m["embed"][r, c])
    raise RuntimeError("could not remove first-layer ties")


def step_q8(v):
    """k * 2^-9 -> (k -+ 1) * 2^-9, staying inside +-126 so that every
    32-block keeps its +-127 and Q8_0 stays exact."""
    k = int(round(v * 512))
    k = k - 1 if k > 0 else k + 1
    if k == 0:
        k = 2
    return np.float32(k / 512.0)


def step_bf16(v):
    """The next bf16 value toward zero."""
    u = np.array([v], dtype=np.float32).view(np.uint32)[0]
    return np.array([u - 0x10000], dtype=np.uint32).view(np.float32)[0]


def exact_forward(s, m, ids):
    """FORMATS.md section 1 in float64, codes from exact ratios: logits [T, vocab]."""
    hd = s["dim"] // s["heads"]
    group = s["heads"] // s["kv_heads"]
    T = len(ids)

    def norm_quant(x, w):
        u = x * w
        umax = np.abs(u).max(-1, keepdims=True)
        q = np.round(127.0 * u / umax)          # numpy rounds half to even
        xn = u / np.sqrt((x * x).mean(-1, keepdims=True) + s["eps"])
        return q, 127.0 / np.abs(xn).max(-1, keepdims=True)

    def proj(layer, p):
        w = m["proj"][(layer, p)]
        if isinstance(w, tuple):
            codes, scale = w
            return codes.astype(np.float64), scale
        w = w.astype(np.float64)
        scale = np.abs(w).mean()
        return np.clip(np.round(w / scale), -1, 1), scale

    def bitlinear(q, sx, layer, p):
        codes, ws = proj(layer, p)
        return (q @ codes.T) / sx * ws

    inv = 1.0 / s["theta"] ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):
        a, b = v[..., :hd // 2], v[..., hd // 2:]
        c, sn = cos[:, None], sin[:, None]
        return np.concatenate([a * c - b * sn, b * c + a * sn], -1)

    x = m["embed"][ids].astype(np.float64)
    for layer in range(s["layers"]):
        nw = lambda n: m["norms"][(layer, n)].astype(np.float64)  # noqa: E731
        q8, sx = norm_quant(x, nw("attn"))
        q = rope(bitlinear(q8, sx, layer, "q").reshape(T, s["heads"], hd))
        k = rope(bitlinear(q8, sx, layer, "k").reshape(T, s["kv_heads"], hd))
        v = bitlinear(q8, sx, layer, "v").reshape(T, s["kv_heads"], hd)
        att = np.zeros((T, s["heads"], hd))
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for h in range(s["heads"]):
            sc = q[:, h] @ k[:, h // group].T / np.sqrt(hd) + mask
            pr = np.exp(sc - sc.max(-1, keepdims=True))
            att[:, h] = (pr / pr.sum(-1, keepdims=True)) @ v[:, h // group]
        q8, sx = norm_quant(att.reshape(T, -1), nw("attn_sub"))
        x = x + bitlinear(q8, sx, layer, "o")
        q8, sx = norm_quant(x, nw("ffn"))
        h = np.maximum(bitlinear(q8, sx, layer, "gate"), 0) ** 2 * bitlinear(q8, sx, layer, "up")
        q8, sx = norm_quant(h, nw("ffn_sub"))
        x = x + bitlinear(q8, sx, layer, "down")
    xn = x / np.sqrt((x * x).mean(-1, keepdims=True) + s["eps"]) * m["norms"]["out"]
    head = m["lm_head"] if m["lm_head"] is not None else m["embed"]
    return xn @ head.astype(np.float64).T


# ---- Hugging Face directories ------------------------------------------------------

def hf_config(s, mode, tied, tok):
    v = tok.get_vocab()
    return {
        "architectures": ["BitNetForCausalLM"],
        "model_type": "bitnet",
        "bos_token_id": v[SPECIALS[0]],
        "eos_token_id": v[SPECIALS[1]],
        "hidden_act": "relu2",
        "hidden_size": s["dim"],
        "initializer_range": 0.02,
        "intermediate_size": s["ffn"],
        "max_position_embeddings": s["ctx"],
        "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"],
        "num_key_value_heads": s["kv_heads"],
        "rms_norm_eps": s["eps"],
        "rope_theta": s["theta"],
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": s["vocab"],
        "quantization_config": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                                "quantization_mode": mode},
    }


def pack_hf(codes):
    """transformers' pack_weights: row r of (rows, cols) goes to packed row
    r % (rows/4), bits 2 * (r // (rows/4)); code + 1 in 2 bits."""
    rows = codes.shape[0]
    quarter = rows // 4
    u = (codes + 1).astype(np.uint8)
    out = np.zeros((quarter, codes.shape[1]), dtype=np.uint8)
    for i in range(4):
        out |= u[i * quarter:(i + 1) * quarter] << (2 * i)
    return out


def write_hf(path, s, m, mode, tok):
    os.makedirs(path, exist_ok=True)
    t = {"model.embed_tokens.weight": bf16_bytes(m["embed"]),
         "model.norm.weight": bf16_bytes(m["norms"]["out"])}
    for layer in range(s["layers"]):
        pre = f"model.layers.{layer}."
        for n, hf in NORM_HF.items():
            t[pre + hf + ".weight"] = bf16_bytes(m["norms"][(layer, n)])
        for p, hf in PROJ_HF.items():
            if mode == "offline":
                codes, scale = m["proj"][(layer, p)]
                t[pre + hf + ".weight"] = pack_hf(codes)
                t[pre + hf + ".weight_scale"] = bf16_bytes(np.array([scale], np.float32))
            else:
                t[pre + hf + ".weight"] = bf16_bytes(m["proj"][(layer, p)])
    if m["lm_head"] is not None:
        t["lm_head.weight"] = bf16_bytes(m["lm_head"])
    # safetensors.numpy has no bf16 dtype: write uint16 then patch the header.
    tmp = os.path.join(path, "model.safetensors")
    save_file(t, tmp, metadata={"format": "pt"})
    bf16_names = {k for k, v in t.items() if v.dtype == np.uint16}
    with open(tmp, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    for k in bf16_names:
        header[k]["dtype"] = "BF16"
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(tmp, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config(s, mode, m["lm_head"] is None, tok), f, indent=2)
        f.write("\n")
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        v = tok.get_vocab()
        json.dump({"bos_token_id": v[SPECIALS[0]],
                   "eos_token_id": [v[SPECIALS[1]], v[SPECIALS[2]]],
                   "do_sample": False}, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(path, "tokenizer.json"))


# ---- GGUF files ----------------------------------------------------------------

def pack_i2s(codes, scale):
    """Microsoft I2_S (x86 layout, fmt_bitnet.c): the flat tensor in blocks of
    128; byte p of a block holds elements p, p+32, p+64, p+96 at shifts 6, 4,
    2, 0; code + 1; then a float32 scale, padded to n/4 + 32 bytes."""
    flat = (codes.reshape(-1) + 1).astype(np.uint8).reshape(-1, 4, 32)
    packed = (flat[:, 0] << 6) | (flat[:, 1] << 4) | (flat[:, 2] << 2) | flat[:, 3]
    trailer = np.zeros(32, dtype=np.uint8)
    trailer[:4] = np.frombuffer(np.float32(scale).tobytes(), dtype=np.uint8)
    return np.concatenate([packed.reshape(-1), trailer])


def write_gguf(path, s, m, tok, arch, proj_type, embd_type):
    w = gguf.GGUFWriter(path, arch)
    w.add_name("bitnet-fixture")
    w.add_vocab_size(s["vocab"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_rope_dimension_count(s["dim"] // s["heads"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_freq_base(s["theta"])
    if arch == "bitnet":  # upstream llama.cpp's converter adds these
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(1.0)
    tokenizer_gguf_keys(w, tok, with_pre=(arch == "bitnet"))

    if embd_type == "f16":
        w.add_tensor("token_embd.weight", m["embed"].astype(np.float16))
    else:
        q = gguf.quants.quantize(m["embed"], gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor("token_embd.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        assert np.array_equal(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0),
                              m["embed"]), "Q8_0 embedding is not exact"
    w.add_tensor("output_norm.weight", m["norms"]["out"].astype(np.float32))
    for layer in range(s["layers"]):
        pre = f"blk.{layer}."
        for n, g in NORM_GGUF.items():
            w.add_tensor(pre + g + ".weight", m["norms"][(layer, n)].astype(np.float32))
        for p, g in PROJ_GGUF.items():
            codes, scale = m["proj"][(layer, p)]
            if proj_type == "i2_s":
                data = pack_i2s(codes, scale).view(np.int8)  # int8: shape stays as given
                w.add_tensor(pre + g + ".weight", data, raw_shape=codes.shape, raw_dtype=I2_S)
            else:
                qt = {"tq1_0": gguf.GGMLQuantizationType.TQ1_0,
                      "tq2_0": gguf.GGMLQuantizationType.TQ2_0}[proj_type]
                values = codes.astype(np.float32) * np.float32(scale)
                q = gguf.quants.quantize(values, qt)
                assert np.array_equal(gguf.quants.dequantize(q, qt), values)
                w.add_tensor(pre + g + ".weight", q, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- the reference -------------------------------------------------------------------

def reference(path, tok, s, m):
    from transformers import BitNetForCausalLM

    torch.manual_seed(0)
    model = BitNetForCausalLM.from_pretrained(path, dtype=torch.float32,
                                              attn_implementation="eager")
    # The bitnet quantizer may keep the checkpoint's bf16; every stored value
    # is bf16-exact, so converting to float32 changes no number.
    model = torch.nn.Module.float(model).eval()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t.dtype in (torch.float32, torch.int64), (name, t.dtype)
    for text in PROMPTS:
        prompt = ([tok.token_to_id(SPECIALS[0])] + tok.encode(text).ids)[:PROMPT_LEN]
        ids = list(prompt)
        gaps = []
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0].numpy().astype(np.float32)
            # Greedy, recomputing the whole sequence each step: no cache to trust.
            for _ in range(GREEDY_STEPS):
                last = model(torch.tensor([ids])).logits[0, -1].numpy()
                top2 = np.sort(last)[-2:]
                gaps.append(float(top2[1] - top2[0]))
                ids.append(int(np.argmax(last)))
            everything = model(torch.tensor([ids])).logits[0].numpy()
        # transformers must agree with exact arithmetic at every position: a
        # larger difference means fp32 noise flipped an int8 code somewhere.
        diff = float(np.abs(exact_forward(s, m, ids) - everything).max())
        if min(gaps) >= MIN_GAP and diff < 1e-3:
            print(f"  transformers vs float64 reference: max |logit diff| {diff:.3g}",
                  file=sys.stderr)
            return text, prompt, logits, ids[len(prompt):], min(gaps)
        print(f"  prompt {text!r}: greedy gap {min(gaps):.4f}, transformers vs float64 "
              f"{diff:.3g}: next prompt", file=sys.stderr)
    raise RuntimeError("no prompt with clear greedy steps; change SEED")


def write_expect(path, text, prompt, logits, greedy, gap, tok):
    import transformers
    with open(path, "w") as f:
        f.write(f"# scripts/gen_model_fixtures.py: transformers {transformers.__version__}, "
                f"torch {torch.__version__}, float32, eager attention\n")
        f.write(f"# prompt text: {text}\n")
        ids = tok.encode(text).ids
        f.write(f"tokenized {len(ids)} " + " ".join(map(str, ids)) + "\n")
        f.write(f"prompt {len(prompt)} " + " ".join(map(str, prompt)) + "\n")
        f.write(f"greedy {len(greedy)} " + " ".join(map(str, greedy)) + "\n")
        f.write(f"min_gap {gap:.6g}\n")
        f.write(f"logits {logits.shape[0]} {logits.shape[1]}\n")
        for row in logits:
            f.write(" ".join(f"{v:.9g}" for v in row) + "\n")
        f.write(f"text {text}\n")


def main():
    torch.set_num_threads(1)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    rng = np.random.default_rng(SEED)
    tok = build_tokenizer()

    packed = packed_model(rng)
    s = PACKED_SHAPE
    remove_first_layer_ties(packed, step_q8)
    write_hf(os.path.join(OUT, "hf_packed"), s, packed, "offline", tok)
    write_gguf(os.path.join(OUT, "i2s.gguf"), s, packed, tok, "bitnet-25", "i2_s", "f16")
    write_gguf(os.path.join(OUT, "tq2_0.gguf"), s, packed, tok, "bitnet", "tq2_0", "q8_0")
    write_gguf(os.path.join(OUT, "tq1_0.gguf"), s, packed, tok, "bitnet", "tq1_0", "f16")
    text, prompt, logits, greedy, gap = reference(os.path.join(OUT, "hf_packed"), tok, s, packed)
    write_expect(os.path.join(OUT, "expect_packed.txt"), text, prompt, logits, greedy, gap, tok)
    print(f"packed: prompt {prompt}\n  greedy {greedy}\n  min gap {gap:.4f}")

    master = bf16_model(rng)
    remove_first_layer_ties(master, step_bf16)
    write_hf(os.path.join(OUT, "hf_bf16"), BF16_SHAPE, master, "online", tok)
    text, prompt, logits, greedy, gap = reference(os.path.join(OUT, "hf_bf16"), tok, BF16_SHAPE,
                                                  master)
    write_expect(os.path.join(OUT, "expect_bf16.txt"), text, prompt, logits, greedy, gap, tok)
    print(f"bf16: prompt {prompt}\n  greedy {greedy}\n  min gap {gap:.4f}")

    total = 0
    for dirpath, _, files in os.walk(OUT):
        for name in files:
            total += os.path.getsize(os.path.join(dirpath, name))
    print(f"{OUT}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
