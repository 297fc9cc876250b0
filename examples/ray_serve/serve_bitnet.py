"""bitnet behind Ray Serve: N replicas of a model (one process each), one
OpenAI-style route, POST /v1/completions, which Ray Serve's HTTP proxy
spreads over the replicas. docs/SCALING.md says how the same deployment
spreads over machines and GPUs.

    pip install ./python "ray[serve]"
    python examples/ray_serve/serve_bitnet.py --replicas 2 --port 8000
    curl localhost:8000/v1/completions -d '{"prompt": "In the beginning", "max_tokens": 16}'

Each replica is a bitnet.Model on the device it is given ("cpu" here; one
GPU a replica with --gpus-per-replica 1), decoding the requests that reach
it together (max_sequences)."""
import argparse
import asyncio
import os
import time

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

import bitnet


@serve.deployment
class BitnetCompletions:
    def __init__(self, model_path=None, device="cpu", threads=1, max_sequences=8):
        self.model = bitnet.Model(model_path, device=device, threads=threads,
                                  max_sequences=max_sequences)
        self.name = os.path.basename(self.model.info["path"]).removesuffix(".gguf")

    async def __call__(self, request: Request):
        try:
            body = await request.json()
            prompt = body["prompt"]
            args = {"max_tokens": int(body.get("max_tokens", 16)),
                    "temperature": float(body.get("temperature", 1.0)),
                    "top_p": float(body.get("top_p", 1.0)), "top_k": 0, "min_p": 0.0,
                    "seed": int(body.get("seed", 0)), "stop": body.get("stop")}
        except (ValueError, KeyError, TypeError) as e:
            return JSONResponse({"error": {"message": f"bad request: {e}",
                                           "type": "invalid_request_error"}}, status_code=400)
        try:
            # The library releases the GIL: the replica's event loop stays free,
            # and its concurrent requests are decoded together.
            text = await asyncio.to_thread(self.model.generate, prompt, **args)
        except bitnet.BitnetError as e:
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error"}},
                                status_code=400)
        return {"id": f"cmpl-{os.getpid()}-{time.time_ns()}", "object": "text_completion",
                "created": int(time.time()), "model": self.name,
                "choices": [{"index": 0, "text": str(text), "logprobs": None,
                             "finish_reason": text.finish_reason}],
                "usage": {"prompt_tokens": text.n_prompt_tokens,
                          "completion_tokens": text.n_tokens,
                          "total_tokens": text.n_prompt_tokens + text.n_tokens},
                "replica": os.getpid()}


def app(replicas=2, model_path=None, device="cpu", threads=1, gpus_per_replica=0):
    """The application: `replicas` copies of the deployment."""
    options = {"num_cpus": threads}
    if gpus_per_replica:
        options["num_gpus"] = gpus_per_replica
        device = "cuda"
    return BitnetCompletions.options(num_replicas=replicas, ray_actor_options=options).bind(
        model_path, device, threads)


def main():
    ap = argparse.ArgumentParser(description="bitnet replicas behind Ray Serve")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gpus-per-replica", type=float, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args()
    serve.start(http_options={"host": a.host, "port": a.port})
    serve.run(app(a.replicas, a.model, threads=a.threads, gpus_per_replica=a.gpus_per_replica),
              route_prefix="/v1/completions", blocking=True)


if __name__ == "__main__":
    main()
