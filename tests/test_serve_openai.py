"""bitnet serve as the official openai client meets it (run by
test_serve_openai.sh): completions and chat, whole and streamed, stop
strings, max_tokens, usage, the model list, errors as the client's
exceptions. argv: base URL, API key, the file holding `bitnet run -p
"And it came to pass" -n 24 --temp 0`'s text."""
import sys

import openai

base, key, run_file = sys.argv[1], sys.argv[2], sys.argv[3]
want = open(run_file, encoding="utf-8").read()
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
fails = 0
checks = 0


def check(ok, what):
    global fails, checks
    checks += 1
    if not ok:
        fails += 1
        print("FAIL:", what)


models = client.models.list()
model = models.data[0].id
check(model == "bitnet-kjv-7m-i2_s", f"models.list names the model ({model})")

c = client.completions.create(model=model, prompt="And it came to pass", max_tokens=24,
                              temperature=0)
check(c.choices[0].text == want, f"greedy completion equals bitnet run ({c.choices[0].text!r})")
check(c.usage.completion_tokens == 24 and c.choices[0].finish_reason == "length",
      "usage and finish_reason of a completion")

pieces = [ch.choices[0].text for ch in client.completions.create(
    model=model, prompt="And it came to pass", max_tokens=24, temperature=0, stream=True)]
check("".join(pieces) == want, "a streamed completion equals the whole one")

s = client.completions.create(model=model, prompt="And it came to pass", max_tokens=24,
                              temperature=0, stop=["LORD"])
check(s.choices[0].finish_reason == "stop" and "LORD" not in s.choices[0].text and
      want.startswith(s.choices[0].text), f"a stop string ({s.choices[0].text!r})")

messages = [{"role": "user", "content": "Who made the heaven and the earth?"}]
r = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
text = r.choices[0].message.content
check(r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 16 and
      r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
      "a chat completion with usage")
stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True})
streamed, usage, finish = "", None, None
for ch in stream:
    if ch.choices:
        streamed += ch.choices[0].delta.content or ""
        finish = ch.choices[0].finish_reason or finish
    if ch.usage:
        usage = ch.usage
check(streamed == text, f"the streamed chat equals the whole one ({streamed!r} / {text!r})")
check(finish in ("length", "stop") and usage is not None and
      usage.completion_tokens == r.usage.completion_tokens, "the stream's finish and usage")

lp = client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                    temperature=0, logprobs=True, top_logprobs=3)
content = lp.choices[0].logprobs.content
check(len(content) == lp.usage.completion_tokens and
      all(e.top_logprobs[0].token == e.token and len(e.top_logprobs) == 3 for e in content) and
      b"".join(bytes(e.bytes) for e in content).decode() == lp.choices[0].message.content,
      "chat log-probabilities through the client")

seeded = [client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                         temperature=0.9, seed=7).choices[0].message.content
          for _ in range(2)]
check(seeded[0] == seeded[1], "a seed gives the same sampled text twice")

try:
    client.completions.create(model="gpt-4", prompt="x", max_tokens=4)
    check(False, "an unknown model raises")
except openai.NotFoundError:
    check(True, "")
try:
    client.completions.create(model=model, prompt="x", max_tokens=4, temperature=-1)
    check(False, "a negative temperature raises")
except openai.BadRequestError:
    check(True, "")
try:
    openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    check(False, "a wrong key raises")
except openai.AuthenticationError:
    check(True, "")

print(f"ok: {checks} checks, {fails} failed")
sys.exit(1 if fails else 0)
