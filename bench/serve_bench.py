#!/usr/bin/env python3
"""bitnet serve under streaming clients: for each count of concurrent
clients, every client sends streamed completions back to back (a fixed
prompt, a fixed number of generated tokens, end of text ignored) until it
has sent its share of the requests; prints requests/s, output tokens/s and
the time to first token (p50, p99) a count. Standard library only.

    bench/serve_bench.py URL [--clients 1,16,64,256] [--requests N]
                             [--tokens N] [--prompt TEXT | --prompt-ids N]

URL is the server's base (http://127.0.0.1:8080). Nothing passes or fails.
docs/PERFORMANCE.md has figures."""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def stream_one(host, port, body):
    """One streamed completion: (seconds to the first text, tokens, seconds)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
    first, tokens, buf = None, 0, b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            # Parse only what is needed (the first text, the usage): at
            # tens of thousands of events a second the client's own JSON
            # work would otherwise be measured.
            if first is None:
                j = json.loads(event[6:])
                if j.get("choices") and j["choices"][0].get("text"):
                    first = time.perf_counter() - t0
            if b'"usage"' in event:
                j = json.loads(event[6:])
                if j.get("usage"):
                    tokens = j["usage"]["completion_tokens"]
    conn.close()
    return first if first is not None else time.perf_counter() - t0, tokens, \
        time.perf_counter() - t0


def run(url, clients, requests, tokens, prompt):
    """prompt: text, or a number of token ids (each request its own ids, so
    no two prompts share a prefix, as in `bitnet bench batch`)."""
    u = urllib.parse.urlparse(url)

    def body(k):
        p = prompt if isinstance(prompt, str) else \
            [100 + (k * 131 + i * 7) % 3900 for i in range(prompt)]
        return json.dumps({"prompt": p, "max_tokens": tokens, "temperature": 0,
                           "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True}})
    lock = threading.Lock()
    ttft, out_tokens, errors = [], [0], []
    left = [requests]

    def client():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
                k = left[0]
            try:
                first, n, _ = stream_one(u.hostname, u.port, body(k))
                with lock:
                    ttft.append(first)
                    out_tokens[0] += n
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft.sort()
    p99 = ttft[min(len(ttft) - 1, int(0.99 * (len(ttft) - 1) + 0.5))] if ttft else 0.0
    print(f"{clients:7d} {requests:8d} {len(ttft) / wall:10.2f} {out_tokens[0] / wall:12.1f} "
          f"{statistics.median(ttft) * 1e3 if ttft else 0:10.1f} {p99 * 1e3:10.1f} "
          f"{wall:8.2f} {len(errors):6d}", flush=True)
    if errors:
        print("  first error:", errors[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--clients", default="1,16,64,256")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests a count (default: 4 per client, at least 16)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", default="And it came to pass")
    ap.add_argument("--prompt-ids", type=int, default=0,
                    help="send N token ids (below 4000, different for every request) as "
                         "the prompt instead of --prompt")
    a = ap.parse_args()
    prompt = a.prompt_ids if a.prompt_ids > 0 else a.prompt
    print(f"bitnet serve bench: {a.url}, streamed completions of {a.tokens} tokens, greedy")
    print(f"{'clients':>7} {'requests':>8} {'requests/s':>10} {'out tok/s':>12} "
          f"{'ttft p50':>10} {'ttft p99':>10} {'wall s':>8} {'errors':>6}")
    for c in (int(x) for x in a.clients.split(",")):
        run(a.url, c, a.requests or max(16, 4 * c), a.tokens, prompt)


if __name__ == "__main__":
    main()
