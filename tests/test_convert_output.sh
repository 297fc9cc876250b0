#!/usr/bin/env bash
# What `bitnet convert` does with its output file, in a temporary directory:
#   - a symbolic link planted at OUT.tmp (the old fixed temporary name) is
#     not written through, and an OUT that is a symbolic link is refused;
#   - an OUT that is a character device (a mknod copy of /dev/null), a FIFO
#     or a directory is refused with exit 5 and left as it was;
#   - two converts to one OUT at once both succeed, OUT is byte for byte one
#     of the two results and bitnet inspect accepts it, no temporary file is
#     left;
#   - SIGINT / SIGTERM at spread moments of a convert leave no temporary
#     file, and OUT is either the previous file untouched or the complete
#     new one;
#   - a value that an encoding stores as F16 but F16 cannot hold (embedding,
#     lm head, projection scale) fails with exit 5 and writes nothing; a norm
#     (stored as F32) and a value at the edge of the F16 range convert.
# usage: test_convert_output.sh BITNET MODELS_DIR (tests/data/models)
set -u
BITNET=${1:?usage: test_convert_output.sh BITNET MODELS_DIR}
M=${2:?usage: test_convert_output.sh BITNET MODELS_DIR}
fails=0
checks=0
tmp=$(mktemp -d)
# Only the script itself cleans up, never a forked child that a signal
# reaches before it runs bitnet.
main=$$
trap '[ "$BASHPID" != "$main" ] || rm -rf "$tmp"' EXIT
PACKED=$M/hf_packed
BF16=$M/hf_bf16
for d in "$PACKED" "$BF16"; do
    [ -f "$d/model.safetensors" ] || { echo "FAIL: missing fixture $d"; exit 1; }
done

# Run with a clean BITNET_* environment.
run() {
    env $(env | sed -n 's/^\(BITNET_[A-Z_]*\)=.*/-u \1/p') "$@" >"$tmp/out" 2>"$tmp/err"
    echo $? >"$tmp/rc"
}
rc() { cat "$tmp/rc"; }
fail() {
    echo "FAIL: $1"
    fails=$((fails + 1))
}
check() { # what command...
    checks=$((checks + 1))
    local what=$1
    shift
    "$@" || fail "$what"
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
    grep -qE -- "$2" "$tmp/$1" || { fail "$3: '$2' not in $1"; sed 's/^/  /' "$tmp/$1" | head -20; }
}
# Files other than the expected ones in a directory (temporaries left).
only_files() { # dir names...
    local dir=$1
    shift
    local extra
    extra=$(cd "$dir" && ls -A | grep -vxF "$(printf '%s\n' "$@")")
    [ -z "$extra" ] || { echo "  left in $dir: $extra"; return 1; }
}

# ---- a symbolic link at the old temporary name, and OUT as a link ------------------
d=$tmp/symlink
mkdir "$d"
echo VICTIM >"$d/victim"
cp "$d/victim" "$tmp/victim.orig"
ln -s "$d/victim" "$d/out.gguf.tmp"
run "$BITNET" convert "$PACKED" -o "$d/out.gguf"
expect_rc 0 "convert beside a symbolic link at out.gguf.tmp"
check "the link's target is not written through" cmp -s "$d/victim" "$tmp/victim.orig"
check "out.gguf.tmp is still the link" [ -L "$d/out.gguf.tmp" ]
check "OUT is a regular file" test -f "$d/out.gguf" -a ! -L "$d/out.gguf"
check "OUT is a GGUF file" [ "$(head -c 4 "$d/out.gguf" 2>/dev/null)" = GGUF ]
check "no temporary file left" only_files "$d" victim out.gguf.tmp out.gguf
run "$BITNET" inspect "$d/out.gguf"
expect_rc 0 "inspect the output"

rm "$d/out.gguf"
ln -s "$d/victim" "$d/out.gguf"
run "$BITNET" convert "$PACKED" -o "$d/out.gguf"
expect_rc 5 "convert -o a symbolic link"
expect_in err "refusing to replace .*out.gguf: it is a symbolic link" "the refusal names the link"
check "the link stays a link" [ -L "$d/out.gguf" ]
check "the link's target is untouched" cmp -s "$d/victim" "$tmp/victim.orig"

