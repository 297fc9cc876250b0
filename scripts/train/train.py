#!/usr/bin/env python3
"""Trains the small BitNet b1.58 model that bitnet ships as its default.

    python3 scripts/train/train.py --corpus kjv.txt --out OUT_DIR [--minutes M]

(scripts/train/run.sh runs this between fetching the corpus and converting
the result; see models/README.md.)

Steps, all seeded:
  1. corpus: the King James Bible as scripts/train/fetch_corpus.sh prints it,
     turned into chapters ("Genesis 1", blank line, one verse per line) and
     split by chapter: every 20th chapter (index % 20 == 10) is the held-out
     test set, the chapters with index % 20 == 15 the validation set (used to
     pick the checkpoint), the rest the training set.
  2. tokenizer: byte-level BPE with the LLaMA-3 pre-tokenizer regex, 4093
     merges' worth of tokens + <|begin_of_text|> <|end_of_text|> <|eot_id|>
     (4096 in all), trained on the training set with `tokenizers`.
  3. model: BitNet b1.58 exactly as FORMATS.md section 1 (pre-norm blocks,
     attn_sub_norm before Wo, ffn_sub_norm before Wdown, relu(gate)^2 * up,
     rotate-half RoPE over the whole head, GQA, tied embeddings), trained
     with quantization in the loop: every projection sees absmean-ternary
     weights and per-token absmax int8 activations through a
     straight-through estimator.
  4. export: a Hugging Face BitNetForCausalLM directory in the offline
     packed form (uint8 codes, 4 per byte, + bf16 weight_scale; bf16
     embeddings and norms), i.e. what microsoft/bitnet-b1.58-2B-4T ships.
  5. reference.json: computed from the exported numbers in float64 (so no
     int8 code is decided by rounding noise): held-out perplexity under the
     chunking rule of `bitnet perplexity`, and greedy continuations of a few
     prompts with their smallest top-1/top-2 logit gap. When transformers is
     importable, its BitNetForCausalLM loads the export and its logits are
     compared with the float64 forward (recorded in reference.json).
"""

import argparse
import json
import math
import os
import random
import re
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

SEED = 1611
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
VOCAB = 4096

# The shape. Every input dimension (dim, ffn) is a multiple of 256 so that
# TQ2_0 and TQ1_0 (256-element blocks) and I2_S (128) can hold every
# projection.
SHAPE = dict(vocab=VOCAB, dim=256, ffn=768, layers=8, heads=4, kv_heads=2, ctx=512,
             eps=1e-5, theta=10000.0)

PROMPTS = [
    "In the beginning",
    "And it came to pass",
    "The LORD is my shepherd",
    "And Jesus said unto them",
    "Blessed are the",
    "And God said",
    "Then the king",
    "For God so loved",
]
GREEDY_STEPS = 32
MIN_GAP = 0.02  # prompts whose greedy path has a closer top-1/top-2 call are not recorded

PROJS = ["q", "k", "v", "o", "gate", "up", "down"]
PROJ_HF = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
           "down": "mlp.down_proj"}
NORM_HF = {"attn": "input_layernorm", "attn_sub": "self_attn.attn_sub_norm",
           "ffn": "post_attention_layernorm", "ffn_sub": "mlp.ffn_sub_norm"}


def log(*a):
    print(*a, flush=True)


# ---- corpus ----------------------------------------------------------------------

VERSE = re.compile(r"^  (\d+) (.*)$")


def read_chapters(path):
    """[(heading, [verse text, ...]), ...] from the bible program's output."""
    chapters = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            m = VERSE.match(line)
            if m:
                chapters[-1][1].append(m.group(2).strip())
            else:
                chapters.append((line.strip(), []))
    if len(chapters) != 1189 or sum(len(v) for _, v in chapters) != 31102:
        sys.exit(f"train: {path}: expected 1189 chapters and 31102 verses")
    return chapters


def chapter_text(ch):
    heading, verses = ch
    return heading + "\n\n" + "\n".join(verses) + "\n"


def split_corpus(chapters):
    parts = {"train": [], "valid": [], "test": []}
    for i, ch in enumerate(chapters):
        part = "test" if i % 20 == 10 else "valid" if i % 20 == 15 else "train"
        parts[part].append(chapter_text(ch))
    return {k: "\n".join(v) for k, v in parts.items()}


