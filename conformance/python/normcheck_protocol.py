"""The child side of normcheck's subprocess protocol (conformance/PROTOCOL.md), for candidates
written in Python.

    from normcheck_protocol import serve, Declined

    def run(case, inputs):            # inputs: name -> numpy array
        ...
        return {"y": y, "rstd": rstd}  # name -> array (any float dtype: converted, see below)

    serve("my kernel", {"ops": ["rmsnorm"], "directions": ["forward"]}, run)

`case` is the request's case object (the attributes of fixtures/SCHEMA.md, `norm_dims`, the
`*_hex` forms, and `quant` for a quantized case) plus two keys the module adds: `outputs`,
name -> {"dtype", "shape"} of every output the host expects (codes also "codes", their format,
and for NVFP4 "packing"), and `request`, the request number.

Quantized cases (PROTOCOL.md, "Quantized cases"; declare "quant_formats" and "quant_scales" in
the capabilities): code outputs (`q`, MX/NVFP4 block `scale`) have dtype "uint8" ("int8" for the
int8 format) and are returned as integer arrays of the requested shape, NVFP4 packed two codes
per byte (pack_nvfp4 does it); values out of the dtype's range are an error, never wrapped.

Dtypes in Python:
  - float64, float32, float16 inputs arrive as numpy arrays of that dtype;
  - bfloat16 inputs arrive as float32 arrays (numpy has no bfloat16; the widening is exact).
Outputs may be any numpy float dtype (or anything numpy.asarray takes). Each is converted to
its requested dtype by round-to-nearest-even, once: float64/float32 -> float16 by numpy (which
rounds correctly), and -> bfloat16 here, from float32 directly and from float64 through a
round-to-odd float32 so that the result is still rounded once. If your framework already
rounded to the output dtype, the conversion is exact and changes nothing.

run() may raise Declined(reason) (the case is UNSUPPORTED) or any other exception (the case
is CRASHED with the exception's text; the traceback goes to stderr). The module keeps serving
after both. print() in a candidate goes to stderr: fd 1 belongs to the protocol.
"""

import json
import os
import sys
import traceback

import numpy as np

PROTOCOL = "normcheck-subprocess"
VERSION = 1
MAX_HEADER_BYTES = 1 << 20

_WIRE = {  # dtype name -> (wire numpy dtype, Python-side numpy dtype)
    "float64": (np.dtype("<f8"), np.dtype(np.float64)),
    "float32": (np.dtype("<f4"), np.dtype(np.float32)),
    "float16": (np.dtype("<f2"), np.dtype(np.float16)),
    "bfloat16": (np.dtype("<u2"), np.dtype(np.float32)),
    "uint8": (np.dtype("u1"), np.dtype(np.uint8)),  # codes of quantized cases
    "int8": (np.dtype("i1"), np.dtype(np.int8)),
}
_CODE_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}


def pack_nvfp4(codes):
    """E2M1 codes (0..15, last dim even) -> bytes two per byte along the last dim, element 2k in
    the low nibble of byte k (fixtures/SCHEMA.md, "NVFP4 packing")."""
    c = np.asarray(codes, dtype=np.uint8)
    if c.shape[-1] % 2:
        raise ValueError("NVFP4 codes need an even last dim")
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_nvfp4(packed):
    """The inverse of pack_nvfp4."""
    b = np.asarray(packed, dtype=np.uint8)
    return np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[:-1] + (2 * b.shape[-1],))


class Declined(Exception):
    """Raised by run() for a case the candidate does not take after all."""


class ProtocolError(Exception):
    """The host sent something this module cannot read; the stream is lost."""


