"""bitnet: ternary (BitNet b1.58) language models from Python, over the C
library's public API (include/bitnet.h) through ctypes.

    import bitnet
    with bitnet.Model() as model:                 # the model shipped with bitnet
        print(model.generate("The LORD is my shepherd", max_tokens=32, temperature=0))

Generation releases the GIL (ctypes does for every call into the library),
so several threads can generate at once; a Model opened with
``max_sequences`` > 1 decodes their requests, and ``generate_batch``'s, in
shared forward passes. Errors are ``bitnet.BitnetError`` with the
library's message and hint. Ctrl-C during a generation cancels it.
"""
import ctypes
import queue
import threading
from typing import Dict, Iterator, List, Optional, Sequence, Union

from . import _lib as L

__all__ = ["Model", "BitnetError", "Completion", "version"]

class BitnetError(RuntimeError):
    """A failure the library reported: ``status`` (its name, e.g. "io-error"),
    ``message`` and ``hint`` (what to do about it; "" when none)."""

    def __init__(self, status: str, message: str, hint: str = ""):
        self.status, self.message, self.hint = status, message, hint
        super().__init__(message + (f" (hint: {hint})" if hint else ""))


def _check(st, err):
    if st != 0:
        name = L.lib.bn_status_str(st).decode()
        raise BitnetError(name, err.message.decode(errors="replace"),
                          err.hint.decode(errors="replace"))


def version() -> str:
    """The library's version, e.g. "0.1.0"."""
    return L.lib.bn_version().decode()


class Completion(str):
    """A generation's text (a str), with ``tokens`` (prompt tokens, and
    generated ones), ``finish_reason`` ("length", "stop", "cancelled") and
    ``logprobs`` (a list of (token, logprob, [(token, logprob), ...]) when
    asked for)."""
    n_prompt_tokens = 0
    n_tokens = 0
    finish_reason = "stop"
    logprobs = None


_FINISH = {0: "length", 1: "stop", 2: "stop", 3: "stop", 4: "cancelled"}