# ---- tokenizer -------------------------------------------------------------------

def train_tokenizer(text):
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers,
                            processors, trainers)

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    # As LLaMA-3's tokenizer.json: a text starts with BOS (the model is
    # trained on BOS-led sequences), which also tells runtimes to add it.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[0]} $A", pair=f"{SPECIALS[0]} $A {SPECIALS[0]} $B",
        special_tokens=[(SPECIALS[0], tok.token_to_id(SPECIALS[0]))])
    if tok.get_vocab_size() != VOCAB:
        sys.exit(f"train: tokenizer has {tok.get_vocab_size()} tokens, expected {VOCAB}")
    return tok


# ---- the model -----------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def quant_act(x):
    """Per-token absmax int8: codes and the scale s (x ~ codes / s)."""
    s = 127.0 / x.abs().amax(-1, keepdim=True).clamp(min=1e-5)
    return (x * s).round().clamp(-128, 127), s


def exact_quant(x, w, xn):
    """The runtime's rule (float64): RMSNorm's 1/rms cancels from absmax
    codes, so code = round(127 * (w x) / max|w x|), computed in that order
    (the CPU backend's norm_quantize_row); the scale is 127 / max|normed x|.
    On the first layer bf16 embeddings make exact .5 ties common, and this
    order decides them as the runtime does."""
    u = w * x
    codes = torch.round(127.0 * (u / u.abs().amax(-1, keepdim=True)))
    return codes, 127.0 / xn.abs().amax(-1, keepdim=True)


def ste_act(x):
    q, s = quant_act(x)
    return x + (q / s - x).detach()


def ternary(w):
    """Absmean ternary codes and the scale (w ~ codes * scale)."""
    scale = w.abs().mean().clamp(min=1e-5)
    return (w / scale).round().clamp(-1, 1), scale


def ste_weight(w):
    codes, scale = ternary(w)
    return w + (codes * scale - w).detach()


