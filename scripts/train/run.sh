#!/bin/sh
# Trains bitnet's default model and writes every file under models/:
#
#   scripts/train/run.sh [OUT_DIR]          (default models/bitnet-kjv-7m)
#
# 1. the corpus (fetch_corpus.sh: Debian's bible-kjv-text; needs apt-get),
#    kept in $BITNET_TRAIN_WORK (default build/train) for later runs;
# 2. train.py: tokenizer, quantization-aware training (a CUDA GPU makes it
#    minutes; the CPU works, slowly), the Hugging Face export and
#    reference.json;
# 3. bitnet convert to I2_S and TQ2_0;
# 4. bitnet perplexity on the held-out text, on the CPU and, when usable,
#    on CUDA; 5. the model card (model_card.py).
#
# Needs a built bitnet ($BITNET_BIN, default build/bitnet) and python3 with
# torch, tokenizers and safetensors (transformers optional: its check).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
name=bitnet-kjv-7m
out=${1:-$root/models/$name}
work=${BITNET_TRAIN_WORK:-$root/build/train}
bitnet=${BITNET_BIN:-$root/build/bitnet}
if [ ! -x "$bitnet" ]; then
    echo "run.sh: $bitnet not found: build bitnet first (see README.md) or set BITNET_BIN" >&2
    exit 1
fi
mkdir -p "$work" "$out"

[ -s "$work/kjv.txt" ] || "$root/scripts/train/fetch_corpus.sh" "$work/kjv.txt"
python3 "$root/scripts/train/train.py" --corpus "$work/kjv.txt" --out "$work/run"

rm -rf "$out/hf"
cp -r "$work/run/hf" "$out/hf"
cp "$work/run/reference.json" "$work/run/test.txt" "$out/"
"$bitnet" convert "$out/hf" -o "$out/$name-i2_s.gguf" --type i2_s
"$bitnet" convert "$out/hf" -o "$out/$name-tq2_0.gguf" --type tq2_0

rm -f "$work"/ppl-*.json
for fmt in i2_s tq2_0; do
    for dev in cpu cuda; do
        rc=0
        "$bitnet" perplexity -m "$out/$name-$fmt.gguf" -f "$out/test.txt" --device "$dev" \
            --json >"$work/ppl-$fmt-$dev.json" || rc=$?
        if [ "$rc" -eq 4 ] && [ "$dev" = cuda ]; then
            echo "run.sh: no usable CUDA device: perplexity on the CPU only"
            rm -f "$work/ppl-$fmt-$dev.json"
        elif [ "$rc" -ne 0 ]; then
            exit "$rc"
        fi
    done
done
python3 "$root/scripts/train/model_card.py" "$out" "$work"/ppl-*.json
