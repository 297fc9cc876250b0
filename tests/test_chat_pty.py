#!/usr/bin/env python3
"""bitnet chat as a person at a terminal meets it, through a pseudo-terminal.

On a copy of the committed hf_packed fixture (tests/data/models; its
vocabulary has <|begin_of_text|> and <|eot_id|>, so it has the 2B-4T chat
format) whose config.json allows a longer context, greedy:
  - a message: the streamed answer is the one `bitnet run --chat -p MSG`
    gives; a second message: the answer `bitnet run -p TEXT` gives for the
    whole conversation's text in the 2B-4T format; /reset;
  - a message with a long answer, Ctrl-C once it is streaming: the answer
    stops (what was written is the start of the full answer), the program
    lives and answers the next message in the conversation that holds the
    stopped answer; /exit: exit code 0;
  - at the prompt, one Ctrl-C gives a note and a new prompt, a second one
    leaves (exit code 0).
Through a pipe: a line of 1 MiB (refused: it does not fit the context), a
conversation that outgrows --ctx (a note naming /reset; /reset then gives
the first answer again), end of input = exit code 0; a model without a
chat format: exit code 5 and an error saying so; the shipped model (no
-m): its first answer is `bitnet run --chat`'s (a tokenizer that adds BOS
itself: no second BOS). Every wait is bounded; every child is killed and
the temporary directory removed on the way out.

usage: test_chat_pty.py BITNET DATA_DIR
"""
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import fcntl
    import termios
except ImportError:
    fcntl = termios = None
if termios is None or not hasattr(os, "openpty"):
    print("SKIP: no pseudo-terminals on this platform")
    sys.exit(77)

BITNET = os.path.abspath(sys.argv[1])
DATA = os.path.abspath(sys.argv[2])
N = 2000          # tokens per answer: about a second or two on the fixture
WAIT = 120.0      # seconds any one step may take
FAILS = []


def fail(msg):
    print("FAIL: " + msg)
    FAILS.append(msg)


def check(cond, msg, detail=""):
    """detail: printed on failure only."""
    if cond:
        print("ok: " + msg)
    else:
        fail(msg + (" (%s)" % detail if detail else ""))
    return cond


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("BITNET_")}


