#!/usr/bin/env bash
# The Vulkan backend as a user meets it, on the first Vulkan device
# (lavapipe here and in CI): for every fixture and the shipped model,
# `bitnet run --device vulkan` prints the CPU's text, greedy and sampled, one
# prompt at a time and several at once (--parallel: batched passes);
# BITNET_DEVICE=vulkan does the same; the receipt names the device and the
# kernels; perplexity matches the CPU's; auto does not take a Vulkan device
# that computes on the CPU; a device that does not exist, an fp16 cache and
# a malformed request are clear errors (exit 4, 2, and 3 for a bad
# BITNET_DEVICE).
# Skipped (77) in a build without Vulkan or where no Vulkan device exists.
# usage: test_vulkan_cli.sh BITNET MODELS_DIR SHIPPED_MODEL_DIR
set -u
BITNET=${1:?usage: test_vulkan_cli.sh BITNET MODELS_DIR SHIPPED_MODEL_DIR}
M=${2:?}
SHIPPED=${3:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
checks=0
fail() {
    echo "FAIL: $1"
    fails=$((fails + 1))
}
check() { # check DESCRIPTION COMMAND...
    checks=$((checks + 1))
    local what=$1
    shift
    "$@" || fail "$what"
}
# Run with a clean BITNET_* environment plus the given assignments.
run() {
    env $(env | sed -n 's/^\(BITNET_[A-Z_]*\)=.*/-u \1/p') "$@" >"$tmp/out" 2>"$tmp/err"
    echo $? >"$tmp/rc"
}
rc() { cat "$tmp/rc"; }

"$BITNET" devices >"$tmp/devices" 2>&1
if ! grep -q '^  vulkan:0 ' "$tmp/devices"; then
    echo "SKIP: no Vulkan device listed by 'bitnet devices' (a build without Vulkan, no loader or no driver)"
    exit 77
fi
grep '^  vulkan:0 ' "$tmp/devices"
if ! grep -q 'fp64 yes' "$tmp/devices"; then
    echo "SKIP: Vulkan device 0 has no fp64: this test compares text with the CPU's, which the exact (fp64) kernels give"
    exit 77
fi

for model in "$M/hf_packed" "$M/hf_bf16" "$M/i2s.gguf" "$M/tq2_0.gguf" "$M/tq1_0.gguf" \
    "$SHIPPED/bitnet-kjv-7m-i2_s.gguf"; do
    name=${model#"$(dirname "$(dirname "$model")")"/}
    for sampling in "--temp 0" "--temp 0.9 --seed 11"; do
        # shellcheck disable=SC2086 # the sampling options are words
        run "$BITNET" run -m "$model" -p "And it came to pass" -n 32 $sampling --device cpu
        cp "$tmp/out" "$tmp/cpu.txt"
        # shellcheck disable=SC2086
        run "$BITNET" run -m "$model" -p "And it came to pass" -n 32 $sampling --device vulkan \
            --receipt "$tmp/receipt.json"
        check "$name ($sampling): exit code $(rc) on vulkan: $(tail -2 "$tmp/err")" [ "$(rc)" = 0 ]
        check "$name ($sampling): vulkan text differs from the CPU's" cmp -s "$tmp/out" "$tmp/cpu.txt"
    done
    check "$name: startup line names the Vulkan device" \
        grep -q 'requested=vulkan .*selected=vulkan:0 (' "$tmp/err"
    check "$name: receipt" python3 - "$tmp/receipt.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
b = r["backend"]
assert b["selected"] == "vulkan:0", b["selected"]
assert b["requested"] == "vulkan", b["requested"]
assert b["kv_cache_type"] == "f32", b["kv_cache_type"]
# the W2A8 product: its integer dot-product form where the device has them (lavapipe does)
assert ("vulkan_w2a8" in b["kernels"]) != ("vulkan_w2a8_dot" in b["kernels"]), b["kernels"]
assert "vulkan_attention" in b["kernels"], b["kernels"]
assert b["threads"] == 0
EOF
done
echo "run --device vulkan: the CPU's text on every model, greedy and sampled"

# BITNET_DEVICE selects it as --device does.
run BITNET_DEVICE=vulkan "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3,4,5,6,7 -n 20 --temp 0
cp "$tmp/out" "$tmp/env.txt"
check "BITNET_DEVICE=vulkan: exit $(rc)" [ "$(rc)" = 0 ]
check "BITNET_DEVICE=vulkan: startup line" grep -q 'selected=vulkan:0' "$tmp/err"
run "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3,4,5,6,7 -n 20 --temp 0 --device cpu
check "BITNET_DEVICE=vulkan: the CPU's tokens" cmp -s "$tmp/out" "$tmp/env.txt"

# BITNET_VULKAN_DOT=0: the W2A8 products' portable sums, the same tokens;
# a malformed value is refused before anything runs.
run env BITNET_VULKAN_DOT=0 "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3,4,5,6,7 -n 20 \
    --temp 0 --device vulkan --receipt "$tmp/nodot.json"
check "BITNET_VULKAN_DOT=0: exit $(rc)" [ "$(rc)" = 0 ]
check "BITNET_VULKAN_DOT=0: the CPU's tokens" cmp -s "$tmp/out" "$tmp/env.txt"
check "BITNET_VULKAN_DOT=0: the portable products" python3 - "$tmp/nodot.json" <<'EOF'
import json, sys
k = json.load(open(sys.argv[1]))["backend"]["kernels"]
assert "vulkan_w2a8" in k and "vulkan_w2a8_dot" not in k, k
EOF
run env BITNET_VULKAN_DOT=maybe "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3 -n 2 \
    --device vulkan
check "BITNET_VULKAN_DOT=maybe: exit 3 ($(rc))" [ "$(rc)" = 3 ]
check "BITNET_VULKAN_DOT=maybe: says which variable" grep -q BITNET_VULKAN_DOT "$tmp/err"

# A prompt of 40 tokens runs its products as tiles: on the device's int8
# subgroup matrix products where `bitnet devices` lists them (the receipt
# says vulkan_w2a8_matrix), else on integer dot products; with
# BITNET_VULKAN_MATRIX=0 always the latter. The CPU's tokens every way.
ids40=$(seq -s, 1 40)
run "$BITNET" run -m "$M/i2s.gguf" --prompt-ids "$ids40" -n 12 --temp 0 --device cpu
cp "$tmp/out" "$tmp/long_cpu.txt"
run "$BITNET" devices --json
cp "$tmp/out" "$tmp/devices.json"
for matrix in 1 0; do
    run env BITNET_VULKAN_MATRIX=$matrix "$BITNET" run -m "$M/i2s.gguf" --prompt-ids "$ids40" \
        -n 12 --temp 0 --device vulkan --receipt "$tmp/matrix$matrix.json"
    check "BITNET_VULKAN_MATRIX=$matrix: exit $(rc)" [ "$(rc)" = 0 ]
    check "BITNET_VULKAN_MATRIX=$matrix: the CPU's tokens" cmp -s "$tmp/out" "$tmp/long_cpu.txt"
    check "BITNET_VULKAN_MATRIX=$matrix: the tiles the device offers" python3 - \
        "$tmp/matrix$matrix.json" "$tmp/devices.json" "$matrix" <<'EOF'
import json, sys
k = json.load(open(sys.argv[1]))["backend"]["kernels"]
dev = json.load(open(sys.argv[2]))["vulkan"]["devices"][0]
want = "vulkan_w2a8_matrix" if sys.argv[3] == "1" and dev["int8_matrix"] else "vulkan_w2a8_tiles"
assert want in k, (want, k)
EOF
done
run env BITNET_VULKAN_MATRIX=2 "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3 -n 2 \
    --device vulkan
check "BITNET_VULKAN_MATRIX=2: exit 3 ($(rc))" [ "$(rc)" = 3 ]
check "BITNET_VULKAN_MATRIX=2: says which variable" grep -q BITNET_VULKAN_MATRIX "$tmp/err"

# Several prompts at once: batched passes over the paged cache, each text
# the CPU's, greedy and sampled.
printf 'And God said\nIn the beginning\nThe LORD is my shepherd\nBlessed are the meek\nAnd it came to pass\n' >"$tmp/prompts.txt"
for sampling in "--temp 0" "--temp 0.8 --seed 3"; do
    # shellcheck disable=SC2086
    run "$BITNET" run -m "$SHIPPED/bitnet-kjv-7m-i2_s.gguf" --prompt-file "$tmp/prompts.txt" \
        --parallel 3 -n 12 $sampling --device cpu
    cp "$tmp/out" "$tmp/parallel_cpu.txt"
    # shellcheck disable=SC2086
    run "$BITNET" run -m "$SHIPPED/bitnet-kjv-7m-i2_s.gguf" --prompt-file "$tmp/prompts.txt" \
        --parallel 3 -n 12 $sampling --device vulkan
    check "--parallel 3 ($sampling) on vulkan: exit $(rc): $(tail -1 "$tmp/err")" [ "$(rc)" = 0 ]
    check "--parallel 3 ($sampling): the CPU's texts" cmp -s "$tmp/out" "$tmp/parallel_cpu.txt"
    check "--parallel 3 ($sampling): batched passes" grep -q 'up to 3 at once' "$tmp/err"
done

# Perplexity over a piece of the shipped model's text (two windows of 128).
head -c 800 "$SHIPPED/test.txt" >"$tmp/text.txt"
run "$BITNET" perplexity -m "$SHIPPED/bitnet-kjv-7m-i2_s.gguf" -f "$tmp/text.txt" --ctx 128 \
    --device cpu --json
cp "$tmp/out" "$tmp/ppl_cpu.json"
run "$BITNET" perplexity -m "$SHIPPED/bitnet-kjv-7m-i2_s.gguf" -f "$tmp/text.txt" --ctx 128 \
    --device vulkan --json
check "perplexity on vulkan: exit $(rc): $(tail -1 "$tmp/err")" [ "$(rc)" = 0 ]
check "perplexity on vulkan equals the CPU's" python3 - "$tmp/ppl_cpu.json" "$tmp/out" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["device"] == "vulkan:0", b["device"]
assert a["predicted_tokens"] == b["predicted_tokens"]
assert b["chunks"] >= 2, b["chunks"]
assert abs(a["mean_nll"] - b["mean_nll"]) <= 1e-6 * abs(a["mean_nll"]), (a["mean_nll"], b["mean_nll"])
print("perplexity cpu %.6f, vulkan %.6f" % (a["perplexity"], b["perplexity"]))
EOF

# auto: a Vulkan device that computes on the CPU is not worth taking.
if grep -qE '^  vulkan:[0-9]+ .*\((discrete|integrated|virtual)\)$' "$tmp/devices" ||
    grep -qE '^  cuda +available' "$tmp/devices"; then
    echo "a GPU is present: auto's choice of the CPU is not checked here"
else
    run "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3 -n 4 --temp 0
    check "auto: exit $(rc)" [ "$(rc)" = 0 ]
    check "auto computes on the CPU beside a CPU Vulkan device" grep -q 'selected=cpu' "$tmp/err"
fi

# Errors.
run "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3 -n 4 --device vulkan:7
check "vulkan:7: exit $(rc), want 4" [ "$(rc)" = 4 ]
check "vulkan:7: says there is no such device" grep -q 'no device 7' "$tmp/err"
run "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3 -n 4 --device vulkan --kv f16
check "vulkan --kv f16: exit $(rc), want 4" [ "$(rc)" = 4 ]
check "vulkan --kv f16: says why" grep -q 'fp32 KV cache only' "$tmp/err"
run "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3 -n 4 --device vulkan:x
check "vulkan:x: exit $(rc), want 2" [ "$(rc)" = 2 ]
check "vulkan:x: lists the accepted values" grep -q 'vulkan or vulkan:N' "$tmp/err"
run BITNET_DEVICE=vulkan:99 "$BITNET" run -m "$M/i2s.gguf" --prompt-ids 1,2,3 -n 4
check "BITNET_DEVICE=vulkan:99: exit $(rc), want 3 (a bad environment value)" [ "$(rc)" = 3 ]
check "BITNET_DEVICE=vulkan:99: names the variable" grep -q "BITNET_DEVICE='vulkan:99' is not valid" "$tmp/err"

echo "$checks checks, $fails failed"
[ $fails = 0 ]