# ---- device node, FIFO, directory ---------------------------------------------------
d=$tmp/special
mkdir "$d"
# A character device with /dev/null's numbers (writes vanish, so nothing
# leaks even if it were written through).
if mknod "$d/dev" c "$((0x$(stat -c %t /dev/null)))" "$((0x$(stat -c %T /dev/null)))" 2>/dev/null; then
    run "$BITNET" convert "$PACKED" -o "$d/dev"
    expect_rc 5 "convert -o a character device"
    expect_in err "refusing to replace .*dev: it is a character device, not a regular file" \
        "the refusal names the device"
    check "the device node is left a device" [ -c "$d/dev" ]
    rm -f "$d/dev"
else
    echo "SKIP: mknod is not permitted here; the character-device case was not run"
fi
mkfifo "$d/fifo"
run "$BITNET" convert "$PACKED" -o "$d/fifo"
expect_rc 5 "convert -o a FIFO"
expect_in err "refusing to replace .*fifo: it is a FIFO" "the refusal names the FIFO"
check "the FIFO is left a FIFO" [ -p "$d/fifo" ]
mkdir "$d/dir"
run "$BITNET" convert "$PACKED" -o "$d/dir"
expect_rc 5 "convert -o a directory"
expect_in err "it is a directory" "the refusal names the directory"
check "the directory is left" [ -d "$d/dir" ]
check "no temporary file left" only_files "$d" fifo dir

# ---- two converts to one OUT at once -----------------------------------------------
d=$tmp/concurrent
mkdir "$d"
run "$BITNET" convert "$PACKED" -o "$d/ref_i2s.gguf" --type i2_s
expect_rc 0 "reference i2_s"
run "$BITNET" convert "$PACKED" -o "$d/ref_tq2.gguf" --type tq2_0
expect_rc 0 "reference tq2_0"
for round in 1 2 3 4 5 6 7 8 9 10; do
    rm -f "$d/out.gguf"
    "$BITNET" convert "$PACKED" -o "$d/out.gguf" --type i2_s >"$d/a.log" 2>&1 &
    pa=$!
    "$BITNET" convert "$PACKED" -o "$d/out.gguf" --type tq2_0 >"$d/b.log" 2>&1 &
    pb=$!
    wait "$pa"; ra=$?
    wait "$pb"; rb=$?
    checks=$((checks + 1))
    if [ "$ra" != 0 ] || [ "$rb" != 0 ]; then
        fail "round $round: both concurrent converts succeed (exit $ra, $rb)"
        sed 's/^/  a: /' "$d/a.log"; sed 's/^/  b: /' "$d/b.log"
    fi
    checks=$((checks + 1))
    cmp -s "$d/out.gguf" "$d/ref_i2s.gguf" || cmp -s "$d/out.gguf" "$d/ref_tq2.gguf" ||
        fail "round $round: OUT is byte for byte one of the two conversions"
    run "$BITNET" inspect "$d/out.gguf"
    expect_rc 0 "round $round: inspect accepts OUT"
    rm -f "$d/a.log" "$d/b.log"
    check "round $round: no temporary file left" only_files "$d" ref_i2s.gguf ref_tq2.gguf out.gguf
done

# ---- interrupted converts ----------------------------------------------------------
# A bf16 model large enough that writing its F16 file takes a while
# (--type f16 writes 2 bytes per weight), built from repeated valid values.
d=$tmp/interrupt
mkdir "$d" "$d/big"
python3 - "$d/big" "$BF16/tokenizer.json" <<'EOF' || fail "build the large bf16 model"
import json, random, shutil, struct, sys
out, tok = sys.argv[1], sys.argv[2]
vocab, dim, ffn, layers, heads = 300, 512, 1536, 6, 8
cfg = {"architectures": ["BitNetForCausalLM"], "model_type": "bitnet", "bos_token_id": 297,
       "eos_token_id": 298, "hidden_act": "relu2", "hidden_size": dim,
       "intermediate_size": ffn, "max_position_embeddings": 128,
       "num_attention_heads": heads, "num_hidden_layers": layers,
       "num_key_value_heads": heads, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
       "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": vocab,
       "quantization_config": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                               "quantization_mode": "online"}}