def bfloat16_to_float32(bits):
    """uint16 bit patterns of bfloat16 -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bfloat16(values):
    """float32 values -> uint16 bfloat16 bit patterns, round to nearest, ties to even.

    Overflow goes to infinity; NaN becomes the quiet NaN 0x7fc0 with its sign.
    """
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    # Adding 0x7fff plus the lowest kept bit, then truncating, rounds to nearest even; a carry
    # into the exponent is the correct rounding up to the next binade (or to infinity).
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) & 0x8000).astype(np.uint16) | np.uint16(0x7FC0)
    return rounded.reshape(f.shape)


def _float64_to_float32_odd(values):
    """float64 -> float32 rounded to odd: truncated, with the last bit set when inexact.

    Rounding that to bfloat16 (16 fewer significand bits) to nearest even gives the correctly
    rounded bfloat16 of the float64 value: no double-rounding error.
    """
    d = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        f = d.astype(np.float32)  # nearest even
    inexact = np.isfinite(d) & (f.astype(np.float64) != d)
    if inexact.any():
        # Step back toward zero where nearest went away from it: now a truncation.
        away = inexact & (np.abs(f.astype(np.float64)) > np.abs(d))
        f[away] = np.nextafter(f[away], np.float32(0))
        bits = f.view(np.uint32)
        bits[inexact] |= np.uint32(1)
    return f


def to_wire(name, value, dtype, shape):
    """Converts an output to its requested dtype and checks its shape; returns the bytes."""
    a = np.asarray(value)
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"output '{name}' has shape {list(a.shape)}, the case wants {list(shape)}")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"output '{name}' has dtype {a.dtype}, not a number type")
    if dtype in _CODE_RANGE:  # codes: integers within the dtype's range, never rounded or wrapped
        lo, hi = _CODE_RANGE[dtype]
        f = a.astype(np.float64)
        bad = ~((f >= lo) & (f <= hi) & (f == np.floor(f)))
        if bad.any():
            i = int(np.flatnonzero(bad.reshape(-1))[0])
            raise ValueError(f"output '{name}': element {i} ({f.reshape(-1)[i]!r}) is not a {dtype} code ({lo} to {hi})")
        return np.ascontiguousarray(f.astype(_WIRE[dtype][0])).tobytes()
    if dtype == "bfloat16":
        if a.dtype == np.float64 or np.issubdtype(a.dtype, np.integer):
            a = _float64_to_float32_odd(a.astype(np.float64))
        bits = float32_to_bfloat16(a.astype(np.float32))
        return np.ascontiguousarray(bits, dtype="<u2").tobytes()
    wire, _ = _WIRE[dtype]
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(a, dtype=wire).tobytes()


def from_wire(entry, data):
    dtype = entry["dtype"]
    wire, _ = _WIRE[dtype]
    a = np.frombuffer(data, dtype=wire).reshape(entry["shape"])
    if dtype == "bfloat16":
        return bfloat16_to_float32(a)
    return a.astype(wire.newbyteorder("="), copy=True)  # native order, writable


def _check_entry(e):
    if not isinstance(e, dict) or not isinstance(e.get("name"), str) or e.get("dtype") not in _WIRE:
        raise ProtocolError(f"bad tensor entry {e!r}")
    shape = e.get("shape")
    if not isinstance(shape, list) or any(not isinstance(d, int) or d < 0 for d in shape):
        raise ProtocolError(f"bad shape in {e!r}")
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if e.get("nbytes") != n * _WIRE[e["dtype"]][0].itemsize:
        raise ProtocolError(f"nbytes does not match the shape in {e!r}")
    return e


class _Channel:
    def __init__(self, rfile, wfile):
        self.r = rfile
        self.w = wfile

    def send(self, header, payloads=()):
        line = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
        self.w.write(line)
        for p in payloads:
            self.w.write(p)
        self.w.flush()

    def read_line(self):
        line = self.r.readline(MAX_HEADER_BYTES + 1)
        if not line:
            return None  # end of input at a message boundary
        if not line.endswith(b"\n"):
            raise ProtocolError("header cut off or longer than 1 MiB")
        return line

    def read_exact(self, n):
        data = self.r.read(n)
        if data is None or len(data) != n:
            raise ProtocolError(f"end of input after {0 if data is None else len(data)} of {n} payload bytes")
        return data


def _protocol_streams():
    """Takes fd 1 for the protocol and points fd 1 (and sys.stdout) at stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return sys.stdin.buffer, out


def serve_error_at_startup(message):
    """Instead of serve(): says why the candidate cannot serve at all (PROTOCOL.md) and exits 1."""
    _, out = _protocol_streams()
    _Channel(None, out).send({"type": "error", "message": str(message)})
    sys.exit(1)


def serve(name, capabilities, run_fn, description="", exit=True):
    """Serves run_fn until bye or end of input. Exits the process (status 0, or 2 when the
    request stream is lost) unless exit=False, in which case the status is returned."""
    rfile, wfile = _protocol_streams()
    ch = _Channel(rfile, wfile)
    status = _serve(ch, name, capabilities, run_fn, description)
    wfile.flush()
    if exit:
        sys.exit(status)
    return status


def _serve(ch, name, capabilities, run_fn, description):
    hello = {"protocol": PROTOCOL, "version": VERSION, "type": "hello", "name": name,
             "capabilities": dict(capabilities)}
    if description:
        hello["description"] = description
    try:
        ch.send(hello)
        while True:
            try:
                line = ch.read_line()
                if line is None:
                    return 0
                try:
                    header = json.loads(line)
                except ValueError as e:
                    raise ProtocolError(f"request is not JSON: {e}")
                if not isinstance(header, dict):
                    raise ProtocolError("request is not a JSON object")
                kind = header.get("type")
                if kind == "bye":
                    return 0
                if kind != "run":
                    raise ProtocolError(f"unknown request type {kind!r}")
                entries = header.get("inputs")
                if not isinstance(entries, list):
                    raise ProtocolError("request has no 'inputs' list")
                entries = [_check_entry(e) for e in entries]
                inputs = {e["name"]: from_wire(e, ch.read_exact(e["nbytes"])) for e in entries}
            except ProtocolError as e:
                ch.send({"type": "error", "message": f"malformed request, giving up: {e}"})
                return 2
            _answer(ch, header, inputs, run_fn)
    except (BrokenPipeError, ConnectionResetError):
        return 2  # the host is gone


def _answer(ch, header, inputs, run_fn):
    try:
        case = dict(header.get("case") or {})
        wanted = {o["name"]: o for o in header.get("outputs", [])}
        case["outputs"] = {k: {x: (list(o[x]) if x == "shape" else o[x]) for x in ("dtype", "shape", "codes", "packing")
                               if x in o} for k, o in wanted.items()}
        case["request"] = header.get("request")
        outs = run_fn(case, inputs)
        entries, payloads = [], []
        for oname, value in (outs or {}).items():
            if value is None:
                continue  # not computed: MISSING
            if oname not in wanted:
                raise ValueError(f"run() returned output '{oname}', which the case does not have")
            o = wanted[oname]
            data = to_wire(oname, value, o["dtype"], o["shape"])
            entries.append({"name": oname, "dtype": o["dtype"], "shape": list(o["shape"]), "nbytes": len(data)})
            payloads.append(data)
    except Declined as d:
        ch.send({"type": "decline", "reason": str(d) or "declined"})
        return
    except Exception as e:  # noqa: BLE001 - any failure of the candidate is an error reply
        traceback.print_exc(file=sys.stderr)
        ch.send({"type": "error", "message": f"{type(e).__name__}: {e}"})
        return
    reply = {"type": "result", "outputs": entries}
    if header.get("request") is not None:
        reply["request"] = header["request"]
    ch.send(reply, payloads)
