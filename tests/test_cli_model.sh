#!/usr/bin/env bash
# The model commands as a user meets them, on the committed fixtures
# (tests/data/models, written by scripts/gen_model_fixtures.py with the
# reference outputs of Hugging Face transformers):
#   - run: greedy decoding reproduces transformers' greedy tokens for every
#     file flavour, the logits after the prompt match transformers', the
#     receipt is valid JSON with the documented fields, the startup line,
#     streaming text, chat, seeds, context overflow, device requests;
#   - inspect on GGUF files, HF directories and a GGUF bitnet cannot run;
#   - convert of both HF fixtures to every --type, then run on the result
#     gives the HF source's greedy tokens and logits;
#   - bad arguments and missing files give the documented exit codes;
#   - bench e2e and bench batch --shape tiny run.
# The transformers checks run with --device cpu (the numerical reference).
# Device selection is checked for the machine at hand: without a usable
# CUDA GPU, cuda requests fail with exit code 4 naming why and auto (strict
# or not) computes on the CPU; with one (and a CUDA build), --device cuda
# reproduces the same greedy tokens and text as the CPU, auto picks it, and
# an impossible BITNET_MEMORY_LIMIT falls back to the CPU (an error under
# BITNET_STRICT_MODE=1 or --device cuda).
# usage: test_cli_model.sh /path/to/bitnet /path/to/tests/data
set -u
BITNET=${1:?usage: test_cli_model.sh BITNET DATA}
DATA=${2:?usage: test_cli_model.sh BITNET DATA}
M=$DATA/models
fails=0
checks=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! command -v python3 >/dev/null; then
    echo "FAIL: python3 is needed to read receipts and reference files"
    exit 1
fi
for f in expect_packed.txt expect_bf16.txt hf_packed hf_bf16 i2s.gguf tq2_0.gguf tq1_0.gguf; do
    if [ ! -e "$M/$f" ]; then
        echo "FAIL: fixture $M/$f is missing (scripts/gen_model_fixtures.py writes it)"
        exit 1
    fi
done

# A usable CUDA GPU that this build can compute on: 'bitnet devices' says
# "available" only for a real device that answered a CUDA build's query.
if "$BITNET" devices 2>/dev/null | grep -qE '^  cuda +available'; then
    HAVE_GPU=1
else
    HAVE_GPU=0
fi
echo "usable CUDA GPU: $([ $HAVE_GPU = 1 ] && echo yes || echo no)"

# Run with a clean BITNET_* environment plus the given assignments.
run() {
    env $(env | sed -n 's/^\(BITNET_[A-Z_]*\)=.*/-u \1/p') "$@" >"$tmp/out" 2>"$tmp/err"
    echo $? >"$tmp/rc"
}
rc() { cat "$tmp/rc"; }
fail() {
    echo "FAIL: $1"
    fails=$((fails + 1))
}
expect_rc() {
    checks=$((checks + 1))
    if [ "$(rc)" != "$1" ]; then
        fail "$2: exit code $(rc), expected $1"
        sed 's/^/  err: /' "$tmp/err" | head -20
    fi
}
expect_in() { # file pattern what
    checks=$((checks + 1))
    if ! grep -qE -- "$2" "$tmp/$1"; then
        fail "$3: '$2' not in $1"
        sed 's/^/  /' "$tmp/$1" | head -30
    fi
}
expect_not_in() {
    checks=$((checks + 1))
    if grep -qE -- "$2" "$tmp/$1"; then
        fail "$3: '$2' found in $1"
        sed 's/^/  /' "$tmp/$1" | head -30
    fi
}
# expect_py WHAT SCRIPT ARGS...: a Python check that prints a reason and
# exits non-zero on failure.
expect_py() {
    local what=$1
    shift
    checks=$((checks + 1))
    if ! python3 - "$@" >"$tmp/py" 2>&1; then
        fail "$what"
        sed 's/^/  /' "$tmp/py" | head -20
    fi
}

# ---- the reference ------------------------------------------------------------
# "prompt N id..." and "greedy N id..." lines of an expect file.
ids_of() { # file key -> comma-separated ids
    awk -v k="$2" '$1 == k { s = $3; for (i = 4; i <= NF; i++) s = s "," $i; print s }' "$1"
}
PACKED_PROMPT=$(ids_of "$M/expect_packed.txt" prompt)
PACKED_GREEDY=$(ids_of "$M/expect_packed.txt" greedy)
BF16_PROMPT=$(ids_of "$M/expect_bf16.txt" prompt)
BF16_GREEDY=$(ids_of "$M/expect_bf16.txt" greedy)
N_GREEDY=$(awk '$1 == "greedy" { print $2 }' "$M/expect_packed.txt")
N_GREEDY_BF16=$(awk '$1 == "greedy" { print $2 }' "$M/expect_bf16.txt")

# Greedy tokens of a run (from its receipt) must equal the reference.
check_greedy() { # model prompt-ids expected-ids n what [device]
    run "$BITNET" run -m "$1" --prompt-ids "$2" -n "$4" --temp 0 --receipt "$tmp/r.json" \
        --dump-logits "$tmp/logits.txt" --device "${6:-cpu}"
    expect_rc 0 "$5: run"
    expect_py "$5: greedy tokens equal the transformers reference" "$tmp/r.json" "$3" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
got = r["generation"]["token_ids"]
want = [int(x) for x in sys.argv[2].split(",")]
if got != want:
    print("got  ", got); print("want ", want); sys.exit(1)
EOF
}

# The logits after the prompt (--dump-logits) against the last prompt row of
# transformers' logits, within tol x max|logit|.
check_logits() { # expect-file tol what
    expect_py "$3: logits after the prompt match the reference" "$1" "$tmp/logits.txt" "$2" <<'EOF'
import sys
lines = open(sys.argv[1]).read().split("\n")
i = next(k for k, l in enumerate(lines) if l.startswith("logits "))
rows = int(lines[i].split()[1])
ref = [float(x) for x in lines[i + rows].split()]
got = [float(x) for x in open(sys.argv[2])]
if len(got) != len(ref):
    print("got", len(got), "logits, want", len(ref)); sys.exit(1)
scale = max(abs(x) for x in ref)
d = max(abs(a - b) for a, b in zip(ref, got))
if d > float(sys.argv[3]) * scale:
    print("max |difference| %g > %g x max|logit| %g" % (d, float(sys.argv[3]), scale)); sys.exit(1)
EOF
}

# ---- run: every fixture flavour reproduces transformers --------------------------
for f in hf_packed i2s.gguf tq2_0.gguf tq1_0.gguf; do
    check_greedy "$M/$f" "$PACKED_PROMPT" "$PACKED_GREEDY" "$N_GREEDY" "$f"
    check_logits "$M/expect_packed.txt" 1e-4 "$f"
done
check_greedy "$M/hf_bf16" "$BF16_PROMPT" "$BF16_GREEDY" "$N_GREEDY_BF16" "hf_bf16"
check_logits "$M/expect_bf16.txt" 1e-4 "hf_bf16"

# ---- run: the startup line, streaming text, the receipt --------------------------
run "$BITNET" run -m "$M/i2s.gguf" --prompt-ids "$PACKED_PROMPT" -n "$N_GREEDY" --temp 0 \
    --receipt "$tmp/r.json"
