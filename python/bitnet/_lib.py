"""The C library (libbitnet.so) through ctypes: loading it, and the public
structs of bitnet.h mirrored field by field (include/bitnet.h is the
reference; tests/test_python.py checks the mirror against the library's
own behaviour)."""
import ctypes
import ctypes.util
import os

c_bool, c_int, c_int32, c_int64 = ctypes.c_bool, ctypes.c_int, ctypes.c_int32, ctypes.c_int64
c_uint64, c_float, c_double = ctypes.c_uint64, ctypes.c_float, ctypes.c_double
c_size_t = ctypes.c_size_t
c_char_p, c_void_p = ctypes.c_char_p, ctypes.c_void_p

MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20


class Error(ctypes.Structure):
    _fields_ = [("status", c_int), ("message", ctypes.c_char * 512), ("hint", ctypes.c_char * 256)]


class ModelOptions(ctypes.Structure):
    _fields_ = [("path", c_char_p), ("device", c_char_p), ("n_threads", c_int), ("n_ctx", c_int64),
                ("kv", c_int), ("memory_limit_bytes", c_uint64), ("max_sequences", c_int),
                ("kv_cache_bytes", c_uint64), ("kv_block_size", c_int), ("kv_evict", c_int),
                ("no_prefix_sharing", c_bool), ("tensor_parallel", c_int),
                ("batch_tokens", c_int)]


class ModelInfo(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char * 1024), ("architecture", ctypes.c_char * 32),
                ("flavour", ctypes.c_char * 256), ("device", ctypes.c_char * 64),
                ("device_name", ctypes.c_char * 128), ("chat_template", ctypes.c_char * 32),
                ("vocab_size", c_int32), ("n_ctx", c_int64), ("n_ctx_train", c_int64),
                ("n_layer", c_int), ("dim", c_int), ("n_head", c_int), ("n_head_kv", c_int),
                ("head_dim", c_int), ("ffn_dim", c_int), ("n_params", c_uint64),
                ("has_tokenizer", c_bool), ("bos", c_int32), ("eos", c_int32), ("eot", c_int32),
                ("selection", ctypes.c_char * 512), ("fallback", ctypes.c_char * 576)]


class TokenLogprob(ctypes.Structure):
    _fields_ = [("token", c_int32), ("logprob", c_float)]


TOKEN_CALLBACK = ctypes.CFUNCTYPE(c_bool, c_void_p, c_int32, ctypes.POINTER(ctypes.c_char),
                                  c_size_t)
LOGPROB_CALLBACK = ctypes.CFUNCTYPE(None, c_void_p, c_int32, c_float,
                                    ctypes.POINTER(TokenLogprob), c_int)


class GenerateParams(ctypes.Structure):
    _fields_ = [("prompt", c_char_p), ("prompt_tokens", ctypes.POINTER(c_int32)),
                ("n_prompt_tokens", c_size_t), ("max_tokens", c_int), ("temperature", c_float),
                ("top_k", c_int), ("top_p", c_float), ("min_p", c_float),
                ("repeat_penalty", c_float), ("repeat_last_n", c_int), ("seed", c_uint64),
                ("stop", c_char_p * MAX_STOP_STRINGS), ("ignore_eog", c_bool),
                ("prompt_logits", ctypes.POINTER(c_float)), ("on_logprobs", LOGPROB_CALLBACK),
                ("top_logprobs", c_int)]


class GenerateResult(ctypes.Structure):
    _fields_ = [("n_prompt_tokens", c_size_t), ("n_cached", c_size_t), ("n_tokens", c_size_t),
                ("stop", c_int), ("prompt_seconds", c_double), ("generate_seconds", c_double),
                ("decode_steps", c_int64), ("decode_seconds", c_double)]


class BatchItem(ctypes.Structure):
    _fields_ = [("session", c_void_p), ("params", ctypes.POINTER(GenerateParams)),
                ("on_token", TOKEN_CALLBACK), ("user", c_void_p), ("result", GenerateResult),
                ("status", c_int), ("error", Error)]


class ChatMessage(ctypes.Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class Perplexity(ctypes.Structure):
    _fields_ = [("perplexity", c_double), ("mean_nll", c_double), ("n_predicted", c_int64),
                ("n_text_tokens", c_int64), ("n_chunks", c_int64), ("ctx", c_int64),
                ("seconds", c_double)]


def _find():
    """BITNET_LIBRARY, else the library beside this package (a wheel's), else
    the system's (an installed bitnet)."""
    env = os.environ.get("BITNET_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(__file__), "libbitnet.so")
    if os.path.exists(here):
        return here
    found = ctypes.util.find_library("bitnet")
    if found:
        return found
    raise OSError("libbitnet.so was not found: install bitnet (cmake --install), or set "
                  "BITNET_LIBRARY to the library's path")


def _load():
    lib = ctypes.CDLL(_find())
    sig = {
        "bn_version": (c_char_p, []),
        "bn_status_str": (c_char_p, [c_int]),
        "bn_model_options_default": (None, [ctypes.POINTER(ModelOptions)]),
        "bn_model_open": (c_int, [ctypes.POINTER(ModelOptions), ctypes.POINTER(c_void_p),
                                  ctypes.POINTER(Error)]),
        "bn_model_close": (None, [c_void_p]),
        "bn_model_get_info": (c_int, [c_void_p, ctypes.POINTER(ModelInfo), ctypes.POINTER(Error)]),
        "bn_model_tokenize": (c_int, [c_void_p, c_char_p, c_size_t, c_bool,
                                      ctypes.POINTER(c_int32), c_size_t, ctypes.POINTER(c_size_t),
                                      ctypes.POINTER(Error)]),
        "bn_model_detokenize": (c_int, [c_void_p, ctypes.POINTER(c_int32), c_size_t, c_char_p,
                                        c_size_t, ctypes.POINTER(c_size_t),
                                        ctypes.POINTER(Error)]),
        "bn_model_apply_chat": (c_int, [c_void_p, ctypes.POINTER(ChatMessage), c_size_t, c_bool,
                                        c_char_p, c_size_t, ctypes.POINTER(c_size_t),
                                        ctypes.POINTER(Error)]),
        "bn_session_create": (c_int, [c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(Error)]),
        "bn_session_free": (None, [c_void_p]),
        "bn_session_cancel": (None, [c_void_p]),
        "bn_generate_params_default": (None, [ctypes.POINTER(GenerateParams)]),
        "bn_session_generate": (c_int, [c_void_p, ctypes.POINTER(GenerateParams), TOKEN_CALLBACK,
                                        c_void_p, ctypes.POINTER(GenerateResult),
                                        ctypes.POINTER(Error)]),
        "bn_generate_batch": (c_int, [c_void_p, ctypes.POINTER(BatchItem), c_size_t,
                                      ctypes.POINTER(Error)]),
        "bn_model_perplexity": (c_int, [c_void_p, c_char_p, c_size_t, c_int64, c_void_p, c_void_p,
                                        ctypes.POINTER(Perplexity), ctypes.POINTER(Error)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


lib = _load()
