#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (fuzz/corpus/<target>/) from the committed
test fixtures in tests/data, so that fuzzing starts from real files of every
flavour instead of from nothing. Standard library only; deterministic, so a
rerun reproduces every file byte for byte.

    python3 fuzz/make_corpus.py            (from the repository root)

Seeds are kept small (the whole corpus stays well under 2 MB): libFuzzer
mutates small files faster, and the fixtures' bulk is tensor data that no
parser branches on.
"""
import glob
import json
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
OUT = os.path.join(ROOT, "fuzz", "corpus")


def put(target, name, data):
    path = os.path.join(OUT, target, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def copy(target, src, name=None):
    with open(os.path.join(DATA, src), "rb") as f:
        put(target, name or os.path.basename(src), f.read())


def compact_json(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


# ---- GGUF: a minimal reader/writer for shrinking the model fixtures ------

GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)
        self.p += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take("<Q")
        s = self.d[self.p:self.p + n]
        self.p += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(GGUF_SCALAR[t])


def gguf_read(data):
    r = Reader(data)
    assert r.take("<I") == 0x46554747 and r.take("<I") == 3
    n_t, n_kv = r.take("<Q"), r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        k = r.string()
        t = r.take("<I")
        kvs.append((k, t, r.value(t)))
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.take("<I")
        ne = [r.take("<Q") for _ in range(nd)]
        infos.append((name, ne, r.take("<I"), r.take("<Q")))
    align = 32
    start = (r.p + align - 1) // align * align
    ends = sorted(o for _, _, _, o in infos)[1:] + [len(data) - start]
    by_off = sorted(infos, key=lambda i: i[3])
    tensors = {}
    for (name, ne, t, off), end in zip(by_off, ends):
        tensors[name] = (ne, t, data[start + off:start + end])
    return kvs, [(i[0],) + tensors[i[0]] for i in infos]


def gguf_value(t, v):
    if t == 8:
        return struct.pack("<Q", len(v)) + v
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)
    return struct.pack(GGUF_SCALAR[t], v)


def gguf_write(kvs, tensors, align=32):
    out = [struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs))]
    for k, t, v in kvs:
        out.append(gguf_value(8, k) + struct.pack("<I", t) + gguf_value(t, v))
    off, blobs = 0, []
    for name, ne, t, blob in tensors:
        out.append(gguf_value(8, name) + struct.pack("<I", len(ne)) +
                   b"".join(struct.pack("<Q", x) for x in ne) + struct.pack("<IQ", t, off))
        pad = (-len(blob)) % align
        blobs.append(blob + b"\0" * pad)
        off += len(blob) + pad
    head = b"".join(out)
    head += b"\0" * ((-len(head)) % align)
    return head + b"".join(blobs)


def shrink_model(src):
    """The model with one layer and a 16-token vocabulary (embedding cut to
    16 rows, tokenizer cut to match): every tensor kind and encoding of the
    original in about a third of the bytes."""
    with open(os.path.join(DATA, src), "rb") as f:
        kvs, tensors = gguf_read(f.read())
    vocab = 16
    new_kvs = []
    for k, t, v in kvs:
        if k.endswith(b".block_count"):
            v = 1
        elif k.endswith(b".vocab_size"):
            v = vocab
        elif k in (b"tokenizer.ggml.tokens", b"tokenizer.ggml.token_type"):
            v = (v[0], v[1][:vocab])
        elif k == b"tokenizer.ggml.merges":
            v = (v[0], [])
        elif k.endswith(b"_token_id"):
            continue  # the special tokens are past the cut
        new_kvs.append((k, t, v))
    new_t = []
    for name, ne, t, blob in tensors:
        if name.startswith(b"blk.1."):
            continue
        if name == b"token_embd.weight":
            row = {1: ne[0] * 2, 8: ne[0] // 32 * 34}[t]  # F16 or Q8_0 rows
            blob = blob[:row * vocab]
            ne = [ne[0], vocab]
        new_t.append((name, ne, t, blob))
    return gguf_write(new_kvs, new_t)


def one_layer(src, tokenizer=True, n_ctx=None):
    """The model cut to its first layer, for fuzz_engine, which runs it:
    the whole vocabulary and tokenizer are kept (a text prompt needs every
    byte token), or with tokenizer=False dropped (token ids only); n_ctx
    replaces the training context."""
    with open(os.path.join(DATA, src), "rb") as f:
        kvs, tensors = gguf_read(f.read())
    new_kvs = []
    for k, t, v in kvs:
        if k.startswith(b"tokenizer.") and not tokenizer:
            continue
        if k.endswith(b".block_count"):
            v = 1
        elif k.endswith(b".context_length") and n_ctx is not None:
            v = n_ctx
        new_kvs.append((k, t, v))
    return gguf_write(new_kvs, [x for x in tensors if not x[0].startswith(b"blk.1.")])


# ---- per target ------------------------------------------------------------

def gguf():
    for f in ("gguf/fixture.gguf", "gguf/align64.gguf", "tokenizer/spm.gguf",
              "tokenizer/bpe_nopre.gguf"):
        copy("gguf", f)


def safetensors():
    for f in sorted(glob.glob(os.path.join(DATA, "hf", "**", "*.safetensors"), recursive=True)):
        rel = os.path.relpath(f, DATA)
        if os.path.getsize(f) <= 64 * 1024:
            copy("safetensors", rel, rel.replace(os.sep, "_"))


def hf_config():
    for f in sorted(glob.glob(os.path.join(DATA, "hf", "configs", "*.json"))):
        copy("hf_config", os.path.relpath(f, DATA))
    for d in ("models/hf_packed", "models/hf_bf16", "hf/tiny"):
        copy("hf_config", d + "/config.json", d.replace("/", "_") + "_config.json")


def tokenizer_json():
    copy("tokenizer_json", "models/hf_packed/tokenizer.json", "small_pairs.json")
    with open(os.path.join(DATA, "models/hf_packed/tokenizer.json")) as f:
        tok = json.load(f)
    # The same with "A B" string merges and TemplateProcessing (BOS).
    legacy = json.loads(json.dumps(tok))
    legacy["model"]["merges"] = [" ".join(m) for m in legacy["model"]["merges"]]
    legacy["model"]["ignore_merges"] = False
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    legacy["post_processor"] = {"type": "TemplateProcessing",
                                "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}]}
    legacy["added_tokens"].append({"id": 300, "content": "<|tool|>", "special": False})
    put("tokenizer_json", "small_legacy.json", compact_json(legacy))
    # GPT-2 style: a ByteLevel pre-tokenizer with its own regex, no Split.
    gpt2 = json.loads(json.dumps(tok))
    gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False,
                             "trim_offsets": True, "use_regex": True}
    put("tokenizer_json", "small_gpt2.json", compact_json(gpt2))
    # The project's trained BPE, cut to its first 300 merges (and the
    # vocabulary entries those and the bytes need).
    with open(os.path.join(DATA, "tokenizer/bpe.json")) as f:
        big = json.load(f)
    merges = big["model"]["merges"][:300]
    keep = set(list(big["model"]["vocab"])[:256])
    for a, b in merges:
        keep.update((a, b, a + b))
    big["model"]["vocab"] = {k: v for k, v in big["model"]["vocab"].items() if k in keep}
    big["model"]["merges"] = merges
    put("tokenizer_json", "bpe_300.json", compact_json(big))


def tokenizer():
    # flags byte: bit 0 tokenizer (0 bpe.json, 1 spm.gguf), bit 1 add_bos,
    # bit 2 parse_special; each text once per tokenizer, flags varied.
    texts = []
    with open(os.path.join(DATA, "tokenizer/bpe_refs.json"), encoding="utf-8") as f:
        texts += [e["text"] for e in json.load(f)["ignore_merges"]]
    with open(os.path.join(DATA, "tokenizer/corpus.txt"), encoding="utf-8") as f:
        lines = [l for l in f.read().split("\n") if l.strip()]
    texts += lines[::max(1, len(lines) // 40)][:40]
    seen = set()
    for i, text in enumerate(texts):
        raw = text.encode("utf-8")[:512]
        if raw in seen:
            continue
        seen.add(raw)
        for tok in (0, 1):
            flags = tok | ((i % 4) << 1)
            put("tokenizer", "t%03d_%d" % (i, tok), bytes([flags]) + raw)
    put("tokenizer", "invalid_utf8", b"\x00" + b"ok \xff\xfe \xc3 \xe2\x96 <|eot_id|>\x00end")
    put("tokenizer", "invalid_utf8_spm", b"\x05" + b"ok \xff\xfe \xc3 \xe2\x96 <|tool|>\x00end")


def model_gguf():
    for f in ("i2s.gguf", "tq1_0.gguf", "tq2_0.gguf"):
        put("model_gguf", "small_" + f, shrink_model("models/" + f))


def engine():
    put("engine", "i2s_1layer.gguf", one_layer("models/i2s.gguf"))
    put("engine", "tq2_0_1layer.gguf", one_layer("models/tq2_0.gguf"))
    put("engine", "tq1_0_1layer_ids_ctx8.gguf",
        one_layer("models/tq1_0.gguf", tokenizer=False, n_ctx=8))


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    for make in (gguf, safetensors, hf_config, tokenizer_json, tokenizer, model_gguf, engine):
        make()
    total = sum(os.path.getsize(f) for f in glob.glob(os.path.join(OUT, "*", "*")))
    print("fuzz corpus: %d files, %d bytes in %s" %
          (len(glob.glob(os.path.join(OUT, "*", "*"))), total, os.path.relpath(OUT, ROOT)))
    if total > 2 * 1024 * 1024:
        sys.exit("fuzz corpus is larger than 2 MB")


if __name__ == "__main__":
    main()