expect_rc 0 "run with a receipt"
if [ $HAVE_GPU = 1 ]; then
    expect_in err "^requested=auto detected=\[cuda,[a-z0-9,]*scalar\] selected=cuda:[0-9]+ \(.*, (graphs|no graphs), kv f32, attention merge (ticket|cluster (2|4|8|16))( with q\|k\|v)?, gemv stage (block|cluster 8)( \(gate\|up cluster 16\))?, greedy head (screened|full)\)$" \
        "one startup line on stderr"
    SELECTED=cuda
else
    expect_in err "^requested=auto detected=\[[a-z0-9,]*scalar\] selected=cpu \([a-z0-9]+, [0-9]+ threads?\)$" \
        "one startup line on stderr"
    SELECTED=cpu
fi
checks=$((checks + 1))
[ "$(grep -c '^requested=' "$tmp/err")" = 1 ] || fail "exactly one startup line"
expect_in err "^prompt +[0-9]+ tokens in .* tok/s" "prompt timing on stderr"
expect_in err "^generation +[0-9]+ tokens in .* tok/s" "generation timing on stderr"
expect_not_in out "requested=|tok/s" "stdout holds only the generated text"
checks=$((checks + 1))
python3 -m json.tool "$tmp/r.json" >/dev/null 2>&1 || fail "the receipt is not valid JSON"
expect_py "receipt fields" "$tmp/r.json" "$tmp/out" "$M/i2s.gguf" "$SELECTED" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
need = {
    "": ["bitnet_version", "command", "compute_path", "startup_line", "model", "backend",
         "prompt", "generation", "sampling", "timings", "memory"],
    "model": ["path", "architecture", "flavour", "projection_type", "hparams"],
    "model.hparams": ["vocab", "dim", "ffn", "n_layer", "n_head", "n_head_kv", "n_ctx_train"],
    "backend": ["requested", "requested_from", "detected", "selected", "kernel_provider",
                "threads", "n_ctx", "kernels"],
    "prompt": ["tokens", "token_ids"],
    "generation": ["tokens", "token_ids", "text", "stop_reason"],
    "sampling": ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "greedy"],
    "timings": ["load_seconds", "prompt_seconds", "prompt_tokens_per_second",
                "generation_seconds", "generation_tokens_per_second"],
    "memory": ["model_weight_bytes", "backend", "process_resident_bytes"],
}
bad = []
for path, keys in need.items():
    o = r
    for p in filter(None, path.split(".")):
        o = o[p]
    bad += [path + "." + k for k in keys if k not in o]
if bad:
    print("missing:", bad); sys.exit(1)
checks = [
    (r["compute_path"] == "real", "compute_path is real"),
    (r["command"] == "run", "command"),
    (r["model"]["path"] == sys.argv[3], "model path"),
    (r["model"]["architecture"] == "bitnet-25", "architecture"),
    (r["model"]["projection_type"] == "i2_s", "projection type"),
    (r["backend"]["selected"].startswith(sys.argv[4]), "selected"),
    (len(r["backend"]["kernels"]) > 0, "kernels that ran"),
    (("gpu" in r["memory"]) == (sys.argv[4] == "cuda"), "gpu memory iff on the GPU"),
    (r["backend"]["requested"] == "auto", "requested"),
    ("scalar" in r["backend"]["detected"], "detected lists the CPU providers"),
    (r["startup_line"].startswith("requested=auto"), "startup line"),
    (r["sampling"]["greedy"] is True, "greedy"),
    (r["prompt"]["tokens"] == len(r["prompt"]["token_ids"]), "prompt count"),
    (r["generation"]["tokens"] == len(r["generation"]["token_ids"]), "generation count"),
    (r["timings"]["prompt_tokens_per_second"] > 0, "prompt tok/s"),
    (r["memory"]["model_weight_bytes"] > 0 and r["memory"]["process_resident_bytes"] > 0,
     "memory"),
    # What streamed to stdout is exactly the text the receipt recorded.
    (open(sys.argv[2], "rb").read() == r["generation"]["text"].encode("utf-8"),
     "stdout equals the receipt text"),
]
wrong = [what for ok, what in checks if not ok]
if wrong:
    print("wrong:", wrong); sys.exit(1)
EOF

# A text prompt is tokenized as the reference tokenizer does (special token
# text included), and the model continues it.
# The GGUF files ask for BOS (add_bos_token); the HF tokenizer.json has no
# post-processor, so there the text names <|begin_of_text|> itself.
TEXT=$(sed -n 's/^text //p' "$M/expect_packed.txt")
TOKENIZED=$(ids_of "$M/expect_packed.txt" tokenized)
for case in "tq2_0.gguf|$TEXT" "hf_packed|<|begin_of_text|>$TEXT"; do
    run "$BITNET" run -m "$M/${case%%|*}" -p "${case#*|}" -n 4 --temp 0 --receipt "$tmp/r.json"
    expect_rc 0 "run ${case%%|*} with a text prompt"
    expect_py "${case%%|*}: text prompt tokenized like the reference" "$tmp/r.json" "$TOKENIZED" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
want = [297] + [int(x) for x in sys.argv[2].split(",")]
if r["prompt"]["token_ids"] != want:
    print("got ", r["prompt"]["token_ids"]); print("want", want); sys.exit(1)
EOF
done

# Chat format: <|begin_of_text|>System: ...<|eot_id|>User: ...<|eot_id|>Assistant:
run "$BITNET" run -m "$M/hf_packed" --chat --system "be brief" -p "hello" -n 3 --temp 0 \
    --receipt "$tmp/r.json"
expect_rc 0 "run --chat"
expect_py "chat prompt starts with BOS and holds two <|eot_id|>" "$tmp/r.json" <<'EOF'
import json, sys
ids = json.load(open(sys.argv[1]))["prompt"]["token_ids"]
if ids[0] != 297 or ids.count(299) != 2:
    print(ids); sys.exit(1)
EOF

# Seeds: sampling is reproducible with --seed, BITNET_SEED or
# BITNET_DETERMINISTIC=1 (seed 0), and the receipt says so.
gen_ids() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["generation"]["token_ids"])' "$1"; }
run "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" -n 16 --temp 1.5 --top-k 0 \
    --top-p 1 --min-p 0 --seed 7 --receipt "$tmp/s1.json"
expect_rc 0 "sampling with --seed"
run "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" -n 16 --temp 1.5 --top-k 0 \
    --top-p 1 --min-p 0 --seed 7 --receipt "$tmp/s2.json"
checks=$((checks + 1))
[ "$(gen_ids "$tmp/s1.json")" = "$(gen_ids "$tmp/s2.json")" ] || fail "--seed 7 twice gives the same tokens"
run env BITNET_DETERMINISTIC=1 "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" \
    -n 16 --temp 1.5 --receipt "$tmp/d1.json"
expect_rc 0 "BITNET_DETERMINISTIC=1"
run env BITNET_DETERMINISTIC=1 "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" \
    -n 16 --temp 1.5 --receipt "$tmp/d2.json"
checks=$((checks + 1))
[ "$(gen_ids "$tmp/d1.json")" = "$(gen_ids "$tmp/d2.json")" ] || fail "BITNET_DETERMINISTIC=1 is reproducible"
expect_py "deterministic seed recorded" "$tmp/d1.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["sampling"]
if s["seed"] != 0 or s["seed_fixed"] is not True:
    print(s); sys.exit(1)
EOF
run env BITNET_SEED=99 "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" -n 2 \
    --receipt "$tmp/e.json"
expect_py "BITNET_SEED recorded" "$tmp/e.json" <<'EOF'
import json, sys
if json.load(open(sys.argv[1]))["sampling"]["seed"] != 99: sys.exit(1)
EOF

