"""The Python package against the library and the CLI (pytest; run by
tests/test_python.sh with BITNET_LIBRARY, BN_TEST_CLI and BN_TEST_TEXT set): greedy text
equal to `bitnet run --temp 0`, streaming equal to whole text, errors as
BitnetError, tokens, chat, log-probabilities, perplexity, several threads
on several models, generate_batch, Ctrl-C, and memory over 1,000 short
generations."""
import os
import signal
import subprocess
import threading
import time

import pytest

import bitnet

CLI = os.environ["BN_TEST_CLI"]
PROMPT = "And it came to pass"


def cli_text(prompt, n):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BITNET_")}
    return subprocess.run([CLI, "run", "-p", prompt, "-n", str(n), "--temp", "0"],
                          capture_output=True, text=True, env=env, check=True).stdout


@pytest.fixture(scope="module")
def model():
    with bitnet.Model() as m:
        yield m


def test_greedy_equals_cli(model):
    assert model.generate(PROMPT, max_tokens=24, temperature=0) == cli_text(PROMPT, 24)


def test_stream_equals_whole(model):
    whole = model.generate(PROMPT, max_tokens=24, temperature=0.8, seed=3)
    pieces = list(model.generate(PROMPT, max_tokens=24, temperature=0.8, seed=3, stream=True))
    assert len(pieces) > 1 and "".join(pieces) == whole


def test_completion_fields(model):
    c = model.generate(PROMPT, max_tokens=8, temperature=0)
    assert c.n_tokens == 8 and c.finish_reason == "length" and c.n_prompt_tokens > 0
    s = model.generate(PROMPT, max_tokens=24, temperature=0, stop=["LORD"])
    assert s.finish_reason == "stop" and "LORD" not in s and cli_text(PROMPT, 24).startswith(s)


def test_tokens_and_info(model):
    ids = model.tokenize(PROMPT, add_bos=False)
    assert model.detokenize(ids) == PROMPT
    assert model.generate(model.tokenize(PROMPT), max_tokens=24, temperature=0) == \
        cli_text(PROMPT, 24)
    info = model.info
    assert "bitnet-kjv-7m" in info["path"] and info["vocab_size"] > 0 and info["has_tokenizer"]
    assert bitnet.version()


def test_chat_and_logprobs(model):
    a = model.chat([{"role": "user", "content": "Who made the earth?"}], max_tokens=8,
                   temperature=0)
    assert isinstance(a, str) and a.n_tokens <= 8
    lp = model.generate(PROMPT, max_tokens=6, temperature=0, logprobs=3).logprobs
    assert len(lp) == 6
    for token, logprob, top in lp:
        assert top[0] == (token, logprob) and len(top) == 3 and logprob <= 0


def test_perplexity(model):
    text = open(os.environ["BN_TEST_TEXT"]).read()[:4000]
    ppl = model.perplexity(text)
    assert 1.0 < ppl < 1000.0


def test_errors(tmp_path):
    with pytest.raises(bitnet.BitnetError) as e:
        bitnet.Model(str(tmp_path / "missing.gguf"))
    assert e.value.status == "io-error" and "missing.gguf" in e.value.message
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(bitnet.BitnetError) as e:
        bitnet.Model(str(bad))
    assert e.value.status == "format-error"
    with bitnet.Model() as m:
        with pytest.raises(bitnet.BitnetError) as e:
            m.generate(PROMPT, temperature=-1)
        assert e.value.status == "invalid-argument"
        with pytest.raises(bitnet.BitnetError):
            m.generate(PROMPT, max_tokens=0)
        with pytest.raises(bitnet.BitnetError):
            m.generate([10 ** 7])
    with pytest.raises(bitnet.BitnetError):
        m.generate(PROMPT)  # closed


def test_threads_and_models():
    want = cli_text(PROMPT, 16)
    models = [bitnet.Model(max_sequences=4), bitnet.Model()]
    got, errors = [], []

    def worker(m):
        try:
            for _ in range(3):
                got.append(m.generate(PROMPT, max_tokens=16, temperature=0))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(models[k % 2],)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for m in models:
        m.close()
    assert not errors and len(got) == 18 and all(g == want for g in got)


def test_generate_batch():
    prompts = [PROMPT, "The LORD is my shepherd", "In the beginning", PROMPT]
    with bitnet.Model(max_sequences=4) as m:
        alone = [m.generate(p, max_tokens=12, temperature=0.7, seed=9) for p in prompts]
        together = m.generate_batch(prompts, max_tokens=12, temperature=0.7, seed=9)
    assert together == alone
    # Passes of at most 2 rows: more of them, the same text.
    with bitnet.Model(max_sequences=4, batch_tokens=2) as m:
        assert m.generate_batch(prompts, max_tokens=12, temperature=0.7, seed=9) == alone
    with pytest.raises(bitnet.BitnetError, match="batch_tokens"):
        bitnet.Model(max_sequences=4, batch_tokens=-1)


def test_ctrl_c_cancels(model):
    timer = threading.Timer(0.2, signal.raise_signal, args=(signal.SIGINT,))
    t0 = time.time()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        # Generating when the signal comes, however fast this machine is.
        while time.time() - t0 < 10:
            model.generate(PROMPT * 20, max_tokens=400, temperature=0.8)
    timer.cancel()
    assert time.time() - t0 < 10
    # The model is usable afterwards.
    assert model.generate(PROMPT, max_tokens=24, temperature=0) == cli_text(PROMPT, 24)


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_memory_over_1000_generations(model):
    for _ in range(100):
        model.generate(PROMPT, max_tokens=2, temperature=0.8)
    before = rss_kib()
    for k in range(1000):
        model.generate(PROMPT, max_tokens=2, temperature=0.8, seed=k)
    after = rss_kib()
    assert after <= before * 1.10, (before, after)