json.dump(cfg, open(out + "/config.json", "w"))
shutil.copy(tok, out + "/tokenizer.json")
rng = random.Random(1)
def bf16(v): return struct.pack("<f", v)[2:]
pattern = b"".join(bf16(rng.choice((-1, 1)) * rng.uniform(0.005, 0.05)) for _ in range(4099))
one = bf16(1.0)
shapes = [("model.embed_tokens.weight", [vocab, dim], pattern), ("model.norm.weight", [dim], one)]
for l in range(layers):
    p = "model.layers.%d." % l
    shapes += [(p + "input_layernorm.weight", [dim], one),
               (p + "post_attention_layernorm.weight", [dim], one),
               (p + "self_attn.attn_sub_norm.weight", [dim], one),
               (p + "mlp.ffn_sub_norm.weight", [ffn], one)]
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        shapes.append((p + "self_attn." + n + ".weight", [dim, dim], pattern))
    shapes += [(p + "mlp.gate_proj.weight", [ffn, dim], pattern),
               (p + "mlp.up_proj.weight", [ffn, dim], pattern),
               (p + "mlp.down_proj.weight", [dim, ffn], pattern)]
header, blobs, off = {}, [], 0
for name, shape, unit in shapes:
    n = 1
    for s in shape: n *= s
    need = 2 * n
    data = (unit * (need // len(unit) + 1))[:need]
    header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + need]}
    blobs.append(data)
    off += need
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(out + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs: f.write(b)
EOF
run "$BITNET" convert "$d/big" -o "$d/ref_new.gguf" --type f16
expect_rc 0 "convert the large model uninterrupted"
run "$BITNET" convert "$PACKED" -o "$d/prev.gguf"
expect_rc 0 "the previous OUT"
# How long a whole convert takes here, so the signals land across it.
t0=$(date +%s%N)
"$BITNET" convert "$d/big" -o "$d/timing.gguf" --type f16 >/dev/null 2>&1
t1=$(date +%s%N)
rm -f "$d/timing.gguf"
dur_ms=$(( (t1 - t0) / 1000000 ))
[ "$dur_ms" -ge 1 ] || dur_ms=1
killed=0
# Job control, so that background jobs get SIGINT's default action rather
# than the "ignore" of a non-interactive shell; its job reports go to
# /dev/null with the rest of the shell's stderr (failures print to stdout).
exec 3>&2 2>/dev/null
set -m
for sig in INT TERM; do
    for pct in 5 15 30 45 60 75 90; do
        cp "$d/prev.gguf" "$d/out.gguf"
        "$BITNET" convert "$d/big" -o "$d/out.gguf" --type f16 >/dev/null 2>"$d/err.log" &
        pid=$!
        sleep "$(awk -v ms="$dur_ms" -v p="$pct" 'BEGIN { printf "%.4f", ms * p / 100000 }')"
        kill -s "$sig" "$pid" 2>/dev/null
        wait "$pid"
        r=$?
        what="SIG$sig at ${pct}% of ${dur_ms} ms (exit $r)"
        case $r in
        0) ;;                                        # finished before the signal
        130 | 143) killed=$((killed + 1)) ;;         # ended by the signal
        *) fail "$what: unexpected exit"; sed 's/^/  /' "$d/err.log" ;;
        esac
        # OUT is the previous file untouched, or the complete new one when the
        # signal came after the rename (or the convert had finished).
        checks=$((checks + 1))
        if [ "$r" = 0 ]; then
            cmp -s "$d/out.gguf" "$d/ref_new.gguf" || fail "$what: OUT is the complete new file"
        else
            cmp -s "$d/out.gguf" "$d/prev.gguf" || cmp -s "$d/out.gguf" "$d/ref_new.gguf" ||
                fail "$what: OUT is the previous file untouched or the complete new one"
        fi
        check "$what: no temporary file left" only_files "$d" big ref_new.gguf prev.gguf out.gguf err.log
    done