# ---- run: several prompts from a file ------------------------------------------------
# --prompt-file runs each non-empty line as its own request with the same
# options and seed: stdout is what `run -p LINE` prints for each line, each
# followed by a newline; stderr has a line per request and a summary. (The
# three prompts run their 8 tokens: no end-of-generation cuts them short,
# so each has decode steps for the next prompt to be uploaded during.)
PF_LINES=("hello world" "In the beginning" "And God said")
printf '%s\n\n%s\r\n%s\n' "${PF_LINES[@]}" >"$tmp/prompts.txt"
: >"$tmp/pf_expect"
for line in "${PF_LINES[@]}"; do
    run "$BITNET" run -m "$M/tq2_0.gguf" -p "$line" -n 8 --temp 0 --device cpu
    expect_rc 0 "run -p '$line' (the reference for --prompt-file)"
    expect_in err "^generation +8 tokens" "-p '$line' generates all 8 tokens"
    cat "$tmp/out" >>"$tmp/pf_expect"
    printf '\n' >>"$tmp/pf_expect"
done
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -n 8 --temp 0 --device cpu
expect_rc 0 "run --prompt-file"
checks=$((checks + 1))
cmp -s "$tmp/out" "$tmp/pf_expect" ||
    fail "--prompt-file prints other text than -p for each line, each followed by a newline"
for i in 1 2 3; do
    expect_in err "^request $i/3: prompt [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tok/s\), generation 8 tokens in [0-9.]+ s \([0-9.]+ tok/s\)" \
        "--prompt-file: the line of request $i"
done
checks=$((checks + 1))
[ "$(grep -c '^request ' "$tmp/err")" = 3 ] || fail "--prompt-file: one line per request (the empty line skipped)"
expect_in err "^requests +3 in [0-9.]+ s; next prompts tokenized during generation: [0-3] of 2 \(tokenizing took [0-9.]+ ms, waited [0-9.]+ ms\)$" \
    "--prompt-file: the summary line"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file - -n 8 --temp 0 --device cpu <"$tmp/prompts.txt"
expect_rc 0 "run --prompt-file - (stdin)"
checks=$((checks + 1))
cmp -s "$tmp/out" "$tmp/pf_expect" || fail "--prompt-file - reads the prompts from stdin"
# Every request samples with the run's seed: a later line gives what it
# gives alone.
run "$BITNET" run -m "$M/tq2_0.gguf" -p "${PF_LINES[2]}" -n 8 --temp 1.5 --top-k 0 --seed 7 \
    --device cpu
expect_rc 0 "run -p, sampled (the reference for --prompt-file)"
cp "$tmp/out" "$tmp/pf_sampled"
printf '\n' >>"$tmp/pf_sampled"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -n 8 --temp 1.5 --top-k 0 \
    --seed 7 --device cpu
expect_rc 0 "run --prompt-file, sampled"
checks=$((checks + 1))
tail -c "$(wc -c <"$tmp/pf_sampled")" "$tmp/out" | cmp -s - "$tmp/pf_sampled" ||
    fail "--prompt-file: the third request samples with the run's seed as -p does"
# A request that fails stops the run with its exit code after the ones
# before it; the error names the request and its line.
printf 'hi\n%s\nhi\n' "In the beginning God created the heaven and the earth and the earth was without form" \
    >"$tmp/prompts_long.txt"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts_long.txt" -n 4 --ctx 16 --temp 0 \
    --device cpu
expect_rc 2 "--prompt-file with a prompt beyond the context"
expect_in err "^request 1/3: " "the request before the failing one ran"
expect_in err "request 2/3 \(line 2 of .*\): .*more than the context of 16" \
    "the failing request and its line are named"
expect_not_in err "^request 3/3" "nothing runs after the failing request"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -p hi
expect_rc 2 "--prompt-file with -p"
expect_in err "one of -p, --prompt-ids or --prompt-file" "--prompt-file with -p says why"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" --prompt-ids 1,2
expect_rc 2 "--prompt-file with --prompt-ids"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/no-such-prompts.txt"
expect_rc 5 "--prompt-file naming a missing file"
expect_in err "cannot open the prompt file" "a missing prompt file is named"
printf '\n\r\n\n' >"$tmp/prompts_empty.txt"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts_empty.txt"
expect_rc 2 "--prompt-file with only empty lines"
expect_in err "holds no prompt" "a prompt file without prompts is explained"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" --receipt "$tmp/pf.json"
expect_rc 2 "--prompt-file with --receipt"
expect_in err "--receipt describes one request" "--receipt with --prompt-file says why"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" --dump-logits "$tmp/pf.txt"
expect_rc 2 "--prompt-file with --dump-logits"
# --parallel N: the same text, line for line, with the prompts run
# together in shared passes (CPU), greedy and sampled.
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -n 8 --temp 0 --device cpu \
    --parallel 3
expect_rc 0 "run --prompt-file --parallel 3"
checks=$((checks + 1))
cmp -s "$tmp/out" "$tmp/pf_expect" || fail "--parallel 3 prints other text than the requests alone"
expect_in err "^batching +up to 3 at once: [0-9]+ passes of [0-9.]+ rows on average" \
    "--parallel: the batching line"
expect_in err "^request 3/3: prompt [0-9]+ tokens \([0-9]+ from the cache\), generation 8 tokens" \
    "--parallel: a line per request"
# Passes of at most 2 rows: each prompt in chunks of one row beside a
# decode, more passes, the same text.
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -n 8 --temp 0 --device cpu \
    --parallel 3 --batch-tokens 2
expect_rc 0 "run --prompt-file --parallel 3 --batch-tokens 2"
checks=$((checks + 1))
cmp -s "$tmp/out" "$tmp/pf_expect" || fail "--batch-tokens 2 prints other text than the requests alone"
expect_in err "^batching +up to 3 at once: [0-9]+ passes of [0-9.]+ rows on average" \
    "--batch-tokens 2: the batching line"
checks=$((checks + 1))
rows=$(sed -n 's/^batching .* passes of \([0-9.]*\) rows on average.*/\1/p' "$tmp/err")
awk -v r="$rows" 'BEGIN { exit !(r > 0 && r <= 3) }' ||
    fail "--batch-tokens 2: $rows rows a pass on average (at most 2 plus a decode row each)"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" --parallel 3 --batch-tokens 0
expect_rc 2 "--batch-tokens 0"
expect_in err "--batch-tokens" "--batch-tokens 0 is named"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" --batch-tokens 64
expect_rc 2 "--batch-tokens without --parallel"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -n 8 --temp 1.5 --top-k 0 \
    --seed 7 --device cpu
cp "$tmp/out" "$tmp/pf_seq_sampled"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -n 8 --temp 1.5 --top-k 0 \
    --seed 7 --device cpu --parallel 2 --kv-block 4 --kv-evict lfu
expect_rc 0 "run --prompt-file --parallel 2, sampled, blocks of 4"
checks=$((checks + 1))
cmp -s "$tmp/out" "$tmp/pf_seq_sampled" || fail "--parallel, sampled: other text than one by one"
# A request beyond the context fails alone: the others' responses are
# printed, its line is empty, and the exit code is its own.
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts_long.txt" -n 4 --ctx 16 --temp 0 \
    --device cpu --parallel 3
expect_rc 2 "--parallel with a prompt beyond the context"
expect_in err "request 2/3 \(line 2 of .*\): .*more than the context of 16" \
    "--parallel: the failing request is named"