class Model:
    """A model: a GGUF file or a Hugging Face directory (path None: the
    BITNET_MODEL environment variable, else the model shipped with bitnet).

    device: "auto" (a usable CUDA GPU, else the CPU), "cpu", "cuda",
    "cuda:N"; ctx: positions a generation may hold (None: the model's);
    threads: CPU threads (None: all); max_sequences: generations decoded
    together when several run at once (1: one at a time); batch_tokens: a pass
    of those holds one row per decoding generation, then prompt chunks up to
    this many rows in all (None: 512); tensor_parallel: CUDA GPUs that split the model
    between them (1: none; device "cuda" takes the first ones, "cuda:0,1"
    names them)."""

    def __init__(self, path: Optional[str] = None, device: str = "auto",
                 ctx: Optional[int] = None, threads: Optional[int] = None,
                 max_sequences: int = 1, tensor_parallel: int = 1,
                 batch_tokens: Optional[int] = None):
        opt = L.ModelOptions()
        L.lib.bn_model_options_default(ctypes.byref(opt))
        opt.path = path.encode() if path else None
        opt.device = device.encode() if device else None
        opt.n_ctx = int(ctx or 0)
        opt.n_threads = int(threads or 0)
        opt.max_sequences = int(max_sequences)
        opt.tensor_parallel = int(tensor_parallel)
        opt.batch_tokens = int(batch_tokens or 0)
        self._max_sequences = max(1, int(max_sequences))
        self._m = ctypes.c_void_p()
        err = L.Error()
        _check(L.lib.bn_model_open(ctypes.byref(opt), ctypes.byref(self._m), ctypes.byref(err)),
               err)
        self._info = L.ModelInfo()
        _check(L.lib.bn_model_get_info(self._m, ctypes.byref(self._info), ctypes.byref(err)), err)

    # ---- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Frees the model (generations must have ended)."""
        if getattr(self, "_m", None):
            L.lib.bn_model_close(self._m)
            self._m = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _model(self):
        if not self._m:
            raise BitnetError("invalid-argument", "the model is closed")
        return self._m

    # ---- what it is -------------------------------------------------------------

    @property
    def info(self) -> Dict[str, object]:
        """What the model is and where it runs, as a dict."""
        i = self._info
        out = {}
        for name, _ in L.ModelInfo._fields_:
            v = getattr(i, name)
            out[name] = v.decode(errors="replace") if isinstance(v, bytes) else v
        return out

    # ---- tokens ---------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = True) -> List[int]:
        """The token ids of text (BOS first when the tokenizer asks for it)."""
        data = text.encode()
        n = ctypes.c_size_t()
        err = L.Error()
        _check(L.lib.bn_model_tokenize(self._model(), data, len(data), add_bos, None, 0,
                                       ctypes.byref(n), ctypes.byref(err)), err)
        ids = (L.c_int32 * max(n.value, 1))()
        _check(L.lib.bn_model_tokenize(self._model(), data, len(data), add_bos, ids, n.value,
                                       ctypes.byref(n), ctypes.byref(err)), err)
        return list(ids[:n.value])

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of token ids (bytes a character cut in two become U+FFFD)."""
        ids = (L.c_int32 * max(len(tokens), 1))(*tokens)
        n = ctypes.c_size_t()
        err = L.Error()
        _check(L.lib.bn_model_detokenize(self._model(), ids, len(tokens), None, 0,
                                         ctypes.byref(n), ctypes.byref(err)), err)
        buf = ctypes.create_string_buffer(n.value + 1)
        _check(L.lib.bn_model_detokenize(self._model(), ids, len(tokens), buf, n.value + 1,
                                         ctypes.byref(n), ctypes.byref(err)), err)
        return buf.raw[:n.value].decode(errors="replace")

    # ---- generation -----------------------------------------------------------------

    def _params(self, prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
                seed, stop, logprobs):
        p = L.GenerateParams()
        L.lib.bn_generate_params_default(ctypes.byref(p))
        keep = []  # what p points to, alive as long as p
        if isinstance(prompt, str):
            keep.append(prompt.encode())
            p.prompt = keep[-1]
        else:
            ids = (L.c_int32 * max(len(prompt), 1))(*prompt)
            keep.append(ids)
            p.prompt_tokens = ids
            p.n_prompt_tokens = len(prompt)
        p.max_tokens = int(max_tokens)
        p.temperature = float(temperature)
        p.top_k = int(top_k)
        p.top_p = float(top_p)
        p.min_p = float(min_p)
        p.repeat_penalty = float(repeat_penalty)
        p.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > L.MAX_STOP_STRINGS:
            raise BitnetError("invalid-argument", f"at most {L.MAX_STOP_STRINGS} stop strings")
        for k, s in enumerate(stops):
            keep.append(s.encode())
            p.stop[k] = keep[-1]
        return p, keep

    def _run(self, p, keep, on_piece, logprobs):
        """One generation on a session of its own; on_piece(text) gets each
        piece (may be None). Returns a Completion."""
        session = ctypes.c_void_p()
        err = L.Error()
        _check(L.lib.bn_session_create(self._model(), ctypes.byref(session), ctypes.byref(err)),
               err)
        pieces, lps = [], []

        def token_cb(user, token, text, n):
            piece = ctypes.string_at(text, n).decode(errors="replace") if n else ""
            if piece:
                pieces.append(piece)
                if on_piece is not None:
                    on_piece(piece)
            return True

        def logprob_cb(user, token, lp, top, n_top):
            lps.append((token, lp, [(top[k].token, top[k].logprob) for k in range(n_top)]))

        cb = L.TOKEN_CALLBACK(token_cb)
        if logprobs is not None:
            p.on_logprobs = L.LOGPROB_CALLBACK(logprob_cb)
            p.top_logprobs = int(logprobs)
        result = L.GenerateResult()
        done = threading.Event()
        status = [0]

        def work():
            status[0] = L.lib.bn_session_generate(session, ctypes.byref(p), cb, None,
                                                  ctypes.byref(result), ctypes.byref(err))
            done.set()

        # The call runs on a thread of its own so that Ctrl-C (delivered to
        # the main thread) can cancel it; the GIL is free while it runs.
        t = threading.Thread(target=work, daemon=True)
        t.start()
        try:
            while not done.wait(0.1):
                pass
        except KeyboardInterrupt:
            L.lib.bn_session_cancel(session)
            t.join()
            L.lib.bn_session_free(session)
            raise
        t.join()
        L.lib.bn_session_free(session)
        _check(status[0], err)
        out = Completion("".join(pieces))
        out.n_prompt_tokens = result.n_prompt_tokens
        out.n_tokens = result.n_tokens
        out.finish_reason = _FINISH.get(result.stop, "stop")
        out.logprobs = lps if logprobs is not None else None
        del keep
        return out

    def generate(self, prompt: Union[str, Sequence[int]], max_tokens: int = 128,
                 temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int = 0,
                 stop: Union[str, Sequence[str], None] = None, stream: bool = False,
                 logprobs: Optional[int] = None) -> Union["Completion", Iterator[str]]:
        """Text generated after prompt (a string, or token ids used as they
        are): up to max_tokens tokens, sampled (temperature 0: greedy, the
        text `bitnet run --temp 0` prints), ending before any stop string.
        stream=True returns an iterator over the pieces as they come.
        logprobs=N also reports each token's log-probability and its N
        most likely alternatives (the Completion's logprobs)."""
        p, keep = self._params(prompt, max_tokens, temperature, top_k, top_p, min_p,
                               repeat_penalty, seed, stop, logprobs)
        if not stream:
            return self._run(p, keep, None, logprobs)
        return self._stream(p, keep, logprobs)

    def _stream(self, p, keep, logprobs):
        q = queue.Queue()
        end = object()
        box = {}

        def work():
            try:
                box["result"] = self._run(p, keep, q.put, logprobs)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                box["error"] = e
            q.put(end)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        while True:
            piece = q.get()
            if piece is end:
                break
            yield piece
        t.join()
        if "error" in box:
            raise box["error"]

    def chat(self, messages: Sequence[Dict[str, str]],
             **kw) -> Union["Completion", Iterator[str]]:
        """The assistant's answer to messages ([{"role": "system" | "user" |
        "assistant", "content": ...}]) through the model's chat template;
        the other arguments as generate's."""
        arr = (L.ChatMessage * max(len(messages), 1))()
        keep = []
        for k, m in enumerate(messages):
            keep += [m["role"].encode(), m["content"].encode()]
            arr[k].role, arr[k].content = keep[-2], keep[-1]
        n = ctypes.c_size_t()
        err = L.Error()
        _check(L.lib.bn_model_apply_chat(self._model(), arr, len(messages), True, None, 0,
                                         ctypes.byref(n), ctypes.byref(err)), err)
        buf = ctypes.create_string_buffer(n.value + 1)
        _check(L.lib.bn_model_apply_chat(self._model(), arr, len(messages), True, buf,
                                         n.value + 1, ctypes.byref(n), ctypes.byref(err)), err)
        return self.generate(buf.raw[:n.value].decode(errors="replace"), **kw)

    def generate_batch(self, prompts: Sequence[Union[str, Sequence[int]]],
                       **kw) -> List["Completion"]:
        """generate() for each prompt, run together (up to the model's
        max_sequences in shared forward passes); a list of Completions in
        the prompts' order. Each prompt's text is what generate() gives it
        alone."""
        results = [None] * len(prompts)
        errors = [None] * len(prompts)
        todo = queue.Queue()
        for k in range(len(prompts)):
            todo.put(k)

        def worker():
            while True:
                try:
                    k = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[k] = self.generate(prompts[k], **kw)
                except BitnetError as e:
                    errors[k] = e

        # As many generations in flight as the model decodes together (each
        # on a thread: the library batches them), not one thread a prompt.
        threads = [threading.Thread(target=worker)
                   for _ in range(min(len(prompts), self._max_sequences))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e in errors:
            if e is not None:
                raise e
        return results

    def perplexity(self, text: str, ctx: int = 0) -> float:
        """Perplexity of text (bitnet perplexity's rule: chunks of ctx
        positions, BOS first in each; 0: 512 or the context if smaller)."""
        data = text.encode()
        out = L.Perplexity()
        err = L.Error()
        _check(L.lib.bn_model_perplexity(self._model(), data, len(data), int(ctx), None, None,
                                         ctypes.byref(out), ctypes.byref(err)), err)
        return out.perplexity
