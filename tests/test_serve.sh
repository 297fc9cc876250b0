#!/usr/bin/env bash
# bitnet serve as curl meets it, on the shipped model, loopback only:
# health, models, completions and chat (whole and streamed) whose greedy
# text equals `bitnet run --temp 0`, token-id prompts, stop strings,
# tokenize / detokenize, metrics, malformed requests (4xx with an OpenAI
# error object, the server going on), concurrent requests, a client that
# leaves mid-stream, the API key, a full queue (429), the body cap (413),
# --timeout (504) and SIGTERM (exit 0). Every wait is bounded.
# usage: test_serve.sh /path/to/bitnet
set -u
BITNET=${1:?usage: test_serve.sh BITNET}
. "$(dirname "$0")/serve_lib.sh"
serve_require "$BITNET"
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
fails=0
checks=0
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
unset BITNET_API_KEY BITNET_DEVICE
export BITNET_NUM_THREADS=2

check() { # condition-result what
    checks=$((checks + 1))
    if [ "$1" != 0 ]; then
        echo "FAIL: $2"
        fails=$((fails + 1))
    fi
}
# A JSON field of a file: json FILE EXPR (a Python expression over j).
json() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null; }

# Starts a server with the given options; sets url and pid (name: $1).
start() {
    local name=$1
    shift
    serve_start "$BITNET" "$tmp/$name.err" "$@"
    check $? "$name: the server is ready (stderr: $(head -c 300 "$tmp/$name.err"))"
    pids+=("$pid")
}
# post PATH BODY OUTFILE [curl options]: prints the HTTP status.
post() {
    local path=$1 body=$2 out=$3
    shift 3
    curl -s -o "$out" -w '%{http_code}' --max-time 60 -H 'Content-Type: application/json' \
        "$@" -d "$body" "$url$path"
}

start main --parallel 4 --max-queue 8 --batch-tokens 64
P="And it came to pass"

# ---- health, models, metrics ----
code=$(curl -s -o "$tmp/h" -w '%{http_code}' "$url/health")
check $([ "$code" = 200 ] && [ "$(json "$tmp/h" "j['status']")" = ok ]; echo $?) "GET /health is ok"
curl -s -o "$tmp/m" "$url/v1/models"
check $([ "$(json "$tmp/m" "j['data'][0]['id']")" = bitnet-kjv-7m-i2_s ]; echo $?) \
    "GET /v1/models names the model"
code=$(curl -s -o "$tmp/m1" -w '%{http_code}' "$url/v1/models/nope")
check $([ "$code" = 404 ]; echo $?) "GET /v1/models/nope is 404"

# ---- completions: greedy text equals bitnet run --temp 0 ----
"$BITNET" run -p "$P" -n 24 --temp 0 >"$tmp/run.txt" 2>/dev/null
code=$(post /v1/completions "{\"prompt\": \"$P\", \"max_tokens\": 24, \"temperature\": 0}" "$tmp/c")
text=$(json "$tmp/c" "j['choices'][0]['text']")
check $([ "$code" = 200 ] && [ "$text" = "$(cat "$tmp/run.txt")" ]; echo $?) \
    "completion equals bitnet run --temp 0 ('$text' / '$(cat "$tmp/run.txt")')"
check $([ "$(json "$tmp/c" "j['usage']['completion_tokens']")" = 24 ] &&
    [ "$(json "$tmp/c" "j['choices'][0]['finish_reason']")" = length ]; echo $?) \
    "completion usage and finish_reason"
# The same prompt as token ids.
post /tokenize "{\"content\": \"$P\", \"add_special\": true}" "$tmp/t" >/dev/null
ids=$(json "$tmp/t" "j['tokens']")
post /v1/completions "{\"prompt\": $ids, \"max_tokens\": 24, \"temperature\": 0}" "$tmp/c2" >/dev/null
check $([ "$(json "$tmp/c2" "j['choices'][0]['text']")" = "$text" ]; echo $?) \
    "a token-id prompt gives the text its string gives"
post /tokenize "{\"content\": \"$P\"}" "$tmp/t0" >/dev/null
post /detokenize "{\"tokens\": $(json "$tmp/t0" "j['tokens']")}" "$tmp/d" >/dev/null
check $([ "$(json "$tmp/d" "j['content']")" = "$P" ]; echo $?) "detokenize gives the text back"