expect_in err "^request 3/3: " "--parallel: the request after the failing one ran"
checks=$((checks + 1))
[ "$(wc -l <"$tmp/out")" = 3 ] || fail "--parallel: one line per request, the failed one empty"
run "$BITNET" run -m "$M/tq2_0.gguf" -p hi --parallel 2
expect_rc 2 "--parallel without --prompt-file"
expect_in err "apply to --prompt-file" "--parallel without --prompt-file says why"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" --kv-block 8
expect_rc 2 "--kv-block without --parallel"
run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" --parallel 2 --kv-evict mru
expect_rc 2 "--kv-evict mru"
expect_in err "lru, fifo or lfu" "--kv-evict names the policies"
if [ $HAVE_GPU = 1 ]; then
    # The GPU gives the CPU's greedy text.
    run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -n 8 --temp 0 \
        --device cuda
    expect_rc 0 "run --prompt-file --device cuda"
    checks=$((checks + 1))
    cmp -s "$tmp/out" "$tmp/pf_expect" || fail "--prompt-file on the GPU prints other text than the CPU"
    run "$BITNET" run -m "$M/tq2_0.gguf" --prompt-file "$tmp/prompts.txt" -n 8 --temp 0 \
        --device cuda --parallel 3
    expect_rc 0 "run --prompt-file --parallel 3 --device cuda"
    checks=$((checks + 1))
    cmp -s "$tmp/out" "$tmp/pf_expect" || fail "--parallel on the GPU prints other text than the CPU"
fi

# ---- run: context, devices, arguments ------------------------------------------------
run "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" -n 32 --ctx 16 --temp 0
expect_rc 2 "prompt + -n beyond --ctx"
expect_in err "more than the context of 16" "context overflow message"
expect_not_in out "." "nothing generated before a context error"
run "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" -n 1000 --temp 0
expect_rc 2 "prompt + -n beyond the training context"
run "$BITNET" run -m "$M/hf_packed" -p hi --ctx 100000
expect_rc 2 "--ctx beyond the training context"
expect_in err "trained for" "--ctx message"

if [ $HAVE_GPU = 0 ]; then
    # No usable GPU: a cuda request is an error naming why (exit 4); auto,
    # strict or not, computes on the CPU (no GPU means no fallback).
    run "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --device cuda
    expect_rc 4 "--device cuda"
    expect_in err "CUDA is not usable \(requested cuda\): .+|no CUDA support" \
        "--device cuda says why CUDA is not usable"
    expect_in err "hint: .*--device cpu" "--device cuda hint"
    expect_not_in out "." "nothing generated after a device error"
    run "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --device gpu
    expect_rc 4 "--device gpu"
    run "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --device cuda:1
    expect_rc 4 "--device cuda:1"
    run env BITNET_DEVICE=cuda:0 "$BITNET" run -m "$M/hf_packed" -p hi -n 2
    expect_rc 4 "BITNET_DEVICE=cuda:0"
    expect_in err "BITNET_DEVICE" "the hint names BITNET_DEVICE"
    run env BITNET_STRICT_MODE=1 "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" \
        -n 4 --temp 0 --receipt "$tmp/strict.json"
    expect_rc 0 "BITNET_STRICT_MODE=1 with auto and no GPU computes on the CPU"
    expect_in err "selected=cpu" "strict auto without a GPU: cpu"
    expect_py "strict auto without a GPU: no fallback recorded" "$tmp/strict.json" <<'EOF'
import json, sys
b = json.load(open(sys.argv[1]))["backend"]
if b["selected"] != "cpu" or b["fallback_reason"] != "":
    print(b); sys.exit(1)
EOF
    run env BITNET_STRICT_MODE=1 "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --device cuda
    expect_rc 4 "BITNET_STRICT_MODE=1 --device cuda without a GPU"
    run env BITNET_GPU_FAKE=cuda "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --device cuda
    expect_rc 4 "--device cuda with only a fake GPU"
    expect_in err "fake GPUs never compute|no CUDA support" "a fake GPU never computes"
fi
run env BITNET_DEVICE=cuda "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --device cpu
expect_rc 0 "--device cpu wins over BITNET_DEVICE"
expect_in err "^requested=cpu " "requested=cpu"
run env BITNET_GPU_FAKE=cuda "$BITNET" run -m "$M/hf_packed" -p hi -n 2
expect_rc 0 "auto with a fake CUDA GPU computes on the CPU"
expect_in err "selected=cpu" "fake GPU: cpu selected"
expect_not_in err "detected=\[cuda" "fakes are never listed as detected"
run env BITNET_GPU_FAKE=cuda BITNET_STRICT_NO_FAKE_GPU=1 "$BITNET" run -m "$M/hf_packed" -p hi
expect_rc 4 "strict no-fake refuses a configured fake"

if [ $HAVE_GPU = 1 ]; then
    # The GPU streams what the CPU streams: tokens (every flavour) and text.
    for f in hf_packed i2s.gguf tq2_0.gguf tq1_0.gguf; do
        check_greedy "$M/$f" "$PACKED_PROMPT" "$PACKED_GREEDY" "$N_GREEDY" "cuda $f" cuda
        check_logits "$M/expect_packed.txt" 1e-3 "cuda $f"
    done
    check_greedy "$M/hf_bf16" "$BF16_PROMPT" "$BF16_GREEDY" "$N_GREEDY_BF16" "cuda hf_bf16" cuda
    check_logits "$M/expect_bf16.txt" 1e-3 "cuda hf_bf16"
    TEXT=$(sed -n 's/^text //p' "$M/expect_packed.txt")
    run "$BITNET" run -m "$M/tq2_0.gguf" -p "$TEXT" -n 24 --temp 0 --device cpu
    cp "$tmp/out" "$tmp/text_cpu"
    run "$BITNET" run -m "$M/tq2_0.gguf" -p "$TEXT" -n 24 --temp 0 --device cuda --verbose \
        --receipt "$tmp/g.json"
    expect_rc 0 "run --device cuda --verbose"
    checks=$((checks + 1))
    cmp -s "$tmp/out" "$tmp/text_cpu" || fail "--device cuda streams other text than --device cpu"
    expect_in err "^gpu memory: cuda:[0-9]+ .*KV cache" "--verbose reports the GPU footprint"
    expect_in err "^kernels +.*w2a8_gemv" "--verbose lists the kernels that ran"
    expect_in err "^gpu work +[1-9][0-9]* kernel launches; host to device" \
        "--verbose counts the GPU's work"
    expect_py "receipt of a GPU run" "$tmp/g.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
g = r["memory"]["gpu"]
w = r["backend"]["gpu_work"]
ok = (r["backend"]["selected"].startswith("cuda:") and g["total_bytes"] > 0
      and g["kv_cache_bytes"] > 0 and "w2a8_gemv" in r["backend"]["kernels"]
      and w["kernel_launches"] > 0 and w["h2d_bytes"] >= g["weights_bytes"]
      and w["d2h_transfers"] > 0)
if not ok:
    print(r["backend"], g); sys.exit(1)
