"""examples/ray_serve with a local Ray instance (run by test_ray_serve.sh):
2 CPU replicas of the shipped model behind one route; 16 concurrent
requests, loopback only, every one answered with the text `bitnet run
--temp 0` prints, and both replicas answering. argv: the source tree, the
file with bitnet run's text, a free port."""
import json
import os
import sys
import threading
import urllib.request

import ray
from ray import serve

src, want_file, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
want = open(want_file, encoding="utf-8").read()
sys.path.insert(0, os.path.join(src, "examples", "ray_serve"))
env = {k: os.environ[k] for k in ("BITNET_LIBRARY", "PYTHONPATH") if k in os.environ}
env["BITNET_NUM_THREADS"] = "1"
ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env},
         logging_level="ERROR")
try:
    import serve_bitnet

    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(serve_bitnet.app(replicas=2), route_prefix="/v1/completions")
    results, errors = [], []

    def one(k):
        body = json.dumps({"prompt": "And it came to pass", "max_tokens": 24,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                results.append(json.load(r))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"request {k}: {e}")

    threads = [threading.Thread(target=one, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    replicas = {r["replica"] for r in results}
    texts = {r["choices"][0]["text"] for r in results}
    print(f"{len(results)} answered by {len(replicas)} replicas, {len(errors)} errors")
    ok = not errors and len(results) == 16 and texts == {want} and len(replicas) == 2
    if not ok:
        print("FAIL:", errors[:3], texts)
finally:
    serve.shutdown()
    ray.shutdown()
sys.exit(0 if ok else 1)
