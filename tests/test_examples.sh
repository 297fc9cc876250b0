#!/usr/bin/env bash
# The examples (examples/*.c) built as an application outside the tree
# would build them: against the library `cmake --install` put under a
# prefix, with the flags `pkg-config bitnet` gives, from a folder outside
# that prefix. Then:
#   - simple (shared and static) prints byte for byte what the installed
#     `bitnet run --temp 0 -p P -n N` prints into a file, for two prompts
#     with the installed default model (and one on a test fixture); a model
#     that cannot be opened is an error on stderr with nothing on stdout;
#   - embed_in_app runs its checks on the default model, found under the
#     prefix (share/bitnet/models) beside the installed library;
#   - chat, on the default model and on a test fixture, given two turns,
#     /reset and the first turn again: with a chat format, the first answer
#     is `bitnet run --chat`'s and the answer after /reset is the first
#     answer again; without one, it exits with the library's error before
#     reading anything.
# usage: test_examples.sh BUILD_DIR SOURCE_DIR DATA_DIR
set -uo pipefail
build=${1:?usage: test_examples.sh BUILD_DIR SOURCE_DIR DATA_DIR}
src=${2:?usage: test_examples.sh BUILD_DIR SOURCE_DIR DATA_DIR}
data=${3:?usage: test_examples.sh BUILD_DIR SOURCE_DIR DATA_DIR}
src=$(realpath "$src")
data=$(realpath "$data")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tmp=$(realpath "$tmp")
prefix=$tmp/prefix
app=$tmp/app # the programs live here, outside the prefix
mkdir -p "$app"
fails=0
checks=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
die() {
    echo "FAIL: $*"
    exit 1
}

cmake --install "$build" --prefix "$prefix" >/dev/null || die "cmake --install failed"
pc=$(find "$prefix" -name bitnet.pc | head -1)
[ -n "$pc" ] || die "bitnet.pc not installed"
libdir=$(cd "$(dirname "$pc")/.." && pwd)
bitnet=$prefix/bin/bitnet
model=$prefix/share/bitnet/models/bitnet-kjv-7m/bitnet-kjv-7m-i2_s.gguf
[ -x "$bitnet" ] || die "bitnet CLI not installed"
[ -f "$model" ] || die "default model not installed"
command -v pkg-config >/dev/null || die "pkg-config is needed"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --variable=libdir bitnet)" -ef "$libdir" ] ||
    die "pkg-config's libdir $(pkg-config --variable=libdir bitnet) is not $libdir"

# Build: shared (the library found through its rpath, as an app installed
# elsewhere would), and simple also static.
cc=${CC:-cc}
for ex in simple chat embed_in_app; do
    $cc -std=c11 -Wall -Wextra "$src/examples/$ex.c" -o "$app/$ex" \
        $(pkg-config --cflags --libs bitnet) -Wl,-rpath,"$libdir" ||
        die "cannot build examples/$ex.c against the installed shared library"
done
private_libs=$(pkg-config --libs --static bitnet | sed 's/-lbitnet//')
$cc -std=c11 -Wall -Wextra "$src/examples/simple.c" -o "$app/simple_static" \
    $(pkg-config --cflags bitnet) "$libdir/libbitnet.a" $private_libs ||
    die "cannot build examples/simple.c against the installed static library"
echo "built simple, chat, embed_in_app (shared) and simple (static) with pkg-config"

# Every run without the caller's BITNET_* variables (but with the given
# ones), from a folder that is neither the tree nor the prefix.
run() { # out err command...
    local out=$1 err=$2
    shift 2
    (cd "$app" && env $(env | sed -n 's/^\(BITNET_[A-Z_]*\)=.*/-u \1/p') "$@" \
        >"$out" 2>"$err" </dev/null)
}
show() { sed 's/^/  | /' "$1" | head -${2:-15}; }

# ---- simple == bitnet run -------------------------------------------------
same_as_run() { # label n prompt model|"" [VAR=value...]
    local label=$1 n=$2 prompt=$3 m=()
    [ -n "$4" ] && m=(-m "$4")
    shift 4
    if ! run "$tmp/run.out" "$tmp/run.err" "$@" "$bitnet" run ${m[@]+"${m[@]}"} --temp 0 -p "$prompt" -n "$n"; then
        checks=$((checks + 1))
        fail "$label: bitnet run failed"
        show "$tmp/run.err"
        return
    fi
    for exe in simple simple_static; do
        checks=$((checks + 1))
        if [ ! -s "$tmp/run.out" ]; then
            fail "$label: bitnet run printed nothing, nothing to compare"
        elif ! run "$tmp/ex.out" "$tmp/ex.err" "$@" "$app/$exe" ${m[@]+"${m[@]}"} -p "$prompt" -n "$n"; then
            fail "$label: $exe failed"
            show "$tmp/ex.err"
        elif ! cmp -s "$tmp/run.out" "$tmp/ex.out"; then
            fail "$label: $exe -p '$prompt' -n $n: stdout differs from bitnet run's:" \
                "$(cmp "$tmp/run.out" "$tmp/ex.out" 2>&1)"
            echo "  bitnet run's last bytes: $(tail -c 32 "$tmp/run.out" | od -An -c | tr -d "\n" | tr -s " ")"
            echo "  $exe's last bytes: $(tail -c 32 "$tmp/ex.out" | od -An -c | tr -d "\n" | tr -s " ")"
        else
            echo "ok: $exe == bitnet run --temp 0 -n $n -p '$prompt' ($label, $(wc -c <"$tmp/run.out") bytes)"
        fi
    done
}
same_as_run "default model, auto device" 32 "And it came to pass" ""
same_as_run "default model, auto device" 48 "The LORD is my shepherd" ""
same_as_run "default model, BITNET_DEVICE=cpu" 32 "And it came to pass" "" BITNET_DEVICE=cpu
# A fixture whose text is mostly bytes that are not UTF-8 (U+FFFD).
same_as_run "fixture i2s.gguf" 24 "Hello world" "$data/models/i2s.gguf"