def run(args, stdin=b"", timeout=WAIT):
    p = subprocess.run([BITNET] + args, input=stdin, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=clean_env(), timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def greedy(model, args, n=N):
    """bitnet run's greedy text; its stderr says whether it stopped at EOG."""
    rc, out, err = run(["run", "-m", model, "--device", "cpu", "--temp", "0", "-n", str(n)]
                       + args)
    if rc != 0:
        raise RuntimeError("bitnet run %s: exit code %d: %s" % (args, rc, err.decode()[-2000:]))
    return out, b"stopped at end of generation" in err


def trim(b):
    # The 2B-4T format trims each message as Python's str.strip does
    # (bn_model_apply_chat, like the Hugging Face template); bytes that are
    # not UTF-8 stay as they are.
    return b.decode("utf-8", "surrogateescape").strip().encode("utf-8", "surrogateescape")


def conversation_text(turns, add_assistant=True):
    """The 2B-4T format: <|begin_of_text|>User: ...<|eot_id|>Assistant: ..."""
    t = b"<|begin_of_text|>"
    for role, content in turns:
        # bn_chat_message.content is a C string: it ends at a NUL byte.
        content = content.split(b"\0")[0]
        t += {"user": b"User: ", "assistant": b"Assistant: "}[role] + trim(content) + b"<|eot_id|>"
    return t + (b"Assistant: " if add_assistant else b"")


class Pty:
    """bitnet chat on a pseudo-terminal: stdin, stdout and stderr are the
    slave side, as on a terminal; the test holds the master side."""

    def __init__(self, args):
        self.master, slave = os.openpty()
        attrs = termios.tcgetattr(slave)
        # Echo off: the output is the program's alone (no echoed input, no
        # "^C" inside an answer). NOFLSH: a Ctrl-C does not discard output
        # the program wrote and the test has not read yet, so the stopped
        # answer can be checked byte for byte. Canonical input and signals
        # (ICANON, ISIG: Ctrl-C sends SIGINT) stay as on any terminal.
        attrs[3] = (attrs[3] & ~termios.ECHO) | termios.NOFLSH | termios.ICANON | termios.ISIG
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        # A session of its own whose controlling terminal is the pty, so a
        # Ctrl-C typed there sends SIGINT to the program, as on a terminal.
        self.proc = subprocess.Popen([BITNET] + args, stdin=slave, stdout=slave,
                                     stderr=slave, env=clean_env(), start_new_session=True,
                                     preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
                                     close_fds=True)
        os.close(slave)
        self.raw = b""
        self.pos = 0  # what the test has looked at, in the normalized output
        self.eof = False

    def text(self):
        # The terminal turns each "\n" written into "\r\n".
        return self.raw.replace(b"\r\n", b"\n")

    def pump(self, timeout):
        if self.eof:
            return
        r, _, _ = select.select([self.master], [], [], timeout)
        if not r:
            return
        try:
            d = os.read(self.master, 65536)
        except OSError:  # EIO: the slave side is closed (the program ended)
            d = b""
        if not d:
            self.eof = True
        self.raw += d

    def wait_for(self, pred, what, timeout=WAIT):
        """Reads until pred(new output) holds; the new output, or None."""
        end = time.monotonic() + timeout
        while True:
            new = self.text()[self.pos:]
            if pred(new):
                return new
            left = end - time.monotonic()
            if left <= 0 or self.eof:
                fail("%s: not seen in %s; the output so far (%d bytes): %r" %
                     (what, "time" if left <= 0 else "the output before the program ended",
                      len(new), new[-600:]))
                return None
            self.pump(min(left, 0.5))

    def consume(self, new):
        self.pos += len(new)

    def send(self, b):
        os.write(self.master, b)

    def close(self, timeout=WAIT):
        """Exit code of the program (after EOF on the terminal), killing it
        when it does not end in time."""
        end = time.monotonic() + timeout
        while not self.eof and time.monotonic() < end:
            self.pump(0.2)
        try:
            return self.proc.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            fail("bitnet chat did not end in %.0f s; killed" % timeout)
            self.kill()
            return None
        finally:
            os.close(self.master)

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()


def expect_answer(t, want, what):
    """The next answer is want, then a newline, notes, and the prompt."""
    full = want + b"\n"

    def done(b):
        # The prompt after the answer, or an answer that already differs.
        return b.endswith(b"> ") and (b.startswith(full) or not full.startswith(b[:len(full)]))

    new = t.wait_for(done, what)
    if new is None:
        return None
    t.consume(new)
    if not check(new.startswith(want + b"\n"), what):
        got = new[:-2]
        k = 0
        while k < min(len(got), len(want)) and got[k] == want[k]:
            k += 1
        print("  first difference at byte %d: got %r, want %r" % (k, got[k:k + 80], want[k:k + 80]))
        return None
    return new


def pty_session(model, children):
    m1, m2, m3, m4 = b"hi", b"tell me more", b"Write a long poem about the sea.", b"and now?"
    a1, eog1 = greedy(model, ["--chat", "-p", m1.decode()])
    a3, eog3 = greedy(model, ["--chat", "-p", m3.decode()])
    if eog3:
        fail("the fixture's greedy answer to %r stops at end of generation before %d tokens: "
             "pick a message with a long answer for the Ctrl-C check" % (m3, N))
        return

    t = Pty(["chat", "-m", model, "--device", "cpu", "--temp", "0", "-n", str(N), "--ctx", "8192"])
    children.append(t)
    new = t.wait_for(lambda b: b.endswith(b"> "), "the first prompt")
    if new is None:
        return
    check(b"chat format bitnet-2b4t" in new, "the banner names the chat format")
    t.consume(new)

    # 1. The first answer is bitnet run --chat's.
    t.send(m1 + b"\n")
    what = "answer 1 = bitnet run --chat -p %r (%d bytes)" % (m1, len(a1))
    if expect_answer(t, a1, what) is None:
        return

    # 2. A second message: the answer to the whole conversation's text.
    a2, _ = greedy(model, ["-p", conversation_text([("user", m1), ("assistant", a1),
                                                    ("user", m2)])])
    t.send(m2 + b"\n")
    if expect_answer(t, a2, "answer 2 = bitnet run -p CONVERSATION (%d bytes)" % len(a2)) is None:
        return

    # 3. /reset.
    t.send(b"/reset\n")
    new = t.wait_for(lambda b: b.endswith(b"> "), "/reset's prompt")
    if new is None:
        return
    check(b"[new conversation]" in new, "/reset says a new conversation starts")
    t.consume(new)

    # 4. A long answer, Ctrl-C once it streams.
    t.send(m3 + b"\n")
    new = t.wait_for(lambda b: len(b) >= 16, "the start of the long answer")
    if new is None:
        return
    t.send(b"\x03")
    new = t.wait_for(lambda b: b"\n[answer stopped]\n" in b and b.endswith(b"> "),
                     "the stopped answer and a new prompt after Ctrl-C")
    if new is None:
        return
    t.consume(new)
    partial = new[:new.rfind(b"\n[answer stopped]\n")]
    k = 0
    while k < min(len(partial), len(a3)) and partial[k] == a3[k]:
        k += 1
    # The last bytes may be a character cut short by the stop (written as
    # they are), which the full answer completes or writes otherwise.
    tail = partial[k:]
    check(len(tail) <= 3 and all(c >= 0x80 for c in tail),
          "the stopped answer (%d bytes) is the start of the full one (%d bytes)" %
          (len(partial), len(a3)))
    check(len(partial) < len(a3), "Ctrl-C stopped the answer before its end")
    check(t.proc.poll() is None, "bitnet chat lives on after Ctrl-C")

    # 5. It answers again, in the conversation that holds the stopped answer.
    a4, _ = greedy(model, ["-p", conversation_text([("user", m3), ("assistant", partial),
                                                    ("user", m4)])])
    t.send(m4 + b"\n")
    expect_answer(t, a4, "the answer after Ctrl-C = bitnet run -p CONVERSATION (%d bytes)" %
                  len(a4))

    # 6. /exit.
    t.send(b"/exit\n")
    rc = t.close()
    check(rc == 0, "/exit: exit code 0 (got %s)" % rc)


def pty_ctrl_c_at_prompt(model, children):
    t = Pty(["chat", "-m", model, "--device", "cpu", "--temp", "0", "-n", "8"])
    children.append(t)
    new = t.wait_for(lambda b: b.endswith(b"> "), "the first prompt")
    if new is None:
        return
    t.consume(new)
    t.send(b"\x03")
    new = t.wait_for(lambda b: b.endswith(b"> "), "a new prompt after one Ctrl-C at the prompt")
    if new is None:
        return
    check(b"Ctrl-C again" in new, "one Ctrl-C at the prompt says how to leave")
    check(t.proc.poll() is None, "one Ctrl-C at the prompt does not end bitnet chat")
    t.consume(new)
    t.send(b"\x03")
    rc = t.close()
    check(rc == 0, "a second Ctrl-C at the prompt leaves with exit code 0 (got %s)" % rc)


def piped(model, nochat):
    # A line of 1 MiB: read whole, refused as not fitting; the chat goes on.
    rc, out, err = run(["chat", "-m", model, "--device", "cpu", "--temp", "0", "-n", "8"],
                       stdin=b"word " * (1 << 18) + b"\nhello\n")
    want, _ = greedy(model, ["--chat", "-p", "hello"], n=8)
    check(rc == 0 and b"does not fit the context" in err and out == want + b"\n",
          "a 1 MiB line through a pipe: refused with a note, the next message answered, exit 0",
          "rc %d, stdout %r, stderr %r" % (rc, out[:200], err[-300:]))

    # A conversation that outgrows the context: a note naming /reset; after
    # /reset the first answer again.
    msgs = b"hello\n" * 6 + b"/reset\nhello\n"
    rc, out, err = run(["chat", "-m", model, "--device", "cpu", "--temp", "0", "-n", "24",
                        "--ctx", "96"], stdin=msgs)
    first, _ = greedy(model, ["--chat", "-p", "hello", "--ctx", "96"], n=24)
    check(rc == 0 and b"no longer fits the context" in err and b"/reset" in err,
          "a conversation longer than --ctx: a note naming /reset, exit 0",
          "rc %d, stderr %r" % (rc, err[-400:]))
    check(out.startswith(first + b"\n") and out.endswith(b"\n" + first + b"\n"),
          "the first answer, and after /reset the same again",
          "stdout %r, first answer %r" % (out[-300:], first))

    # A model without a chat format.
    rc, out, err = run(["chat", "-m", nochat, "--device", "cpu"], stdin=b"hello\n")
    check(rc == 5 and b"no chat format" in err and out == b"",
          "a model without a chat format: exit code 5, 'no chat format'",
          "rc %d, stderr %r" % (rc, err[-400:]))

    # The shipped model (no -m); its tokenizer adds BOS, the format writes it.
    rc, out, err = run(["chat", "--device", "cpu", "--temp", "0", "-n", "16"],
                       stdin=b"In the beginning\n")
    rc2, want, err2 = run(["run", "--device", "cpu", "--temp", "0", "-n", "16", "--chat", "-p",
                           "In the beginning"])
    check(rc == 0 and rc2 == 0 and out == want + b"\n",
          "the shipped model: the first answer is bitnet run --chat's",
          "rc %d/%d, %r vs %r, stderr %r" % (rc, rc2, out[:80], want[:80], err[-300:]))

    # The command line.
    rc, out, _ = run(["chat", "--help"])
    check(rc == 0 and b"/reset" in out and b"Ctrl-C" in out, "--help: exit 0, lists the commands")
    rc, _, err = run(["chat", "--bogus"])
    check(rc == 2, "an unknown option: exit code 2", "got %d" % rc)


def run_on_terminal(model):
    """bitnet run on a terminal: its timing lines start a line of their
    own; through a pipe stdout holds the text alone (no newline added)."""
    args = ["run", "-m", model, "--device", "cpu", "--temp", "0", "-n", "8", "-p", "hello"]
    text, _ = greedy(model, ["-p", "hello"], n=8)
    t = Pty(args)
    rc = t.close()
    out = t.text()
    check(rc == 0 and b"\nload " in out and text in out,
          "bitnet run on a terminal: the timing lines start on a line of their own",
          "rc %s, output %r" % (rc, out[-400:]))
    check(not text.endswith(b"\n"), "bitnet run through a pipe: stdout is the text alone")


def main():
    children = []
    tmp = tempfile.mkdtemp(prefix="bitnet-chat-")
    try:
        src = os.path.join(DATA, "models", "hf_packed")
        # The fixture with a context of 8192 positions (its weights do not
        # depend on it), so an answer can run long enough to be stopped.
        model = os.path.join(tmp, "long_ctx")
        shutil.copytree(src, model)
        cfg = json.load(open(os.path.join(model, "config.json")))
        cfg["max_position_embeddings"] = 8192
        json.dump(cfg, open(os.path.join(model, "config.json"), "w"), indent=2)
        # The fixture without <|eot_id|>: no chat format.
        nochat = os.path.join(tmp, "no_chat")
        shutil.copytree(src, nochat)
        tj = os.path.join(nochat, "tokenizer.json")
        tok = json.load(open(tj))
        for t in tok["added_tokens"]:
            if t["content"] == "<|eot_id|>":
                t["content"] = "<|end_of_turn|>"
        json.dump(tok, open(tj, "w"))

        pty_session(model, children)
        pty_ctrl_c_at_prompt(src, children)
        piped(src, nochat)
        run_on_terminal(src)
    except Exception as e:  # a failure to run at all is a failure too
        import traceback
        traceback.print_exc()
        fail("exception: %r" % e)
    finally:
        for t in children:
            t.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