done
set +m
exec 2>&3 3>&-
checks=$((checks + 1))
[ "$killed" -gt 0 ] || fail "no signal landed while a convert ran (a whole convert took ${dur_ms} ms)"
echo "interrupted converts: $killed of 14 ended by the signal (a whole convert: ${dur_ms} ms)"

# ---- values outside the F16 range ----------------------------------------------------
d=$tmp/range
mkdir "$d"
# patch SRC DST TENSOR VALUE [all]: a copy of SRC with TENSOR's first element
# (or every element, signs alternating) set to VALUE in bf16.
patch() {
    python3 - "$@" <<'EOF'
import json, shutil, struct, sys
src, dst, name, value = sys.argv[1:5]
every = len(sys.argv) > 5
shutil.copytree(src, dst)
path = dst + "/model.safetensors"
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
t = json.loads(raw[8:8 + n])[name]
b, e = (8 + n + o for o in t["data_offsets"])
pos, neg = (struct.pack("<f", s * float(value))[2:] for s in (1, -1))
for i, at in enumerate(range(b, e if every else b + 2, 2)):
    raw[at:at + 2] = pos if i % 2 == 0 else neg
open(path, "wb").write(raw)
EOF
}
range_refused() { # dir type tensor-pattern what
    rm -f "$d/out.gguf"
    run "$BITNET" convert "$1" -o "$d/out.gguf" --type "$2"
    expect_rc 5 "$4 --type $2"
    expect_in err "$3.*outside the F16 range" "$4 --type $2: the error names the tensor and the range"
    check "$4 --type $2: nothing written" only_files "$d" emb head proj scale norm edge
}
patch "$BF16" "$d/emb" model.embed_tokens.weight 1e5
patch "$BF16" "$d/head" lm_head.weight -1e6
patch "$BF16" "$d/proj" model.layers.0.self_attn.q_proj.weight 1e5 all
patch "$PACKED" "$d/scale" model.layers.1.mlp.down_proj.weight_scale 1e5
patch "$BF16" "$d/norm" model.layers.0.input_layernorm.weight 1e5
patch "$BF16" "$d/edge" model.embed_tokens.weight 65280
# The directory itself runs: the values are finite.
run "$BITNET" run -m "$d/emb" --prompt-ids 1,2 -n 1 --temp 0 --device cpu
expect_rc 0 "run the directory with a large embedding value"
for t in i2_s tq2_0 f16; do
    range_refused "$d/emb" "$t" "token_embd.weight: the value at row 0, column 0 is 99840" \
        "embedding value 1e5"
    range_refused "$d/head" "$t" "output.weight: the value at row 0, column 0 is -999424" \
        "lm head value -1e6"
    range_refused "$d/proj" "$t" "blk.0.attn_q.weight: the scale" "projection values 1e5"
done
for t in tq2_0 tq1_0 f16; do
    range_refused "$d/scale" "$t" "blk.1.ffn_down.weight: the scale" "weight_scale 1e5"
done
# I2_S keeps the scale as float32: the same checkpoint converts and loads.
run "$BITNET" convert "$d/scale" -o "$d/out.gguf" --type i2_s
expect_rc 0 "weight_scale 1e5 --type i2_s (float32 scale)"
run "$BITNET" run -m "$d/out.gguf" --prompt-ids 1,2 -n 1 --temp 0 --device cpu
expect_rc 0 "run the i2_s file with a weight_scale of 1e5"
for case in norm edge; do
    rm -f "$d/out.gguf"
    run "$BITNET" convert "$d/$case" -o "$d/out.gguf" --type tq2_0
    expect_rc 0 "$case: convert"
    run "$BITNET" run -m "$d/out.gguf" --prompt-ids 1,2 -n 1 --temp 0 --device cpu
    expect_rc 0 "$case: run the converted file"
done

echo "$((checks - fails)) of $checks checks passed"
[ "$fails" = 0 ]