checks=$((checks + 1))
run "$tmp/ex.out" "$tmp/ex.err" "$app/simple" -m "$tmp/no-such-model.gguf" -p "x" -n 4
rc=$?
if [ $rc = 0 ] || [ -s "$tmp/ex.out" ] || ! grep -q '^simple: error: .*no-such-model' "$tmp/ex.err"; then
    fail "simple on a missing model: exit $rc, expected an error naming it on stderr only"
    show "$tmp/ex.out"
    show "$tmp/ex.err"
else
    echo "ok: simple on a missing model: exit $rc, '$(head -1 "$tmp/ex.err")'"
fi

# ---- embed_in_app ------------------------------------------------------------
run "$tmp/embed.out" "$tmp/embed.err" "$app/embed_in_app"
rc=$?
checks=$((checks + 1))
if ! grep -qxF "model: $model" "$tmp/embed.out"; then
    fail "embed_in_app did not open the installed default model $model"
    show "$tmp/embed.out" 3
    show "$tmp/embed.err"
else
    echo "ok: embed_in_app opened the default model under the prefix, beside the library"
fi
checks=$((checks + 1))
if [ $rc != 0 ] || [ "$(tail -1 "$tmp/embed.out")" != ok ]; then
    fail "embed_in_app: exit $rc, its checks did not all pass"
    show "$tmp/embed.out" 30
    show "$tmp/embed.err"
else
    echo "ok: embed_in_app:"
    show "$tmp/embed.out" 30
fi

# ---- chat ----------------------------------------------------------------------
chat_check() { # label model
    local label=$1 m=$2
    checks=$((checks + 1))
    # The model's chat format, as embed_in_app prints it first thing (its
    # own checks are the test above).
    run "$tmp/info.out" "$tmp/info.err" "$app/embed_in_app" "$m"
    local format
    format=$(sed -n 's/^chat format: //p' "$tmp/info.out")
    if [ -z "$format" ]; then
        fail "$label: embed_in_app cannot open $m"
        show "$tmp/info.err"
        return
    fi
    local first="In the beginning" second="And what then?"
    printf '%s\n%s\n/reset\n%s\n' "$first" "$second" "$first" >"$tmp/chat.in"
    (cd "$app" && env $(env | sed -n 's/^\(BITNET_[A-Z_]*\)=.*/-u \1/p') \
        "$app/chat" -m "$m" -n 24 <"$tmp/chat.in" >"$tmp/chat.out" 2>"$tmp/chat.err")
    local rc=$?
    if [ "$format" = "(none)" ]; then
        # The library's error, before any input is read.
        if [ $rc = 0 ] || [ -s "$tmp/chat.out" ] || ! grep -q '^chat: error: ' "$tmp/chat.err"; then
            fail "$label: chat on a model without a chat format: exit $rc, expected the library's error"
            show "$tmp/chat.out"
            show "$tmp/chat.err"
        else
            echo "ok: $label: no chat format; chat exits $rc: $(head -1 "$tmp/chat.err")"
        fi
        return
    fi
    if [ $rc != 0 ]; then
        fail "$label: chat exit $rc on a model with chat format '$format'"
        show "$tmp/chat.err"
        return
    fi
    # The first answer is bitnet run --chat's (greedy, 24 tokens at most).
    if ! run "$tmp/a1" "$tmp/a1.err" "$bitnet" run -m "$m" --chat -p "$first" --temp 0 -n 24; then
        fail "$label: bitnet run --chat failed"
        show "$tmp/a1.err"
        return
    fi
    printf '\n' >>"$tmp/a1" # chat ends each answer with a newline
    local n1 n
    n1=$(wc -c <"$tmp/a1")
    n=$(wc -c <"$tmp/chat.out")
    # stdout: answer 1, answer 2, answer 1 again (after /reset), each + "\n".
    if [ "$n" -lt $((2 * n1 + 1)) ] ||
        ! cmp -s -n "$n1" "$tmp/a1" "$tmp/chat.out" ||
        ! cmp -s "$tmp/a1" <(tail -c "$n1" "$tmp/chat.out") ||
        [ "$(head -c $((n - n1)) "$tmp/chat.out" | tail -c 1 | od -An -c | tr -d ' ')" != '\n' ]; then
        fail "$label: chat's answers are not: bitnet run --chat's, a second one, the first again"
        echo "  bitnet run --chat:"
        show "$tmp/a1"
        echo "  chat:"
        show "$tmp/chat.out"
        return
    fi
    echo "ok: $label: chat format '$format'; answer 1 == bitnet run --chat ($((n1 - 1)) bytes)," \
        "answer 2 $((n - 2 * n1 - 1)) bytes, /reset gives answer 1 again"
}
chat_check "default model" "$model"
chat_check "fixture i2s.gguf" "$data/models/i2s.gguf"

if [ $fails -gt 0 ]; then
    echo "$fails of $checks checks failed"
    exit 1
fi
echo "ok: $checks checks: examples built with pkg-config against the installed library"