EOF
    # The default sampling (T 0.8, top-k 40, top-p 0.95) picks on the GPU
    # from the sampler's own stream: the same text as the CPU for a seed.
    run "$BITNET" run -m "$M/tq2_0.gguf" -p "$TEXT" -n 24 --seed 7 --device cpu
    cp "$tmp/out" "$tmp/sampled_cpu"
    run "$BITNET" run -m "$M/tq2_0.gguf" -p "$TEXT" -n 24 --seed 7 --device cuda --verbose
    expect_rc 0 "run --device cuda, sampled"
    checks=$((checks + 1))
    cmp -s "$tmp/out" "$tmp/sampled_cpu" ||
        fail "--device cuda samples other text than --device cpu for the same seed"
    expect_in err "^kernels +.*sample_top_k_top_p" "sampling picks on the device"
    # An impossible memory limit: auto falls back (the reason logged and in
    # the receipt); strict mode and an explicit request fail (exit 6).
    run env BITNET_MEMORY_LIMIT=1MB "$BITNET" run -m "$M/hf_packed" --prompt-ids "$PACKED_PROMPT" \
        -n "$N_GREEDY" --temp 0 --receipt "$tmp/fb.json"
    expect_rc 0 "auto with BITNET_MEMORY_LIMIT=1MB falls back to the CPU"
    expect_in err "CUDA initialisation failed.*computing on the CPU" "the fallback is logged"
    expect_py "fallback recorded, same tokens" "$tmp/fb.json" "$PACKED_GREEDY" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
b = r["backend"]
want = [int(x) for x in sys.argv[2].split(",")]
if b["selected"] != "cpu" or "BITNET_MEMORY_LIMIT" not in b["fallback_reason"] \
        or r["generation"]["token_ids"] != want:
    print(b, r["generation"]["token_ids"]); sys.exit(1)
EOF
    run env BITNET_MEMORY_LIMIT=1MB BITNET_STRICT_MODE=1 "$BITNET" run -m "$M/hf_packed" -p hi -n 2
    expect_rc 6 "strict mode turns the fallback into an error"
    expect_in err "BITNET_STRICT_MODE" "the strict error names BITNET_STRICT_MODE"
    run env BITNET_MEMORY_LIMIT=1MB "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --device cuda
    expect_rc 6 "--device cuda never falls back"
    expect_in err "hint: .*(--ctx|model alone)" "the out-of-memory hint says what to reduce"
fi
run "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --device tpu
expect_rc 2 "--device tpu"
run "$BITNET" run -m "$M/hf_packed" -p hi -n 2 --threads 1 --device cpu --receipt "$tmp/t.json"
expect_rc 0 "--threads 1"
expect_in err "\(.*, 1 thread\)$" "startup line shows 1 thread"

run "$BITNET" run --help
expect_rc 0 "run --help"
expect_in out "default 0.8" "--help states the temperature default"
expect_in out "default 40" "--help states the top-k default"
expect_in out "default 128" "--help states the -n default"
run "$BITNET" run -m "$M/hf_packed"
expect_rc 2 "run without -p"
expect_in err "no prompt" "run without -p says so"
run "$BITNET" run -m "$M/hf_packed" -p hi --bogus
expect_rc 2 "run with an unknown option"
run "$BITNET" run -m "$M/hf_packed" -p hi -n
expect_rc 2 "-n without a value"
for bad in "-n 0" "-n x" "-n 12abc" "--temp -1" "--temp nan" "--top-p 1.5" "--min-p -0.1" \
    "--top-k -3" "--seed -1" "--threads 0" "--ctx 0" "--repeat-penalty 0" "--prompt-ids 1,,2"; do
    # shellcheck disable=SC2086
    run "$BITNET" run -m "$M/hf_packed" -p hi $bad
    expect_rc 2 "run $bad"
done
run "$BITNET" run -m "$M/hf_packed" --prompt-ids 1,100000 -n 1
expect_rc 2 "--prompt-ids outside the vocabulary"
run "$BITNET" run -m "$tmp/no-such-model.gguf" -p hi
expect_rc 5 "missing model file"
printf 'GGUF\003\000\000\000garbage' >"$tmp/bad.gguf"
run "$BITNET" run -m "$tmp/bad.gguf" -p hi
expect_rc 5 "malformed model file"
run "$BITNET" run -m "$DATA/gguf/fixture.gguf" -p hi
checks=$((checks + 1))
[ "$(rc)" != 0 ] || fail "a GGUF that is not BitNet does not run"
expect_in err "not a BitNet" "why a foreign GGUF does not run"

# ---- inspect ------------------------------------------------------------------------
run "$BITNET" inspect "$M/i2s.gguf"
expect_rc 0 "inspect GGUF"
expect_in out "general.architecture +\"bitnet-25\"" "inspect shows metadata"
expect_in out "tokenizer.ggml.tokens +\[300 strings\]" "long arrays summarised"
expect_in out "blk.0.attn_q.weight +\[256, 256\] +i2_s" "tensor table"
expect_in out "runnable +yes" "runnable verdict"
expect_in out "flavour +GGUF bitnet-25" "flavour"
run "$BITNET" inspect "$M/tq1_0.gguf" --json
expect_rc 0 "inspect --json GGUF"
expect_py "inspect --json GGUF" "$tmp/out" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "gguf", j["format"]
assert j["metadata"]["general.architecture"] == "bitnet"
assert j["metadata"]["tokenizer.ggml.tokens"] == "[300 strings]"
assert any(t["name"] == "blk.0.attn_q.weight" and t["type"] == "tq1_0" for t in j["tensors"])
assert j["bitnet"]["runnable"] is True and j["bitnet"]["hparams"]["n_layer"] == 2
EOF
for d in hf_packed hf_bf16; do
    run "$BITNET" inspect "$M/$d"
    expect_rc 0 "inspect $d"
    expect_in out "hidden_size +[0-9]+" "inspect $d shows the config"
    expect_in out "model.layers.0.self_attn.q_proj.weight" "inspect $d lists tensors"
    expect_in out "runnable +yes" "inspect $d verdict"
    run "$BITNET" inspect "$M/$d" --json
    expect_rc 0 "inspect $d --json"
    checks=$((checks + 1))
    python3 -m json.tool "$tmp/out" >/dev/null 2>&1 || fail "inspect $d --json is not valid JSON"
done
run "$BITNET" inspect "$DATA/gguf/fixture.gguf"
expect_rc 0 "inspect a GGUF bitnet cannot run"
expect_in out "runnable +no: .*not a BitNet" "inspect says why it cannot run"
expect_in out "t.arr_u64 +\[1, 18000000000000000000\]" "inspect shows u64 arrays"
run "$BITNET" inspect "$DATA/gguf/fixture.gguf" --json
expect_rc 0 "inspect --json a GGUF bitnet cannot run"
checks=$((checks + 1))
python3 -m json.tool "$tmp/out" >/dev/null 2>&1 || fail "inspect --json of a foreign GGUF is not valid JSON"
run "$BITNET" inspect "$M/hf_packed/model.safetensors"
expect_rc 0 "inspect a .safetensors file"
run "$BITNET" inspect "$tmp/none.gguf"
expect_rc 5 "inspect a missing file"
run "$BITNET" inspect "$tmp/bad.gguf"
expect_rc 5 "inspect a malformed file"
run "$BITNET" inspect
expect_rc 2 "inspect without a path"
run "$BITNET" inspect "$M/i2s.gguf" --bogus
expect_rc 2 "inspect with an unknown option"

# ---- convert, then run the result ----------------------------------------------------
for t in i2_s tq2_0 tq1_0 f16; do
    out=$tmp/packed_$t.gguf
    run "$BITNET" convert "$M/hf_packed" -o "$out" --type "$t"
    expect_rc 0 "convert hf_packed --type $t"
    expect_in out "^wrote " "convert reports what it wrote"
    expect_not_in err "\[#" "no progress bar when stderr is not a terminal"
    check_greedy "$out" "$PACKED_PROMPT" "$PACKED_GREEDY" "$N_GREEDY" "converted hf_packed $t"
    # Packed scales are bf16, exact in fp16: the file computes exactly.
    check_logits "$M/expect_packed.txt" 1e-4 "converted hf_packed $t"
    run "$BITNET" inspect "$out" --json
    expect_rc 0 "inspect converted $t"
    expect_py "converted $t conventions" "$tmp/out" "$t" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1])); t = sys.argv[2]; m = j["metadata"]