# ---- stop strings ----
post /v1/completions "{\"prompt\": \"$P\", \"max_tokens\": 24, \"temperature\": 0, \"stop\": [\"LORD\"]}" \
    "$tmp/s" >/dev/null
stext=$(json "$tmp/s" "j['choices'][0]['text']")
check $([ "$(json "$tmp/s" "j['choices'][0]['finish_reason']")" = stop ] &&
    [ "${text#"$stext"}" != "$text" ] && [ "${stext/LORD/}" = "$stext" ]; echo $?) \
    "a stop string ends the text before it ('$stext')"

# ---- chat, whole and streamed ----
chat='{"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who made the earth?"}], "max_tokens": 16, "temperature": 0'
code=$(post /v1/chat/completions "$chat}" "$tmp/ch")
ctext=$(json "$tmp/ch" "j['choices'][0]['message']['content']")
check $([ "$code" = 200 ] && [ "$(json "$tmp/ch" "j['object']")" = chat.completion ] &&
    [ "$(json "$tmp/ch" "j['usage']['total_tokens'] == j['usage']['prompt_tokens'] + j['usage']['completion_tokens']")" = True ]; echo $?) \
    "chat completion with usage"
curl -sN --max-time 60 "$url/v1/chat/completions" -d "$chat, \"stream\": true}" >"$tmp/st"
python3 - "$tmp/st" "$ctext" <<'EOF'
import json, sys
lines = [l for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert lines[-1] == "data: [DONE]", lines[-1:]
chunks = [json.loads(l[6:]) for l in lines[:-1]]
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
assert text == sys.argv[2], (text, sys.argv[2])
assert chunks[-1]["choices"][0]["finish_reason"] == "length"
EOF
check $? "the streamed chat (server-sent events ending in [DONE]) equals the whole answer"

# ---- log-probabilities: chat's, the completions' legacy form, streamed ----
post /v1/chat/completions "$chat, \"logprobs\": true, \"top_logprobs\": 3}" "$tmp/lp" >/dev/null
python3 - "$tmp/lp" <<'EOF2'
import json, math, sys
j = json.load(open(sys.argv[1]))
c = j["choices"][0]
content = c["logprobs"]["content"]
assert len(content) == j["usage"]["completion_tokens"], (len(content), j["usage"])
assert b"".join(bytes(e["bytes"]) for e in content).decode() == c["message"]["content"]
for e in content:  # greedy: the token is the first of its alternatives
    assert len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["token"] == e["token"]
    assert e["logprob"] <= 0 and sum(math.exp(a["logprob"]) for a in e["top_logprobs"]) <= 1 + 1e-5
EOF2
check $? "chat log-probabilities: one entry a token, its bytes the text, greedy = first alternative"
post /v1/completions "{\"prompt\": \"$P\", \"max_tokens\": 8, \"temperature\": 0, \"logprobs\": 2}" \
    "$tmp/lpc" >/dev/null
curl -sN --max-time 60 "$url/v1/completions" \
    -d "{\"prompt\": \"$P\", \"max_tokens\": 8, \"temperature\": 0, \"logprobs\": 2, \"stream\": true}" \
    >"$tmp/lps"
python3 - "$tmp/lpc" "$tmp/lps" <<'EOF2'
import json, sys
c = json.load(open(sys.argv[1]))["choices"][0]
lp = c["logprobs"]
assert "".join(lp["tokens"]) == c["text"] and len(lp["token_logprobs"]) == 8
assert lp["text_offset"][0] == 0 and all(len(t) <= 2 for t in lp["top_logprobs"])
events = [json.loads(l[6:]) for l in open(sys.argv[2]).read().split("\n")
          if l.startswith("data: {")]
tokens = [t for e in events for ch in e["choices"] if ch.get("logprobs")
          for t in ch["logprobs"]["tokens"]]
assert tokens == lp["tokens"], (tokens, lp["tokens"])
EOF2
check $? "completion log-probabilities, whole and streamed"

# ---- n choices: choice k is the request with seed + k; streamed, one [DONE] ----
post /v1/completions "{\"prompt\": \"$P\", \"max_tokens\": 8, \"temperature\": 0.9, \"seed\": 5, \"n\": 3}" \
    "$tmp/n3" >/dev/null
post /v1/completions "{\"prompt\": \"$P\", \"max_tokens\": 8, \"temperature\": 0.9, \"seed\": 7}" \
    "$tmp/s7" >/dev/null
check $([ "$(json "$tmp/n3" "len(j['choices'])")" = 3 ] &&
    [ "$(json "$tmp/n3" "j['choices'][2]['text']")" = "$(json "$tmp/s7" "j['choices'][0]['text']")" ] &&
    [ "$(json "$tmp/n3" "j['usage']['completion_tokens']")" = 24 ]; echo $?) \
    "n = 3: three choices, the third the request with seed + 2, usage over all"
curl -sN --max-time 60 "$url/v1/chat/completions" -d "$chat, \"n\": 2, \"stream\": true}" >"$tmp/n2"
python3 - "$tmp/n2" "$ctext" <<'EOF2'
import json, sys
lines = [l for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
text = {0: "", 1: ""}
for e in (json.loads(l[6:]) for l in lines[:-1]):
    for c in e["choices"]:
        text[c["index"]] += c["delta"].get("content", "")
assert text[0] == text[1] == sys.argv[2], text
EOF2
check $? "n = 2 streamed: both greedy choices equal the single answer"

# ---- malformed requests: 4xx with an error object, the server goes on ----
bad() { # expected-status path body what
    local code
    code=$(post "$2" "$3" "$tmp/e")
    check $([ "$code" = "$1" ] && [ -n "$(json "$tmp/e" "j['error']['message']")" ]; echo $?) \
        "$4: $code, expected $1"
}
bad 400 /v1/completions '{"prompt": "x", "max_tokens": ' "malformed JSON"
bad 400 /v1/completions '[1, 2]' "not an object"
bad 400 /v1/completions '{"prompt": "x", "temperature": "hot"}' "a string temperature"
bad 400 /v1/completions '{"prompt": "x", "max_tokens": 0}' "max_tokens 0"
bad 400 /v1/completions '{"prompt": "x", "n": 17}' "n = 17"
bad 400 /v1/completions '{"prompt": [1, -4]}' "a negative token id"
bad 400 /v1/completions '{"prompt": "x", "stop": [""]}' "an empty stop string"
bad 400 /v1/chat/completions '{"messages": []}' "no messages"
bad 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}' \
    "top_logprobs without logprobs"
bad 400 /v1/completions '{"prompt": "x", "logprobs": 6}' "completions logprobs above 5"
bad 400 /v1/chat/completions '{"messages": [{"role": "wizard", "content": "hi"}]}' "an unknown role"
bad 404 /v1/completions '{"prompt": "x", "model": "gpt-4"}' "an unknown model"
long=$(python3 -c 'print([7] * 600)')
bad 400 /v1/completions "{\"prompt\": $long}" "a prompt longer than the context"
bad 404 /v2/anything '{}' "an unknown route"
code=$(curl -s -o "$tmp/e" -w '%{http_code}' "$url/v1/chat/completions")
check $([ "$code" = 405 ]; echo $?) "GET on a POST route is 405"
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/health")
check $([ "$code" = 200 ]; echo $?) "the server answers after the malformed requests"

# ---- concurrent requests: each answer is its own ----
clients=()
for i in $(seq 1 12); do
    post /v1/completions "{\"prompt\": \"$P\", \"max_tokens\": 24, \"temperature\": 0}" \
        "$tmp/p$i" >"$tmp/p$i.code" &
    clients+=($!)
done
wait "${clients[@]}"
same=0
for i in $(seq 1 12); do
    [ "$(cat "$tmp/p$i.code")" = 200 ] && [ "$(json "$tmp/p$i" "j['choices'][0]['text']")" = "$text" ] &&
        same=$((same + 1))
done
check $([ "$same" = 12 ]; echo $?) "12 concurrent requests each get the text alone ($same of 12)"

# ---- a client that leaves mid-stream: its sequence is cancelled ----
curl -sN --max-time 30 "$url/v1/completions" \
    -d "{\"prompt\": \"$P\", \"max_tokens\": 480, \"stream\": true, \"ignore_eos\": true}" |
    head -c 300 >/dev/null
ok=1
for _ in $(seq 1 100); do
    curl -s "$url/metrics" >"$tmp/metrics"
    if grep -q '^bitnet_active_sequences 0$' "$tmp/metrics" &&
        grep -q '^bitnet_client_disconnects_total [1-9]' "$tmp/metrics"; then
        ok=0
        break
    fi
    sleep 0.1
done
check $ok "a client leaving a stream cancels it (metrics: active 0, a disconnect)"
grep -q '^bitnet_time_to_first_token_seconds_count [1-9]' "$tmp/metrics"
check $? "metrics carry the time to first token histogram"
grep -q '^bitnet_kv_blocks{state="used"} 0$' "$tmp/metrics" &&
    grep -q '^bitnet_kv_blocks{state="total"} [1-9]' "$tmp/metrics"
check $? "metrics: the KV cache's blocks, none held once the requests end"
grep -qE '^bitnet_scheduler_seconds_total\{part="forward"\} [0-9.]*[1-9]' "$tmp/metrics" &&
    grep -qE '^bitnet_scheduler_seconds_total\{part="tokens"\} [0-9.]+$' "$tmp/metrics" &&
    grep -qE '^bitnet_forward_passes_total [1-9][0-9]*$' "$tmp/metrics"
check $? "metrics: the scheduler's time in forward passes and handing out tokens"
grep -qE '^POST /v1/completions 200 [0-9]+\+24 tokens [0-9]+ ms$' "$tmp/main.err"
check $? "one log line per request"

# ---- SIGTERM: stop, exit 0 ----
serve_stop TERM
check $([ "$rc" = 0 ] && grep -q 'bitnet serve: stopped' "$tmp/main.err"; echo $?) \
    "SIGTERM stops the server with exit 0 (rc $rc)"

# ---- the API key, the queue, the body cap ----
BITNET_API_KEY=sekret start keyed --parallel 2 --max-queue 0 --max-body-kib 1
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/models")
check $([ "$code" = 401 ]; echo $?) "no key: 401"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' "$url/v1/models")
check $([ "$code" = 401 ]; echo $?) "a wrong key: 401"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sekret' "$url/v1/models")
check $([ "$code" = 200 ]; echo $?) "the key: 200"
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/health")
check $([ "$code" = 200 ]; echo $?) "/health needs no key"
big=$(python3 -c 'print("x" * 4000)')
code=$(post /v1/completions "{\"prompt\": \"$big\"}" "$tmp/e" -H 'Authorization: Bearer sekret')
check $([ "$code" = 413 ]; echo $?) "a body over --max-body-kib: 413 ($code)"
# Both slots taken by streams of 480 tokens, then one more request: 429.
# The shipped model writes 480 tokens in well under a second on a fast
# machine, so a try counts only while both streams are still being sent
# when the answer comes; up to five tries.
code=none
for _ in 1 2 3 4 5; do
    busy=()
    for _ in 1 2; do
        curl -sN --max-time 30 -H 'Authorization: Bearer sekret' "$url/v1/completions" \
            -d "{\"prompt\": \"$P\", \"max_tokens\": 480, \"stream\": true, \"ignore_eos\": true}" \
            >/dev/null &
        busy+=($!)
    done
    for _ in $(seq 1 200); do
        curl -s "$url/metrics" | grep -q '^bitnet_active_sequences 2$' && break
        sleep 0.02
    done
    code=$(curl -s -D "$tmp/hdr" -o "$tmp/e" -w '%{http_code}' -H 'Authorization: Bearer sekret' \
        "$url/v1/completions" -d "{\"prompt\": \"$P\", \"max_tokens\": 4}")
    both=0
    kill -0 "${busy[0]}" 2>/dev/null && kill -0 "${busy[1]}" 2>/dev/null && both=1
    kill "${busy[@]}" 2>/dev/null
    wait "${busy[@]}" 2>/dev/null
    [ "$code" = 429 ] || [ "$both" = 1 ] && break
done
check $([ "$code" = 429 ] && grep -qi '^Retry-After: 1' "$tmp/hdr"; echo $?) \
    "a full queue: 429 with Retry-After ($code)"
serve_stop INT
check $([ "$rc" = 0 ]; echo $?) "SIGINT stops the server with exit 0 (rc $rc)"

# ---- --timeout: a request past it gets 504 ----
start slow --parallel 1 --timeout 0.02
code=$(post /v1/completions "{\"prompt\": \"$P\", \"max_tokens\": 480, \"ignore_eos\": true}" "$tmp/e")
check $([ "$code" = 504 ] && [ "$(json "$tmp/e" "j['error']['type']")" = timeout ]; echo $?) \
    "a request past --timeout: 504 ($code)"
serve_stop TERM
check $([ "$rc" = 0 ]; echo $?) "the third server stops with exit 0 (rc $rc)"

echo "ok: $checks checks, $fails failed"
[ "$fails" = 0 ]
