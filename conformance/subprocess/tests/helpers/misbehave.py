#!/usr/bin/env python3
"""A child that breaks the protocol in one way, chosen by argv[1], for subprocess_test.cpp.

Modes built on the Python module (a correct hello, the numpy example for the outputs):
  segv_second, sleep_in_run, raise, decline, print_stdout, chatty_stderr, and scale_y (a wrong
  kernel that runs fine: y times 1.01, for the CLI tests of recorded findings)
Raw modes (hand-written messages): everything else, see RAW below.
"""
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))

MODE = sys.argv[1]


def module_mode():
    import numpy_candidate
    from normcheck_protocol import Declined, serve

    calls = [0]

    def run(case, inputs):
        calls[0] += 1
        if MODE == "segv_second" and calls[0] == 2:
            os.kill(os.getpid(), signal.SIGSEGV)
        if MODE == "sleep_in_run":
            time.sleep(3600)
        if MODE == "raise":
            if case["epsilon"] == 0.125:
                raise ValueError("asked to fail")
        if MODE == "decline":
            raise Declined("not this one")
        if MODE == "print_stdout":
            print("a stray print that must not reach the protocol stream")
        if MODE == "chatty_stderr":
            sys.stderr.write(("x" * 1023 + "\n") * 1024)  # 1 MiB: more than any pipe holds
            sys.stderr.write("the last words\n")
            sys.stderr.flush()
        out = numpy_candidate.run(case, inputs)
        if MODE == "scale_y" and "y" in out:
            out["y"] = (out["y"] * 1.01).astype(out["y"].dtype)
        return out

    serve("misbehave " + MODE, numpy_candidate.CAPABILITIES, run)


def hello(**over):
    h = {"protocol": "normcheck-subprocess", "version": 1, "type": "hello", "name": "misbehave " + MODE,
         "capabilities": {"directions": ["forward"]}}
    h.update(over)
    return h


def send(obj, payload=b""):
    out = sys.stdout.buffer
    out.write((json.dumps(obj) + "\n").encode())
    out.write(payload)
    out.flush()


def read_request():
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)
    req = json.loads(line)
    for e in req.get("inputs", []):
        sys.stdin.buffer.read(e["nbytes"])
    return req


def y_entry(req, **over):
    y = next(o for o in req["outputs"] if o["name"] == "y")
    n = 1
    for d in y["shape"]:
        n *= d
    e = {"name": "y", "dtype": y["dtype"], "shape": y["shape"], "nbytes": n * 4}
    e.update(over)
    return e


def raw_mode():
    if MODE == "no_hello":
        time.sleep(3600)
    if MODE == "exit_before_hello":
        sys.stderr.write("boom: cannot import the kernel library\n")
        sys.exit(3)
    if MODE == "garbage_hello":
        sys.stdout.write("hello world\n")
        sys.stdout.flush()
        time.sleep(3600)
    if MODE == "endless_line":
        sys.stdout.write("x" * (3 << 20))
        sys.stdout.flush()
        time.sleep(3600)
    if MODE == "version2":
        send(hello(version=2))
        read_request()  # a bye, if the host sends one
        sys.exit(0)
    if MODE == "error_hello":
        send({"type": "error", "message": "CUDA not available"})
        sys.exit(1)
    if MODE == "bad_caps":
        send(hello(capabilities={"ops": "layernorm"}))
        time.sleep(3600)
    if MODE == "close_stdin":  # the host's first write meets a closed pipe (EPIPE, not SIGPIPE)
        os.close(0)
        send(hello())
        time.sleep(3600)
    send(hello())
    while True:
        req = read_request()
        if req["type"] == "bye":
            sys.exit(0)
        if MODE == "garbage_reply":
            sys.stdout.write("this is not json\n")
            sys.stdout.flush()
        elif MODE in ("short_payload_exit", "short_payload_hang"):
            send({"type": "result", "outputs": [y_entry(req)]}, b"\0" * 8)
            if MODE == "short_payload_hang":
                time.sleep(3600)
            sys.exit(0)
        elif MODE == "bad_nbytes":
            e = y_entry(req)
            e["nbytes"] += 4
            send({"type": "result", "outputs": [e]}, b"\0" * e["nbytes"])
        elif MODE == "negative_dim":
            send({"type": "result", "outputs": [y_entry(req, shape=[-1, 4], nbytes=16)]})
        elif MODE == "huge":
            send({"type": "result", "outputs": [y_entry(req, shape=[65536, 65536], nbytes=4 << 32)]})
        elif MODE == "unknown_dtype":
            send({"type": "result", "outputs": [y_entry(req, dtype="float8")]})
        elif MODE == "int8_y":
            e = y_entry(req, dtype="int8")
            e["nbytes"] //= 4
            send({"type": "result", "outputs": [e]}, b"\0" * e["nbytes"])
        elif MODE in ("q_unpacked", "q_float32", "q_short"):  # quantized cases: q as it must not be
            q = next(o for o in req["outputs"] if o["name"] == "q")
            shape, dtype, size = list(q["shape"]), q["dtype"], 1
            if MODE == "q_unpacked":
                shape[-1] *= 2
            if MODE == "q_float32":
                dtype, size = "float32", 4
            n = size
            for d in shape:
                n *= d
            if MODE == "q_short":
                n -= 1
            send({"type": "result", "outputs": [{"name": "q", "dtype": dtype, "shape": shape, "nbytes": n}]}, b"\0" * n)
        elif MODE == "wrong_shape":
            send({"type": "result", "outputs": [y_entry(req, shape=[1], nbytes=4)]}, b"\0" * 4)
        elif MODE == "unrequested":
            send({"type": "result", "outputs": [y_entry(req, name="foo")]})
        elif MODE == "unknown_type":
            send({"type": "weather", "outputs": []})
        elif MODE == "exit_after_reply":  # a valid (empty) result, then gone while idle
            send({"type": "result", "outputs": []})
            sys.exit(0)
        elif MODE == "exit_in_run":
            sys.stderr.write("fatal: out of cheese\n")
            sys.exit(7)
        else:
            sys.stderr.write("misbehave.py: unknown mode " + MODE + "\n")
            sys.exit(9)


if MODE in ("segv_second", "sleep_in_run", "raise", "decline", "print_stdout", "chatty_stderr", "scale_y"):
    module_mode()
else:
    raw_mode()
