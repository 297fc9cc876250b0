#!/usr/bin/env bash
# bitnet serve on a random model of the BitNet b1.58 2B-4T shape (with the
# real tokenizer), against `bitnet bench batch` at the same number of
# sequences, in one run: what the HTTP server costs (its output tokens/s
# at 64 streaming clients against the batched engine's alone).
#
#   bench/serve_2b4t.sh BITNET PEERS_DIR [CLIENTS]
#
# PEERS_DIR holds gen_bitnet2b_random.py and tokenizer.json
# (../shared/bench/cpu-peers); python3 needs numpy for it. The model (~6 GB
# of files) goes to WORK (default /tmp/serve2b); GEN (default 256) tokens a
# request. Set BITNET_DEVICE to pick
# the device (auto: the GPU when CUDA is usable). Prints both tables.
set -eu
BN=${1:?usage: serve_2b4t.sh BITNET PEERS_DIR [CLIENTS]}
PEERS=${2:?usage: serve_2b4t.sh BITNET PEERS_DIR [CLIENTS]}
CLIENTS=${3:-64}
GEN=${GEN:-256}
WORK=${WORK:-/tmp/serve2b}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
[ -f "$WORK/hf/config.json" ] ||
    python3 "$PEERS/gen_bitnet2b_random.py" "$WORK/hf" --tokenizer "$PEERS/tokenizer.json"
[ -f "$WORK/2b4t-i2_s.gguf" ] || "$BN" convert "$WORK/hf" -o "$WORK/2b4t-i2_s.gguf" --type i2_s
# The same work both ways: CLIENTS requests at once, 32 prompt tokens each
# (no shared prefix), GEN tokens generated, greedy.
"$BN" bench batch --seqs "$CLIENTS" --prompt 32 --gen "$GEN"
"$BN" serve -m "$WORK/2b4t-i2_s.gguf" --port 18300 --parallel "$CLIENTS" \
    --max-queue $((4 * CLIENTS)) 2>"$WORK/serve.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' EXIT
for _ in $(seq 1 1200); do
    grep -q 'bitnet serve: ready' "$WORK/serve.err" && break
    kill -0 "$pid" 2>/dev/null || { cat "$WORK/serve.err"; exit 1; }
    sleep 0.1
done
python3 "$here/serve_bench.py" http://127.0.0.1:18300 --clients "$CLIENTS" --tokens "$GEN" \
    --requests "$CLIENTS" --prompt-ids 32
# Where the scheduler's thread spent the run: in forward passes, and
# handing tokens to the requests.
python3 -c 'import sys, urllib.request
for line in urllib.request.urlopen(sys.argv[1]).read().decode().splitlines():
    if line.startswith(("bitnet_scheduler_seconds_total", "bitnet_forward")):
        print(line)' http://127.0.0.1:18300/metrics
