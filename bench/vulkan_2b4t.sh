#!/usr/bin/env bash
# bitnet's Vulkan backend beside its CUDA path and llama.cpp's Vulkan backend on one file: a
# random model of the 2B-4T shape with the real tokenizer (the CPU peers' generator), converted
# to TQ2_0, 128 prompt tokens and 64 generated, ROUNDS rounds alternating.
# usage: bench/vulkan_2b4t.sh BITNET PEERS_DIR LLAMA_BENCH
#   BITNET       a bitnet built with Vulkan (and CUDA for the CUDA column)
#   PEERS_DIR    ../shared/bench/cpu-peers (gen_bitnet2b_random.py, tokenizer.json)
#   LLAMA_BENCH  llama.cpp's llama-bench built with -DGGML_VULKAN=ON
# WORK (default /tmp/vulkan2b) holds the model (~6 GB while converting).
set -u
BN=${1:?usage: vulkan_2b4t.sh BITNET PEERS_DIR LLAMA_BENCH}
PEERS=${2:?}
LLAMA=${3:?}
WORK=${WORK:-/tmp/vulkan2b}
ROUNDS=${ROUNDS:-2}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
[ -f "$WORK/tq2.gguf" ] || {
    "$PY" "$PEERS/gen_bitnet2b_random.py" "$WORK/hf" --tokenizer "$PEERS/tokenizer.json" >"$WORK/gen.log" 2>&1 &&
        "$BN" convert "$WORK/hf" -o "$WORK/tq2.gguf" --type tq2_0 >"$WORK/convert.log" 2>&1
} || { echo "making the model failed: see $WORK"; exit 1; }
ids=$("$PY" -c 'print(",".join(str(7 + 13 * i % 5000) for i in range(128)))')
for r in $(seq 1 "$ROUNDS"); do
    for dev in vulkan cuda; do
        "$BN" run -m "$WORK/tq2.gguf" --prompt-ids "$ids" -n 64 --temp 0 --device "$dev" \
            --receipt "$WORK/receipt.json" >/dev/null 2>"$WORK/run.err" || { tail -2 "$WORK/run.err"; continue; }
        "$PY" -c 'import json, sys
t = json.load(open(sys.argv[1]))["timings"]
print("round %s bitnet %-6s prefill %8.1f tok/s  decode %7.1f tok/s" % (sys.argv[2], sys.argv[3],
      t["prompt_tokens_per_second"], t["decode_tokens_per_second"]))' "$WORK/receipt.json" "$r" "$dev"
    done
    "$LLAMA" -m "$WORK/tq2.gguf" -ngl 99 -p 128 -n 64 -r 3 2>&1 | grep -E "ggml_vulkan: 0|pp128|tg64" |
        sed "s/^/round $r llama.cpp /"
done