arch = "bitnet-25" if t == "i2_s" else "bitnet"
ftype = {"i2_s": 40, "tq1_0": 36, "tq2_0": 37, "f16": 1}[t]
tensors = {x["name"]: x for x in j["tensors"]}
want = {
    "architecture": m["general.architecture"] == arch,
    "file_type": m["general.file_type"] == ftype,
    "tokenizer model": m["tokenizer.ggml.model"] == "gpt2",
    "pre": m.get("tokenizer.ggml.pre") == "llama-bpe",
    "merges": m["tokenizer.ggml.merges"].startswith("["),
    "eos": "tokenizer.ggml.eos_token_id" in m,
    "projection type": tensors["blk.0.attn_q.weight"]["type"] == t,
    "token_embd f16": tensors["token_embd.weight"]["type"] == "f16",
    "norms f32": tensors["blk.1.ffn_sub_norm.weight"]["type"] == "f32",
    "no .scale tensors": not any(n.endswith(".scale") for n in tensors),
    "tied: no output.weight": "output.weight" not in tensors,
    "runnable": j["bitnet"]["runnable"],
}
bad = [k for k, ok in want.items() if not ok]
if bad:
    print(bad); sys.exit(1)
EOF
done
for t in i2_s tq2_0 tq1_0 f16; do
    out=$tmp/bf16_$t.gguf
    run "$BITNET" convert "$M/hf_bf16" -o "$out" --type "$t"
    expect_rc 0 "convert hf_bf16 --type $t"
    [ "$t" = f16 ] || expect_in out "written as F16" \
        "convert reports F16 fallbacks (rows of 64 do not fit $t blocks)"
    check_greedy "$out" "$BF16_PROMPT" "$BF16_GREEDY" "$N_GREEDY_BF16" "converted hf_bf16 $t"
    # absmean scales are rounded to fp16 in F16/TQ tensors (as upstream does).
    check_logits "$M/expect_bf16.txt" 1e-2 "converted hf_bf16 $t"
done

run "$BITNET" convert "$M/hf_packed" -o "$tmp/x.gguf" --type q4_0
expect_rc 2 "convert --type q4_0"
run "$BITNET" convert "$M/hf_packed"
expect_rc 2 "convert without -o"
run "$BITNET" convert -o "$tmp/x.gguf"
expect_rc 2 "convert without input"
run "$BITNET" convert "$tmp/no-such-dir" -o "$tmp/x.gguf"
expect_rc 5 "convert a missing directory"
run "$BITNET" convert "$M/i2s.gguf" -o "$tmp/x.gguf"
expect_rc 2 "convert a file instead of a directory"
mkdir -p "$tmp/atomic"
run "$BITNET" convert "$DATA/hf/bad/dir_bad_config" -o "$tmp/atomic/x.gguf"
checks=$((checks + 1))
[ "$(rc)" != 0 ] || fail "convert of a broken directory fails"
checks=$((checks + 1))
[ -z "$(ls -A "$tmp/atomic")" ] || fail "a failed convert leaves no file behind: $(ls -A "$tmp/atomic")"
run "$BITNET" convert --help
expect_rc 0 "convert --help"
expect_in out "tq1_0" "convert --help lists the types"

# ---- the pre-tokenizer: carried by convert, its cost bounded ---------------------------
# with_regex SRC DST REGEX: a copy of HF directory SRC whose tokenizer.json
# splits with REGEX.
with_regex() {
    cp -r "$1" "$2"
    python3 - "$2/tokenizer.json" "$3" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = sys.argv[2]
json.dump(j, open(sys.argv[1], "w", encoding="utf-8"), ensure_ascii=False)
EOF
}
# A regex that matches no GGUF pre-tokenizer name: the file would split text
# differently from the directory (\X: whole grapheme clusters), so convert
# refuses it, naming the pattern, and writes nothing.
with_regex "$M/hf_packed" "$tmp/hf_custom" '\X'
mkdir -p "$tmp/custom_out"
for t in i2_s tq2_0; do
    run "$BITNET" convert "$tmp/hf_custom" -o "$tmp/custom_out/x.gguf" --type "$t"
    expect_rc 5 "convert --type $t of a directory with a custom pre-tokenizer regex"
    expect_in err 'pre-tokenizer regex "\\X"' "convert names the custom pre-tokenizer regex"
done
checks=$((checks + 1))
[ -z "$(ls -A "$tmp/custom_out")" ] || fail "a refused convert leaves no file: $(ls -A "$tmp/custom_out")"
# The shipped model's directory (LLaMA-3's regex) converts with pre
# llama-bpe, for bitnet.cpp (i2_s) too, and every flavour tokenizes text as
# the directory does: numbers, contractions, whitespace runs, non-ASCII.
KJV=$DATA/../../models/bitnet-kjv-7m/hf
if [ -d "$KJV" ]; then
    for t in i2_s tq2_0; do
        run "$BITNET" convert "$KJV" -o "$tmp/kjv_$t.gguf" --type "$t"
        expect_rc 0 "convert the KJV directory --type $t"
        run "$BITNET" inspect "$tmp/kjv_$t.gguf" --json
        expect_py "converted KJV $t: tokenizer.ggml.pre is llama-bpe" "$tmp/out" <<'EOF'
import json, sys
pre = json.load(open(sys.argv[1]))["metadata"].get("tokenizer.ggml.pre")
if pre != "llama-bpe":
    print("tokenizer.ggml.pre =", pre); sys.exit(1)
EOF
    done
    n=0
    for p in "In 1611 the 12345 men said: I'll go, they're here, we'd've 3.14159" \
        "$(printf 'a   b\n\n\n\tc  d    \r\n  e')" \
        "Jérusalem — ʻokina 日本語 emoji 😀😀 ſt 'S'T ÀÉÎ" \
        "   leading and trailing   " "x=1;y+=22//333*4444!!!??..."; do
        n=$((n + 1))
        for src in "$KJV" "$tmp/kjv_i2_s.gguf" "$tmp/kjv_tq2_0.gguf"; do
            run "$BITNET" run -m "$src" -p "$p" -n 1 --temp 0 --device cpu --receipt "$tmp/tok_$n.json"
            expect_rc 0 "run $(basename "$src") on prompt $n"
            [ "$src" = "$KJV" ] && cp "$tmp/tok_$n.json" "$tmp/tok_${n}_dir.json"
            expect_py "prompt $n: $(basename "$src") tokenizes as the directory" \
                "$tmp/tok_$n.json" "$tmp/tok_${n}_dir.json" <<'EOF'
import json, sys
got, want = (json.load(open(f))["prompt"]["token_ids"] for f in sys.argv[1:3])
if got != want:
    print("got ", got); print("want", want); sys.exit(1)
EOF
        done
    done
else
    fail "$KJV is missing"
fi
# A pre-tokenizer regex that backtracks catastrophically ((?:.?){21} tries
# 2^21 ways before failing at each position) exhausts its work budget at
# once: a malformed file (exit 5), not a minute of matching.
with_regex "$M/hf_packed" "$tmp/hf_hostile" '(?:.?){21}\x{10FFFF}|.'
run "$BITNET" run -m "$tmp/hf_hostile" -p "$(printf 'a%.0s' $(seq 1000))" -n 1 --device cpu
expect_rc 5 "a costly pre-tokenizer regex on a 1000-byte prompt"
expect_in err "pre-tokenizer regex .* is too costly" "the costly regex is named as the cause"

