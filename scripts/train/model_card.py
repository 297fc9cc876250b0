#!/usr/bin/env python3
"""Writes models/<name>/README.md (the model card) from train.py's
reference.json and the JSON results of `bitnet perplexity --json`.

    python3 scripts/train/model_card.py MODEL_DIR PPL.json...

Each PPL.json is named ppl-<format>-<device>.json (run.sh writes them)."""

import json
import os
import sys


def mib(path):
    return os.path.getsize(path) / (1024 * 1024)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    name = os.path.basename(os.path.normpath(out))
    ref = json.load(open(os.path.join(out, "reference.json")))
    s = ref["shape"]
    runs = []
    for path in sys.argv[2:]:
        fmt, dev = os.path.basename(path)[len("ppl-"):-len(".json")].split("-", 1)
        runs.append((fmt, dev, json.load(open(path))))
    torch_ppl = ref["test_ppl_ctx512"]

    lines = []
    add = lines.append
    add(f"# {name}")
    add("")
    add("A small BitNet b1.58 model (ternary weights, 8-bit activations) trained by this project "
        "on the King James Version of the Bible, so that `bitnet run` generates text out of the "
        "box and the tests have a model with trained weights. It writes verse-like English; it "
        "knows nothing else.")
    add("")
    add("## Files")
    add("")
    add("| file | what | size |")
    add("|---|---|---|")
    for f, what in [(f"{name}-i2_s.gguf", "GGUF, I2_S projections (bitnet.cpp's format), F16 "
                     "embedding; the default model of `bitnet run`"),
                    (f"{name}-tq2_0.gguf", "GGUF, TQ2_0 projections (llama.cpp's), F16 "
                     "embedding"),
                    ("hf/", "Hugging Face `BitNetForCausalLM` checkpoint, offline packed "
                     "(uint8 codes + bf16 `weight_scale`), tokenizer.json"),
                    ("test.txt", "the held-out test text"),
                    ("reference.json", "the training run's record: shape, loss curve, "
                     "PyTorch's held-out perplexity, greedy continuations")]:
        p = os.path.join(out, f)
        size = (sum(mib(os.path.join(p, x)) for x in os.listdir(p)) if os.path.isdir(p)
                else mib(p))
        add(f"| `{f}` | {what} | {size:.2f} MiB |")
    add("")
    add("## Model")
    add("")
    hd = s["dim"] // s["heads"]
    add(f"BitNet b1.58 as in docs/FORMATS.md section 1 (the 2B-4T architecture at a small size): "
        f"{s['layers']} layers, hidden {s['dim']}, FFN {s['ffn']} (gated squared ReLU), "
        f"{s['heads']} heads / {s['kv_heads']} KV heads (head dim {hd}), rotate-half RoPE "
        f"(theta {s['theta']:g}) over the whole head, RMSNorm eps {s['eps']:g} with the "
        f"attention and FFN sub-norms, tied embeddings, vocabulary {s['vocab']}, "
        f"context {s['ctx']}. {ref['parameters'] / 1e6:.2f} M parameters "
        f"({ref['parameters']:,}).")
    add("")
    add("Tokenizer: byte-level BPE with the LLaMA-3 pre-tokenizer, trained on the training "
        "split with the `tokenizers` package; `<|begin_of_text|>` (BOS, added in front of "
        "every text), `<|end_of_text|>`, `<|eot_id|>`.")
    add("")
    add("## Data")
    add("")
    add("The King James Version of the Bible (1611), whose text is in the public domain, as "
        "Debian packages it: `bible-kjv-text` (the text) printed by `bible-kjv`'s program "
        "(scripts/train/fetch_corpus.sh); the package's copyright file states \"The copyright "
        "for the King James Version text of the Bible is expired\". Chapters (heading, blank "
        "line, one verse per line) are split by index: index % 20 == 10 is the held-out test "
        "set (test.txt), index % 20 == 15 the validation set (picks the checkpoint), the rest "
        "the training set.")
    add("")
    add("| split | bytes | tokens |")
    add("|---|---|---|")
    for k in ("train", "valid", "test"):
        add(f"| {k} | {ref['bytes'][k]:,} | {ref['tokens'][k]:,} |")
    add("")
    add("## Training")
    add("")
    add(f"Quantization-aware training (scripts/train/train.py): every projection sees "
        f"absmean-ternary weights and per-token absmax int8 activations through a "
        f"straight-through estimator; AdamW (lr {ref['lr']:g}, betas 0.9/0.95, weight decay "
        f"0.05 on matrices), warm-up then cosine to a tenth, batch {ref['batch']} x "
        f"{ref['ctx']} tokens (each window after a BOS), dropout {ref['dropout']:g} on the "
        f"residual branches, seed {ref['seed']}. {ref['steps_run']} steps in "
        f"{ref['train_seconds']:.0f} s on one {ref['device_name']} (PyTorch {ref['torch']}); "
        f"the checkpoint kept is step {ref['step_kept']}, the lowest validation loss.")
    add("")
    add("| step | train loss | validation loss |")
    add("|---|---|---|")
    for h in ref["history"]:
        mark = " (kept)" if h["step"] == ref["step_kept"] else ""
        add(f"| {h['step']}{mark} | {h['train_loss']:.4f} | {h['valid_loss']:.4f} |")
    add("")
    add("Reproduce (needs Debian's apt for the corpus and a CUDA GPU for training in minutes): "
        "build bitnet, then `scripts/train/run.sh`, which fetches the corpus, trains, exports, "
        "converts with `bitnet convert`, measures with `bitnet perplexity` and writes this card. "
        "GPU training is not bit-reproducible, so a rerun gives a model of the same quality, "
        "not the same bytes.")
    add("")
    add("## Held-out perplexity")
    add("")
    add(f"Over test.txt ({ref['tokens']['test']:,} tokens), chunks of 512 positions (BOS + 511 "
        "tokens, every token predicted; `bitnet perplexity`'s rule):")
    add("")
    add("| computed by | perplexity | vs PyTorch |")
    add("|---|---|---|")
    add(f"| PyTorch, float64 forward of the exported model (train.py) | {torch_ppl:.4f} | |")
    tf = ref.get("transformers")
    if tf:
        add(f"| transformers `BitNetForCausalLM`, float32, loading hf/ | {tf['test_ppl']:.4f} | "
            f"{100 * (tf['test_ppl'] / torch_ppl - 1):+.3f} % |")
    for fmt, dev, r in runs:
        add(f"| `bitnet perplexity`, {fmt}, {dev} ({r['device']}) | {r['perplexity']:.4f} | "
            f"{100 * (r['perplexity'] / torch_ppl - 1):+.3f} % |")
    add("")
    add(f"At 128 positions per chunk PyTorch gives {ref['test_ppl_ctx128']:.4f}.")
    add("")
    add("## Greedy continuations")
    add("")
    add("Recorded from PyTorch's float64 forward at training time; tests/test_default_model.c "
        "checks that bitnet generates the same tokens (only prompts whose top-1/top-2 logit gap "
        "stays above 0.02 along the way are recorded).")
    add("")
    for g in ref["greedy"]:
        text = (g["prompt"] + g["text"]).replace("\n", " / ")
        add(f"- {text} (prompt: \"{g['prompt']}\")")
    add("")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))
    print(f"model_card: wrote {os.path.join(out, 'README.md')}")


if __name__ == "__main__":
    main()
