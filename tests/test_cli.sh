#!/usr/bin/env bash
# The bitnet CLI as a user meets it: help, version, devices in text and
# JSON, fake and strict GPU modes, and errors with their exit codes.
# usage: test_cli.sh /path/to/bitnet
set -u
BITNET=${1:?usage: test_cli.sh BITNET}
fails=0
checks=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Run with a clean BITNET_* environment plus the given assignments.
run() {
    env $(env | sed -n 's/^\(BITNET_[A-Z_]*\)=.*/-u \1/p') "$@" >"$tmp/out" 2>"$tmp/err"
    echo $? >"$tmp/rc"
}
rc() { cat "$tmp/rc"; }
expect_rc() {
    checks=$((checks + 1))
    if [ "$(rc)" != "$1" ]; then
        echo "FAIL: $2: exit code $(rc), expected $1"; sed 's/^/  err: /' "$tmp/err"
        fails=$((fails + 1))
    fi
}
expect_in() { # file pattern what
    checks=$((checks + 1))
    if ! grep -qE -- "$2" "$tmp/$1"; then
        echo "FAIL: $3: '$2' not in $1"; sed 's/^/  /' "$tmp/$1" | head -40
        fails=$((fails + 1))
    fi
}
expect_not_in() {
    checks=$((checks + 1))
    if grep -qE -- "$2" "$tmp/$1"; then
        echo "FAIL: $3: '$2' found in $1"; sed 's/^/  /' "$tmp/$1" | head -40
        fails=$((fails + 1))
    fi
}

run "$BITNET" --help
expect_rc 0 "--help"
expect_in out "exit codes" "--help documents exit codes"
expect_in out "BITNET_MEMORY_LIMIT" "--help lists variables"
expect_in out "devices" "--help lists commands"

run "$BITNET" --version
expect_rc 0 "--version"
expect_in out "^bitnet [0-9]+\.[0-9]+\.[0-9]+$" "--version format"

run "$BITNET"
expect_rc 2 "no command"
run "$BITNET" frobnicate
expect_rc 2 "unknown command"
expect_in err "unknown command 'frobnicate'" "unknown command message"
run "$BITNET" devices --bogus
expect_rc 2 "unknown option"
run "$BITNET" devices --help
expect_rc 0 "devices --help"
expect_in out "--json" "devices --help mentions --json"

# Real detection: must start and explain itself whatever this machine has.
run "$BITNET" devices
expect_rc 0 "devices"
expect_in out "^GPU backends" "devices report"
expect_in out "^Preflight" "preflight section"
expect_in out "^CPU" "cpu section"
expect_in out "features:" "cpu features"
expect_in out "^Host memory" "host memory section"
expect_in out "^  cuda +(available|unavailable)" "cuda line"
expect_not_in out "fake" "no fake without BITNET_GPU_FAKE"
expect_in out "^Kernel providers" "kernel providers section"
# Vulkan: its devices (lavapipe where Mesa's driver is installed), or why
# there are none (a build without Vulkan, no loader, no driver).
expect_in out "^Vulkan devices" "vulkan section"
expect_in out "^  (vulkan:0  .+\((discrete|integrated|virtual|cpu|other)\)|none: .+)" \
    "a vulkan device, or why there is none"
expect_in out "^  scalar +available" "scalar provider listed"
expect_in out "\(selected\)" "a provider is selected"

run BITNET_KERNEL=scalar "$BITNET" devices
expect_rc 0 "BITNET_KERNEL=scalar"
expect_in out "^  scalar +available \(selected\)" "BITNET_KERNEL picks the provider"
run BITNET_KERNEL=sse9 "$BITNET" devices
expect_rc 3 "BITNET_KERNEL=sse9 is malformed"

run "$BITNET" bench --help
expect_rc 0 "bench --help"
expect_in out "kernels" "bench lists kernels"
run "$BITNET" bench kernels --m 0
expect_rc 2 "bench kernels bad --m"
# The GPU benchmark's options are checked before any device is looked for
# (a build without CUDA says so instead).
for bad in "--kernel bogus" "--kernel gemv" "--split 3"; do
    run "$BITNET" bench kernels --device cuda $bad
    if ! grep -q "no CUDA support" "$tmp/err"; then
        expect_rc 2 "bench kernels --device cuda $bad"
        expect_in err "bad or missing value for ${bad%% *}" "bench kernels $bad names the option"
    fi
done
# --providers names only providers this build has: a typo times nothing.
run "$BITNET" bench kernels --providers bogus --min-time 0.01
expect_rc 2 "bench kernels --providers bogus"
expect_in err "no kernel provider 'bogus' \(this build has .*scalar" \
    "bench kernels names the providers it has"