def rope_tables(s, T, dtype, device):
    hd = s["dim"] // s["heads"]
    inv = 1.0 / s["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64, device=device) / hd)
    ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv[None]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rope(v, cos, sin):
    """Rotate-half over the whole head: v [B, H, T, hd]."""
    half = v.shape[-1] // 2
    a, b = v[..., :half], v[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def init_params(s, gen):
    def normal(*shape, std):
        return (torch.randn(*shape, generator=gen) * std).requires_grad_()

    hd = s["dim"] // s["heads"]
    shapes = {"q": (s["heads"] * hd, s["dim"]), "k": (s["kv_heads"] * hd, s["dim"]),
              "v": (s["kv_heads"] * hd, s["dim"]), "o": (s["dim"], s["heads"] * hd),
              "gate": (s["ffn"], s["dim"]), "up": (s["ffn"], s["dim"]),
              "down": (s["dim"], s["ffn"])}
    p = {"embed": normal(s["vocab"], s["dim"], std=0.02), "norm": torch.ones(s["dim"])}
    for layer in range(s["layers"]):
        for n in NORM_HF:
            p[f"{layer}.{n}"] = torch.ones(s["ffn"] if n == "ffn_sub" else s["dim"])
        for name, shape in shapes.items():
            p[f"{layer}.{name}"] = normal(*shape, std=shape[1] ** -0.5)
    for t in p.values():
        t.requires_grad_()
    return p


def forward(s, p, ids, mode, dropout=0.0):
    """Logits [B, T, vocab] for token ids [B, T].

    mode "train": float32, quantization through the straight-through
    estimator. Modes "exact" and "plain": p holds the exported model (codes +
    scales); activations are quantized with the runtime's rule (exact_quant)
    or with transformers' (quant_act on the normed values). Run them in
    float64."""
    B, T = ids.shape
    hd = s["dim"] // s["heads"]
    group = s["heads"] // s["kv_heads"]
    x = p["embed"][ids]
    cos, sin = rope_tables(s, T, x.dtype, x.device)

    def bitlinear(x, norm, layer, names):
        """RMSNorm with weight `norm`, then the projections `names`."""
        xn = rms_norm(x, p[f"{layer}.{norm}"], s["eps"])
        if mode == "train":
            xq = ste_act(xn)
            return [F.linear(xq, ste_weight(p[f"{layer}.{n}"])) for n in names]
        if mode == "exact":
            q, sx = exact_quant(x, p[f"{layer}.{norm}"], xn)
        else:
            q, sx = quant_act(xn)
        return [F.linear(q, p[f"{layer}.{n}.codes"]) / sx * p[f"{layer}.{n}.scale"]
                for n in names]

    for layer in range(s["layers"]):
        q, k, v = bitlinear(x, "attn", layer, ["q", "k", "v"])
        q = rope(q.view(B, T, s["heads"], hd).transpose(1, 2), cos, sin)
        k = rope(k.view(B, T, s["kv_heads"], hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, s["kv_heads"], hd).transpose(1, 2)
        k = k.repeat_interleave(group, dim=1)  # head h reads kv head h // group
        v = v.repeat_interleave(group, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = att.transpose(1, 2).reshape(B, T, s["heads"] * hd)
        (o,) = bitlinear(att, "attn_sub", layer, ["o"])
        x = x + F.dropout(o, dropout, training=dropout > 0)
        gate, up = bitlinear(x, "ffn", layer, ["gate", "up"])
        h = F.relu(gate) ** 2 * up
        (d,) = bitlinear(h, "ffn_sub", layer, ["down"])
        x = x + F.dropout(d, dropout, training=dropout > 0)
    return rms_norm(x, p["norm"], s["eps"]) @ p["embed"].T


# ---- data ------------------------------------------------------------------------------

def batches(stream, bos, T, batch, gen, device):
    """Random windows of T - 1 tokens, each after a BOS (as a prompt starts)."""
    n = len(stream) - (T - 1)
    while True:
        starts = torch.randint(0, n, (batch,), generator=gen)
        rows = torch.stack([stream[i:i + T] for i in starts.tolist()])
        ids = torch.cat([torch.full((batch, 1), bos, dtype=torch.long), rows[:, :T - 1]], 1)
        yield ids.to(device), rows[:, :T].to(device)


def chunks(stream, bos, ctx):
    """The chunking rule of `bitnet perplexity`: consecutive pieces of
    ctx - 1 tokens (the last may be shorter), each run as [BOS] + piece,
    every token of the piece predicted."""
    out = []
    for i in range(0, len(stream), ctx - 1):
        piece = stream[i:i + ctx - 1]
        out.append((torch.cat([torch.tensor([bos]), piece]), piece))
    return out


def mean_nll(s, p, pieces, mode, device, dtype):
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, target in pieces:
            logits = forward(s, p, ids[None, :len(target)].to(device), mode)
            lp = torch.log_softmax(logits.to(dtype)[0], -1)
            total += -lp.gather(1, target.to(device)[:, None]).sum().item()
            count += len(target)
    return total / count, count


# ---- export --------------------------------------------------------------------------

def bf16(t):
    return t.detach().float().cpu().to(torch.bfloat16)


def export_tensors(s, p):
    """The exported model: ternary codes + bf16 scales, bf16 embeddings and norms."""
    e = {"embed": bf16(p["embed"]), "norm": bf16(p["norm"])}
    for layer in range(s["layers"]):
        for n in NORM_HF:
            e[f"{layer}.{n}"] = bf16(p[f"{layer}.{n}"])
        for n in PROJS:
            codes, scale = ternary(p[f"{layer}.{n}"].detach().float().cpu())
            e[f"{layer}.{n}.codes"] = codes.to(torch.int8)
            e[f"{layer}.{n}.scale"] = bf16(scale.reshape(1))
    return e


def exact_params(e, device):
    return {k: v.to(device=device, dtype=torch.float64) for k, v in e.items()}


def pack_hf(codes):
    """transformers' pack_weights: row r goes to packed row r % (rows / 4),
    bits 2 * (r // (rows / 4)); code + 1 in 2 bits."""
    rows = codes.shape[0]
    quarter = rows // 4
    u = (codes.to(torch.int16) + 1).to(torch.uint8)
    out = torch.zeros((quarter, codes.shape[1]), dtype=torch.uint8)
    for i in range(4):
        out |= u[i * quarter:(i + 1) * quarter] << (2 * i)
    return out


def write_hf(path, s, e, tok, steps):
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    t = {"model.embed_tokens.weight": e["embed"], "model.norm.weight": e["norm"]}
    for layer in range(s["layers"]):
        pre = f"model.layers.{layer}."
        for n, hf in NORM_HF.items():
            t[pre + hf + ".weight"] = e[f"{layer}.{n}"]
        for n, hf in PROJ_HF.items():
            t[pre + hf + ".weight"] = pack_hf(e[f"{layer}.{n}.codes"])
            t[pre + hf + ".weight_scale"] = e[f"{layer}.{n}.scale"]
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    v = tok.get_vocab()
    config = {
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
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": s["vocab"],
        "quantization_config": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                                "quantization_mode": "offline"},
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": v[SPECIALS[0]],
                   "eos_token_id": [v[SPECIALS[1]], v[SPECIALS[2]]],
                   "do_sample": False}, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(path, "tokenizer.json"))


def greedy(s, pe, prompt_ids, steps, device):
    """float64 greedy continuation (lowest id on ties) and the smallest
    top-1/top-2 logit gap along it."""
    ids = list(prompt_ids)
    gaps = []
    with torch.no_grad():
        for _ in range(steps):
            logits = forward(s, pe, torch.tensor([ids], device=device), "exact")[0, -1]
            top = torch.topk(logits, 2)
            gaps.append((top.values[0] - top.values[1]).item())
            ids.append(int(torch.argmax(logits).item()))
    return ids[len(prompt_ids):], min(gaps)


def check_transformers(hf_dir, s, pe, pieces, device):
    """Loads the export with transformers' BitNetForCausalLM (float32, eager
    attention) and returns its held-out perplexity over `pieces` and, on the
    first piece, its largest logit difference from the float64 forward
    relative to the largest |logit|, for transformers' own activation
    rounding ("plain") and the runtime's ("exact"). transformers computes
    norms and RoPE in float32, so .5 ties of the int8 codes fall either way
    and single logits differ by ~1e-3; the perplexity shows the files mean
    the same model to it. None when transformers is not importable."""
    try:
        from transformers import BitNetForCausalLM
    except Exception as ex:  # noqa: BLE001 - any import failure means "not available"
        log(f"transformers not available ({ex}); skipping its check")
        return None
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    model = BitNetForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                              attn_implementation="eager")
    model = torch.nn.Module.float(model).eval().to(device)
    out = {}
    total, count = 0.0, 0
    with torch.no_grad():
        for i, (ids, target) in enumerate(pieces):
            ids = ids[None, :len(target)].to(device)
            got = model(ids).logits[0].double()
            if i == 0:
                for mode in ("plain", "exact"):
                    ref = forward(s, pe, ids, mode)[0]
                    out[f"logit_rel_diff_{mode}"] = \
                        ((got - ref).abs().max() / ref.abs().max()).item()
            lp = torch.log_softmax(got, -1)
            total += -lp.gather(1, target.to(device)[:, None]).sum().item()
            count += len(target)
    out["test_ppl"] = math.exp(total / count)
    return out


# ---- main ------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="fetch_corpus.sh's output")
    ap.add_argument("--out", required=True, help="folder for the model files")
    ap.add_argument("--steps", type=int, default=1200, help="training steps at most")
    ap.add_argument("--minutes", type=float, default=6.0, help="training time at most")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="a tiny smoke run (CPU is fine)")
    args = ap.parse_args()

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    s = dict(SHAPE)
    if args.quick:
        s.update(layers=2, ctx=64)
        args.batch, args.steps, args.eval_every = 4, 20, 10
    t0 = time.time()

    os.makedirs(args.out, exist_ok=True)
    text = split_corpus(read_chapters(args.corpus))
    for part, body in text.items():
        with open(os.path.join(args.out, f"{part}.txt"), "w", encoding="utf-8") as f:
            f.write(body)
    tok = train_tokenizer(text["train"])
    bos = tok.token_to_id(SPECIALS[0])
    streams = {k: torch.tensor(tok.encode(v, add_special_tokens=False).ids, dtype=torch.long)
               for k, v in text.items()}
    log("corpus: " + ", ".join(f"{k} {len(text[k])} bytes / {len(v)} tokens"
                                 for k, v in streams.items()) + f" ({time.time() - t0:.1f} s)")

    gen = torch.Generator().manual_seed(SEED)
    p = init_params(s, gen)
    p = {k: v.detach().to(device).requires_grad_() for k, v in p.items()}
    n_params = sum(v.numel() for v in p.values())
    log(f"model: {n_params / 1e6:.2f} M parameters, shape {s}, device {device}")
    decay = [v for k, v in p.items() if v.dim() == 2]
    no_decay = [v for k, v in p.items() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 30)

    def lr_at(step, elapsed):
        """Linear warm-up, then a cosine down to a tenth, over the steps or
        the time limit, whichever runs out first."""
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = max((step - warmup) / max(1, args.steps - warmup), elapsed / (args.minutes * 60))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    T = s["ctx"]
    data = batches(streams["train"], bos, T, args.batch, gen, device)
    valid = chunks(streams["valid"], bos, T)
    if args.quick:
        valid = valid[:2]
    best = (float("inf"), -1, None)
    history = []
    t_train = time.time()
    step = 0
    while step < args.steps and time.time() - t_train < args.minutes * 60:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, time.time() - t_train)
        ids, target = next(data)
        logits = forward(s, p, ids, "train", dropout=args.dropout)
        loss = F.cross_entropy(logits.reshape(-1, s["vocab"]), target.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0 or step == args.steps:
            vl, _ = mean_nll(s, p, valid, "train", device, torch.float32)
            history.append({"step": step, "train_loss": round(loss.item(), 4),
                            "valid_loss": round(vl, 4), "seconds": round(time.time() - t_train, 1)})
            log(f"step {step}: train loss {loss.item():.4f}, valid loss {vl:.4f} "
                f"(ppl {math.exp(vl):.2f}), {time.time() - t_train:.0f} s")
            if vl < best[0]:
                best = (vl, step, {k: v.detach().clone() for k, v in p.items()})
    train_seconds = time.time() - t_train
    if best[2] is None:
        sys.exit("train: no evaluation ran (time limit too short)")
    log(f"trained {step} steps in {train_seconds:.0f} s; keeping step {best[1]} "
        f"(valid loss {best[0]:.4f})")

    e = export_tensors(s, best[2])
    hf_dir = os.path.join(args.out, "hf")
    write_hf(hf_dir, s, e, tok, best[1])
    pe = exact_params(e, device)

    ref = {"shape": s, "parameters": n_params, "seed": SEED, "device": device,
           "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "torch": torch.__version__, "steps_run": step, "step_kept": best[1],
           "train_seconds": round(train_seconds, 1), "batch": args.batch, "ctx": T,
           "lr": args.lr, "dropout": args.dropout, "history": history,
           "tokens": {k: len(v) for k, v in streams.items()},
           "bytes": {k: len(text[k].encode()) for k in text}}
    for ctx in sorted({T, 128}):
        pieces = chunks(streams["test"], bos, ctx)
        if args.quick:
            pieces = pieces[:2]
        nll, count = mean_nll(s, pe, pieces, "exact", device, torch.float64)
        ref[f"test_ppl_ctx{ctx}"] = math.exp(nll)
        ref[f"test_tokens_ctx{ctx}"] = count
        log(f"held-out perplexity (ctx {ctx}, {count} tokens, float64 forward): {math.exp(nll):.4f}")
    ref["greedy"] = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt).ids  # BOS + the prompt
        cont, gap = greedy(s, pe, ids, 8 if args.quick else GREEDY_STEPS, device)
        text_out = tok.decode(cont)
        log(f"greedy {prompt!r} -> {text_out!r} (smallest gap {gap:.4f})")
        if gap >= MIN_GAP:
            ref["greedy"].append({"prompt": prompt, "prompt_ids": ids, "ids": cont,
                                  "text": text_out, "min_gap": round(gap, 6)})
    pieces = chunks(streams["test"], bos, T)
    ref["transformers"] = check_transformers(hf_dir, s, pe, pieces[:2] if args.quick else pieces,
                                             device)
    log(f"transformers (ctx {T}): {ref['transformers']}")
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    log(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
