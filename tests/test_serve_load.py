"""Load on bitnet serve (run by test_serve_load.sh): 2,000 requests from 64
client threads at once, well-formed ones (completions and chat, whole and
streamed) mixed with malformed ones and with streams the client leaves
after the first bytes. Every well-formed request must be answered with
200 and a whole answer, every malformed one with a 4xx error object; the
server's resident memory must come back within 10 % of its level after
a warm-up, and /metrics must show no active sequence and no queue once
the load ends. Standard library only; loopback; every wait bounded.
argv: base URL, the server's pid, and "check" or "skip" (a sanitizer
build: no memory comparison)."""
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

base, pid = sys.argv[1], int(sys.argv[2])
check_rss = len(sys.argv) < 4 or sys.argv[3] == "check"
host = urllib.parse.urlparse(base)
N_REQUESTS, N_CLIENTS, WARM_UP = 2000, 64, 200
PROMPTS = ["And it came to pass", "The LORD is my shepherd", "In the beginning",
           "Blessed are the meek", "Let there be light"]


def rss_kib():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def connection():
    return http.client.HTTPConnection(host.hostname, host.port, timeout=120)


def well_formed(rng):
    body = {"max_tokens": rng.randint(1, 8), "temperature": rng.choice([0, 0.8]),
            "seed": rng.randint(0, 1000)}
    if rng.random() < 0.5:
        path = "/v1/completions"
        body["prompt"] = rng.choice(PROMPTS)
    else:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": rng.choice(PROMPTS)}]
    body["stream"] = rng.random() < 0.4
    return path, body


MALFORMED = [
    ("/v1/completions", b"{\"prompt\": \"x\", "),
    ("/v1/completions", b"[1, 2, 3]"),
    ("/v1/completions", b"{\"prompt\": \"x\", \"max_tokens\": \"many\"}"),
    ("/v1/completions", b"{\"prompt\": \"x\", \"temperature\": -3}"),
    ("/v1/chat/completions", b"{\"messages\": \"hello\"}"),
    ("/v1/chat/completions", b"{\"messages\": [{\"role\": 7}]}"),
    ("/v1/completions", b"{\"prompt\": \"x\", \"model\": \"nope\"}"),
    ("/v1/completions", b"\xff\xfe\x00garbage"),
    ("/v1/nothing", b"{}"),
]

lock = threading.Lock()
stats = {"ok": 0, "bad_ok": 0, "left": 0}
failures = []
counter = iter(range(N_REQUESTS))
warm = threading.Event()
done_count = [0]


def fail(msg):
    with lock:
        if len(failures) < 20:
            failures.append(msg)


def one(i, rng):
    kind = rng.random()
    conn = connection()
    try:
        if kind < 0.1:  # malformed
            path, raw = MALFORMED[i % len(MALFORMED)]
            conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if not (400 <= resp.status < 500):
                fail(f"malformed {raw[:30]!r} to {path}: {resp.status}")
            elif "error" not in json.loads(data):
                fail(f"malformed {raw[:30]!r}: no error object")
            else:
                with lock:
                    stats["bad_ok"] += 1
        elif kind < 0.2:  # a stream the client leaves
            body = {"prompt": rng.choice(PROMPTS), "max_tokens": 200, "stream": True,
                    "ignore_eos": True}
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read(64)
            conn.sock.close()
            with lock:
                stats["left"] += 1
        else:
            path, body = well_formed(rng)
            conn.request("POST", path, body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read().decode()
            if resp.status != 200:
                fail(f"{path} {body}: status {resp.status}: {data[:200]}")
            elif body["stream"]:
                if not data.rstrip().endswith("data: [DONE]"):
                    fail(f"{path} stream did not end with [DONE]: {data[-200:]!r}")
                else:
                    with lock:
                        stats["ok"] += 1
            else:
                j = json.loads(data)
                if j["usage"]["completion_tokens"] > body["max_tokens"]:
                    fail(f"{path}: more tokens than max_tokens")
                else:
                    with lock:
                        stats["ok"] += 1
    except Exception as e:  # noqa: BLE001 - any client-side failure is a failed check
        fail(f"request {i}: {type(e).__name__}: {e}")
    finally:
        conn.close()


def client(seed):
    rng = random.Random(seed)
    while True:
        with lock:
            i = next(counter, None)
        if i is None:
            return
        one(i, rng)
        with lock:
            done_count[0] += 1
            if done_count[0] == WARM_UP:
                warm.set()


def metrics():
    conn = connection()
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines()
            if l and not l.startswith("#")}


t0 = time.time()
threads = [threading.Thread(target=client, args=(s,)) for s in range(N_CLIENTS)]
for t in threads:
    t.start()
warm.wait(timeout=300)
rss_warm = rss_kib()
for t in threads:
    t.join(timeout=600)
elapsed = time.time() - t0
# The load is over: no sequence runs, nothing waits (left streams are
# cancelled as their writes fail).
settled = False
for _ in range(100):
    m = metrics()
    if m.get("bitnet_active_sequences") == 0 and m.get("bitnet_queue_depth") == 0:
        settled = True
        break
    time.sleep(0.1)
rss_end = rss_kib()
print(f"{N_REQUESTS} requests from {N_CLIENTS} clients in {elapsed:.1f} s: "
      f"{stats['ok']} answered, {stats['bad_ok']} malformed refused, {stats['left']} left; "
      f"RSS {rss_warm} KiB after warm-up, {rss_end} KiB at the end")
ok = True
if failures:
    print("FAIL:", *failures, sep="\n  ")
    ok = False
if any(t.is_alive() for t in threads):
    print("FAIL: clients still running")
    ok = False
if stats["ok"] + stats["bad_ok"] + stats["left"] != N_REQUESTS:
    print("FAIL: not every request was answered")
    ok = False
if not settled:
    print(f"FAIL: after the load: {m}")
    ok = False
if check_rss and rss_end > rss_warm * 1.10:
    print(f"FAIL: RSS grew from {rss_warm} to {rss_end} KiB")
    ok = False
sys.exit(0 if ok else 1)