expect_not_in out "\| bogus" "nothing benchmarked for an unknown provider"
run "$BITNET" bench kernels --providers scalar,bogus --min-time 0.01
expect_rc 2 "bench kernels --providers with one unknown name"
run "$BITNET" bench kernels --device tpu
expect_rc 2 "bench kernels --device tpu"
expect_in err "must be cpu, cuda or cuda:N" "bench kernels names the devices it takes"
# cuda:N past the devices there are: a device error (no GPU here, or too few),
# or the build's missing CUDA support.
run "$BITNET" bench kernels --device cuda:63
expect_rc 4 "bench kernels --device cuda:63"
run "$BITNET" bench kernels --shapes 64x256 --m 1,3 --threads 1 --min-time 0.01 --rotate-mib 0
expect_rc 0 "tiny bench run"
expect_in out "^\| scalar \| 64x256 \| 3 \|" "bench prints the scalar row"

run "$BITNET" devices --json
expect_rc 0 "devices --json"
checks=$((checks + 1))
if ! python3 -m json.tool "$tmp/out" >/dev/null 2>"$tmp/jerr"; then
    echo "FAIL: devices --json is not valid JSON"; cat "$tmp/jerr"; fails=$((fails + 1))
fi
expect_in out '"preflight"' "json preflight"
checks=$((checks + 1))
python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))["vulkan"]
assert isinstance(v["compiled"], bool) and isinstance(v["devices"], list)
assert v["devices"] or v["reason"]' "$tmp/out" ||
    { echo "FAIL: devices --json: a vulkan object with its devices or why none"; fails=$((fails + 1)); }
expect_in out '"cpu"' "json cpu"

# Fake and strict modes.
run BITNET_GPU_FAKE=cuda "$BITNET" devices
expect_rc 0 "fake cuda"
expect_in out "^  cuda +fake" "fake cuda reported"
run BITNET_GPU_FAKE=cuda BITNET_STRICT_MODE=1 "$BITNET" devices
expect_rc 0 "fake cuda, strict"
expect_not_in out "^  cuda +fake" "strict mode removes the fake"
expect_in out "ignored" "strict mode says the fake was ignored"
run BITNET_GPU_FAKE=cuda,rocm "$BITNET" devices --json
expect_in out '"fake": true' "json marks fakes"
run BITNET_GPU_FAKE=cuda BITNET_STRICT_NO_FAKE_GPU=1 "$BITNET" devices
expect_rc 4 "strict no fake"
expect_in err "BITNET_STRICT_NO_FAKE_GPU" "strict no fake names the variable"

# Malformed environment values.
run BITNET_NUM_THREADS=abc "$BITNET" devices
expect_rc 3 "BITNET_NUM_THREADS=abc"
expect_in err "BITNET_NUM_THREADS='abc'" "error names the variable"
expect_in err "expected" "error gives the accepted form"
run BITNET_MEMORY_LIMIT=2XB "$BITNET" devices
expect_rc 3 "BITNET_MEMORY_LIMIT=2XB"
run BITNET_GPU_FAKE=tpu "$BITNET" devices
expect_rc 3 "BITNET_GPU_FAKE=tpu"
run BITNET_NUM_THREADS=abc "$BITNET" --help
expect_rc 0 "--help works under a bad environment"
run BITNET_NUM_THRAEDS=4 "$BITNET" devices
expect_rc 0 "unknown variable is not fatal"
expect_in err "unknown environment variable BITNET_NUM_THRAEDS" "unknown variable is warned"

# Tensor parallelism: documented, its value checked, refused off CUDA (the
# request is judged before the model is read).
run "$BITNET" run --help
expect_in out "--tensor-parallel N" "run --help documents --tensor-parallel"
run "$BITNET" serve --help
expect_in out "--tensor-parallel N" "serve --help documents --tensor-parallel"
for bad in 0 17 two; do
    run "$BITNET" run -p hi -n 1 --tensor-parallel $bad
    expect_rc 2 "--tensor-parallel $bad"
done
run "$BITNET" run -p hi -n 1 --device cpu --tensor-parallel 2
expect_rc 4 "--tensor-parallel 2 on the CPU"
expect_in err "tensor parallelism" "--tensor-parallel 2 on the CPU says why"
run "$BITNET" bench e2e --shape tiny --device cpu --tensor-parallel 2 --prompt 4 --gen 2
expect_rc 4 "bench e2e --tensor-parallel 2 on the CPU"
run "$BITNET" run -p hi -n 1 --device cpu --tensor-parallel 1
expect_rc 0 "--tensor-parallel 1 is the usual path"

# The rows of a shared pass: documented, the value checked before anything
# is loaded.
run "$BITNET" serve --help
expect_in out "--batch-tokens N" "serve --help documents --batch-tokens"
run "$BITNET" run --help
expect_in out "--batch-tokens N" "run --help documents --batch-tokens"
for bad in 0 -3 1048577 many; do
    run "$BITNET" serve --port 0 --batch-tokens $bad
    expect_rc 2 "serve --batch-tokens $bad"
    expect_in err "--batch-tokens" "serve --batch-tokens $bad is named"
done
run "$BITNET" bench batch --help
expect_in out "--batch-tokens N" "bench batch --help documents --batch-tokens"

echo "$checks checks, $fails failed"
[ "$fails" -eq 0 ]