# ---- bench e2e ----------------------------------------------------------------------
run "$BITNET" bench e2e --shape tiny --prompt 64 --gen 16 --device cpu
expect_rc 0 "bench e2e --shape tiny"
expect_in out "^prefill .* tok/s" "bench e2e prints prefill tok/s"
expect_in out "^decode .* tok/s" "bench e2e prints decode tok/s"
expect_in out "^memory .*KV cache.*RSS" "bench e2e prints memory"
expect_in out "selected=cpu" "bench e2e prints the startup line"
digest=$(grep '^tokens' "$tmp/out")
run "$BITNET" bench e2e --shape tiny --prompt 64 --gen 16 --device cpu --warmup
expect_rc 0 "bench e2e --warmup"
expect_in out "^warmup .* one untimed request" "bench e2e --warmup says it ran one"
expect_in out "^$digest\$" "bench e2e --warmup: the timed request's tokens as without it"
run "$BITNET" bench e2e --shape tiny --kv f8
expect_rc 2 "bench e2e --kv f8"
run "$BITNET" bench batch --shape tiny --seqs 1,3 --prompt 16 --gen 4 --shared-prefix 8 --device cpu
expect_rc 0 "bench batch --shape tiny"
expect_in out "^shared +3 +[0-9.]+ +[0-9.]+ " "bench batch: a row with prefix sharing"
expect_in out "^unshared +3 +[0-9.]+ +[0-9.]+ " "bench batch: a row without"
run "$BITNET" bench batch --shape tiny --seqs 0
expect_rc 2 "bench batch --seqs 0"
run "$BITNET" bench e2e --shape tiny --prompt 8 --gen 4 --device cpu --temp 0.8
expect_rc 0 "bench e2e --temp 0.8 on the CPU"
expect_in out "^decode .*sampled: T 0.8, top-k 40, top-p 0.95, picked on the host" \
    "bench e2e --temp on the CPU: the host picks"
run "$BITNET" bench e2e --shape tiny --gemv-stage cluster8
expect_rc 2 "bench e2e --gemv-stage (the decode step's form is the device's)"
expect_in err "unknown option '--gemv-stage'" "bench e2e --gemv-stage is unknown"
if [ $HAVE_GPU = 1 ]; then
    run "$BITNET" bench e2e --shape tiny --prompt 64 --gen 16 --device cuda
    expect_rc 0 "bench e2e --device cuda"
    expect_in out "selected=cuda:" "bench e2e on the GPU"
    expect_in out "gemv stage (cluster 8|block)( \(gate\|up cluster 16\))?, greedy head full\)" "bench e2e: the GEMVs' staging (a tiny head: not screened)"
    expect_in out "^head +greedy steps read the whole LM head" "bench e2e: the head line"
    expect_in out "^prefill .* tok/s" "bench e2e cuda prints prefill tok/s"
    expect_in out "^step .* us" "bench e2e cuda prints the decode step time"
    expect_in out "LM head" "bench e2e cuda prints the per-kernel split"
    expect_in out "^memory +GPU .*peak" "bench e2e cuda prints GPU memory"
    expect_in out "^floor .*GB/s" "bench e2e cuda prints the byte floor"
    run "$BITNET" bench e2e --shape tiny --prompt 64 --gen 16 --device cuda --temp 0.8
    expect_rc 0 "bench e2e --temp 0.8 on the GPU"
    expect_in out "^decode .*sampled: T 0.8, top-k 40, top-p 0.95, picked on the device" \
        "bench e2e --temp: the device picks"
else
    run "$BITNET" bench e2e --shape tiny --device cuda
    expect_rc 4 "bench e2e --device cuda"
    expect_in err "CUDA is not usable|no CUDA support" "bench e2e --device cuda message"
fi
run "$BITNET" bench e2e --shape huge
expect_rc 2 "bench e2e --shape huge"
run "$BITNET" bench e2e --shape tiny --prompt 4000 --gen 200
expect_rc 2 "bench e2e beyond the context"
run "$BITNET" bench --help
expect_in out "e2e" "bench --help lists e2e"

# ---- malformed models found by the fuzzers (fuzz/crashes) ------------------------
# Metadata claiming a huge model in a tiny file: refused before anything
# sized by the metadata is allocated (quickly, in little memory).
crashes=$DATA/../../fuzz/crashes
for bad in "$crashes/model_gguf/hparams-alloc-1gb.gguf" "$crashes/hf_dir/hparams-alloc-1gb"; do
    run "$BITNET" run -m "$bad" -p hi -n 1
    expect_rc 5 "run on $(basename "$bad")"
    expect_in err "needs at least" "$(basename "$bad") is refused as too small"
    run "$BITNET" inspect "$bad"
    expect_rc 0 "inspect describes $(basename "$bad")"
    expect_in out "runnable +no: .*needs at least" "inspect says why $(basename "$bad") cannot run"
done

# ---- the default model and perplexity ---------------------------------------------
# run without -m uses the shipped model (found from the binary's location);
# BITNET_MODEL overrides it; perplexity's arguments and errors.
DM=$DATA/../../models/bitnet-kjv-7m
run "$BITNET" run -p "And it came to pass" -n 16 --temp 0 --device cpu --verbose
expect_rc 0 "run without -m"
expect_in err "bitnet-kjv-7m-i2_s.gguf" "run without -m loads the default model"
expect_in out "[a-z]+ [a-z]+" "the default model writes words"
cp "$tmp/out" "$tmp/default_out"
run BITNET_MODEL="$DM/bitnet-kjv-7m-tq2_0.gguf" "$BITNET" run -p "And it came to pass" -n 16 \
    --temp 0 --device cpu --verbose
expect_rc 0 "run with BITNET_MODEL"
expect_in err "bitnet-kjv-7m-tq2_0.gguf" "BITNET_MODEL names the model"
checks=$((checks + 1))
cmp -s "$tmp/out" "$tmp/default_out" || fail "TQ2_0 and I2_S files give different greedy text"
run BITNET_MODEL="$tmp/none.gguf" "$BITNET" run -p hi -n 1
expect_rc 5 "BITNET_MODEL naming a missing file"
run BITNET_MODEL= "$BITNET" run -p hi -n 1
expect_rc 3 "an empty BITNET_MODEL"
expect_in err "BITNET_MODEL" "the error names BITNET_MODEL"
head -c 3000 "$DM/test.txt" >"$tmp/text.txt"
run "$BITNET" perplexity -f "$tmp/text.txt" --ctx 128 --device cpu --json
expect_rc 0 "perplexity on the default model"
expect_py "perplexity --json" "$tmp/out" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ctx"] == 128 and r["chunks"] >= 2, r
assert r["predicted_tokens"] == r["text_tokens"] > 0, r
assert 1.0 < r["perplexity"] < 1000.0, r
EOF
expect_in err "^\[[0-9]+/[0-9]+\] .*perplexity so far" "perplexity reports progress on stderr"
run "$BITNET" perplexity -m "$DM/bitnet-kjv-7m-i2_s.gguf" -f - --ctx 64 --device cpu <"$tmp/text.txt"
expect_rc 0 "perplexity reading stdin"
expect_in out "^perplexity [0-9.]+ \(mean negative log-likelihood" "perplexity's result line"
run "$BITNET" perplexity
expect_rc 2 "perplexity without -f"
run "$BITNET" perplexity -f "$tmp/missing.txt"
expect_rc 5 "perplexity on a missing file"
run "$BITNET" perplexity -f "$tmp/text.txt" --ctx 1
expect_rc 2 "perplexity --ctx 1"
run "$BITNET" perplexity -f "$tmp/text.txt" --ctx 100000 --device cpu
expect_rc 2 "perplexity --ctx beyond the training context"
: >"$tmp/empty.txt"
run "$BITNET" perplexity -f "$tmp/empty.txt" --device cpu
expect_rc 2 "perplexity on an empty text"
expect_in err "too few to score" "an empty text is explained"
run "$BITNET" perplexity --help
expect_in out "usage: bitnet perplexity" "perplexity --help"
run "$BITNET" run -p hi -n 2 --kv f8
expect_rc 2 "run --kv f8"
expect_in err "--kv must be f32, f16 or fp8" "run --kv names its values"
run "$BITNET" run -p hi -n 2 --kv f16 --device cpu
expect_rc 0 "run --kv f16 on the CPU (its cache stays f32)"

# ---- exit codes: one rule for files ----------------------------------------------
# A file that cannot be read or written, or whose content is malformed or
# unsupported, is exit code 5 whichever command meets it; a device that
# cannot run is 4 (above).
cp "$M/i2s.gguf" "$tmp/v9.gguf"
printf '\x09\x00\x00\x00' | dd of="$tmp/v9.gguf" bs=1 seek=4 conv=notrunc status=none
for cmd in run inspect; do
    if [ $cmd = run ]; then
        run "$BITNET" run -m "$tmp/v9.gguf" -p hi -n 2 --device cpu
    else
        run "$BITNET" inspect "$tmp/v9.gguf"
    fi
    expect_rc 5 "$cmd on a GGUF of a newer version"
    expect_in err "version 9" "$cmd names the version"
done
python3 - "$M/i2s.gguf" "$tmp/bert.gguf" <<'EOF_PY'
import sys
data = open(sys.argv[1], "rb").read()
key = b"tokenizer.ggml.model"
at = data.index(key) + len(key) + 4 + 8  # the key, the value's type, its length
assert data[at:at + 4] == b"gpt2", data[at:at + 4]
open(sys.argv[2], "wb").write(data[:at] + b"bert" + data[at + 4:])
EOF_PY
run "$BITNET" run -m "$tmp/bert.gguf" -p hi -n 2 --device cpu
expect_rc 5 "run on a GGUF with an unsupported tokenizer model"
expect_in err "bert" "the unsupported tokenizer model is named"
run "$BITNET" run -m "$M/i2s.gguf" -p hi -n 2 --device cpu --receipt "$tmp/no/such/dir/r.json"
expect_rc 5 "--receipt into a missing directory"
expect_in err "cannot write the receipt .*No such file or directory" "the receipt error says why"
if [ -w /dev/full ]; then
    run "$BITNET" run -m "$M/i2s.gguf" -p hi -n 2 --device cpu --receipt /dev/full
    expect_rc 5 "--receipt /dev/full"
    run "$BITNET" run -m "$M/i2s.gguf" -p hi -n 2 --device cpu --dump-logits /dev/full
    expect_rc 5 "--dump-logits /dev/full"
fi
run "$BITNET" run -m "$M/i2s.gguf" -p hi -n 2 --device cpu --dump-logits "$tmp/no/such/l.txt"
expect_rc 5 "--dump-logits into a missing directory"

# ---- input files are capped (--max-file-mib) ---------------------------------------
# An endless or huge prompt file or text is refused once the limit is read,
# before any model loads, instead of filling memory.
for src in /dev/zero /dev/urandom; do
    run "$BITNET" run -m "$M/i2s.gguf" --prompt-file "$src" -n 1 --device cpu
    expect_rc 2 "--prompt-file $src"
    expect_in err "the prompt file $src holds more than 64 MiB" "--prompt-file $src is refused"
    expect_in err "hint: .*--max-file-mib" "the hint names --max-file-mib"
    run "$BITNET" perplexity -m "$M/i2s.gguf" -f "$src" --device cpu
    expect_rc 2 "perplexity -f $src"
    expect_in err "the text file $src holds more than 64 MiB" "perplexity -f $src is refused"
done
head -c 1048577 /dev/zero | tr '\0' 'a' >"$tmp/big.txt"
run "$BITNET" perplexity -m "$M/i2s.gguf" -f "$tmp/big.txt" --max-file-mib 1 --device cpu
expect_rc 2 "a text one byte over --max-file-mib 1"
expect_in err "holds more than 1 MiB" "the limit is named"
run "$BITNET" run -m "$M/i2s.gguf" --prompt-file - --max-file-mib 1 -n 1 --device cpu \
    <"$tmp/big.txt"
expect_rc 2 "a prompt file on stdin one byte over --max-file-mib 1"
for bad in 0 -1 65537 x; do
    run "$BITNET" run -m "$M/i2s.gguf" --prompt-file "$tmp/big.txt" --max-file-mib "$bad"
    expect_rc 2 "--max-file-mib $bad"
done
printf 'hi\nthere\n' >"$tmp/two.txt"
run "$BITNET" run -m "$M/i2s.gguf" --prompt-file "$tmp/two.txt" --max-file-mib 1 -n 2 \
    --device cpu --temp 0
expect_rc 0 "a prompt file within --max-file-mib"

# ---- a model whose logits are all NaN -------------------------------------------
# output_norm (model.norm.weight) set to 3e38: finite, so the loader takes
# it, but the final hidden state overflows and every logit is NaN. Every
# command that samples stops with the same error perplexity gives, and
# prints no token: greedy and sampled, the directory and its GGUF, and on a
# usable GPU the device's picks (full head, screened head, sampler) too.
cp -r "$M/hf_packed" "$tmp/hf_nan"
python3 - "$tmp/hf_nan/model.safetensors" <<'EOF_PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
t = json.loads(data[8:8 + n])["model.norm.weight"]
begin, end = (8 + n + o for o in t["data_offsets"])
one = {"BF16": struct.pack("<f", 3e38)[2:], "F32": struct.pack("<f", 3e38)}[t["dtype"]]
data[begin:end] = one * ((end - begin) // len(one))
open(path, "wb").write(bytes(data))
EOF_PY
run "$BITNET" convert "$tmp/hf_nan" -o "$tmp/nan.gguf" --type i2_s
expect_rc 0 "convert of the NaN-logit model (its weights are finite)"
nan_devices="cpu"
[ $HAVE_GPU = 1 ] && nan_devices="cpu cuda"
for dev in $nan_devices; do
    for model in "$tmp/hf_nan" "$tmp/nan.gguf"; do
        for temp in 0 0.8; do
            run "$BITNET" run -m "$model" -p "In the beginning" -n 4 --temp "$temp" --top-k 40 \
                --device "$dev"
            expect_rc 5 "run on NaN logits ($dev, ${model##*/}, --temp $temp)"
            expect_in err "logits are not finite: every logit is NaN or -inf" \
                "run on NaN logits says why ($dev, ${model##*/}, --temp $temp)"
            expect_not_in out "." "run on NaN logits prints no token ($dev, --temp $temp)"
        done
    done
    run "$BITNET" perplexity -m "$tmp/hf_nan" -f "$DM/test.txt" --ctx 32 --device "$dev" \
        --max-file-mib 1
    expect_rc 5 "perplexity on NaN logits ($dev)"
    expect_in err "logits are not finite" "perplexity on NaN logits says why ($dev)"
done

echo "$checks checks, $fails failed"
[ "$fails" = 0 ]
