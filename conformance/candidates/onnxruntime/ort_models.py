#!/usr/bin/env python3
"""Builds the one-node ONNX model that ort_adapter.js runs for a case (conformance/candidates/onnxruntime/).

    /usr/bin/python3 ort_models.py --out MODEL.onnx '{"op": "LayerNormalization", ...}'

The spec (JSON, made by ort_adapter.js, which also names the cached file after it):
  op        LayerNormalization (ONNX, opset 17), SimplifiedLayerNormalization (ONNX Runtime's
            RMSNorm, registered in the ONNX domain), SkipLayerNormalization or
            SkipSimplifiedLayerNormalization (domain com.microsoft, version 1)
  dtype     float32 or float16: the type T of every tensor input and of Y (and the residual sum)
  stats_dtype  float32: the type U of Mean / InvStdDev (stash_type = 1)
  rank      rank of X (all extents symbolic: one model serves every shape of that rank)
  axis      first normalized dim, in [0, rank) (the two plain ops; the Skip ops normalize the last dim)
  axis_attr the value of the `axis` attribute: the case's own axis when it has one, negative ones
            included (ONNX resolves axis < 0 as axis + rank: that is ONNX Runtime's job, and a
            fault it has had, onnxruntime #26407); else `axis`
  epsilon_hex  C99 hex float of the case's binary64 epsilon; ONNX stores the attribute as a
            float32, so the op sees epsilon rounded to float32 (TOLERANCE.md 3.4, conv(eps))
  inputs    the graph inputs present, by ONNX input slot name (see SLOTS)
  outputs   the graph outputs wanted, by ONNX output slot name

Only onnx.helper is used (Debian's python3-onnx 1.12). The ONNX checker validates the opset-17
LayerNormalization model; it does not know ONNX Runtime's own ops, whose input and output
slots are those of onnxruntime/core/graph/contrib_ops (bert_defs.cc) in ONNX Runtime 1.30.
The file is written to a temporary name and renamed, so concurrent adapters share the cache.
"""
import argparse
import json
import os
import sys
import tempfile

import onnx
from onnx import TensorProto, helper

# The input and output slots of each op, in order ("" marks an absent optional one).
SLOTS = {
    "LayerNormalization": (["X", "Scale", "B"], ["Y", "Mean", "InvStdDev"]),
    "SimplifiedLayerNormalization": (["X", "Scale"], ["Y", "InvStdDev"]),
    "SkipLayerNormalization": (["X", "Skip", "Gamma", "Beta", "Bias"], ["Y", "Mean", "InvStdDev", "Sum"]),
    "SkipSimplifiedLayerNormalization": (["X", "Skip", "Gamma", "Bias"], ["Y", "Mean", "InvStdDev", "Sum"]),
}
DOMAIN = {"LayerNormalization": "", "SimplifiedLayerNormalization": "",
          "SkipLayerNormalization": "com.microsoft", "SkipSimplifiedLayerNormalization": "com.microsoft"}
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def build(spec):
    op = spec["op"]
    if op not in SLOTS:
        raise ValueError(f"unknown op {op!r}")
    in_slots, out_slots = SLOTS[op]
    t, u = ELEM[spec["dtype"]], ELEM[spec["stats_dtype"]]
    rank, axis = int(spec["rank"]), int(spec["axis"])
    if not 0 <= axis < rank:
        raise ValueError(f"axis {axis} outside rank {rank}")
    skip = op.startswith("Skip")
    if skip:
        axis = rank - 1
    dims = [f"d{i}" for i in range(rank)]
    stat_dims = [f"d{i}" if i < axis else 1 for i in range(rank)]
    full = {"X", "Skip", "Y", "Sum"}

    def shape_of(slot):
        if slot in full:
            return dims
        if slot in ("Mean", "InvStdDev"):
            return stat_dims
        return dims[axis:]  # Scale, B, Gamma, Beta, Bias: the normalized dims

    inputs, outputs = set(spec["inputs"]), set(spec["outputs"])
    for name in inputs - set(in_slots):
        raise ValueError(f"{op} has no input {name}")
    for name in outputs - set(out_slots):
        raise ValueError(f"{op} has no output {name}")
    node_in = [s if s in inputs else "" for s in in_slots]
    node_out = [s if s in outputs else "" for s in out_slots]
    while node_in and node_in[-1] == "":
        node_in.pop()
    while node_out and node_out[-1] == "":
        node_out.pop()

    attrs = {"epsilon": float.fromhex(spec["epsilon_hex"])}
    if not skip:
        attrs["axis"] = int(spec.get("axis_attr", axis))
        if attrs["axis"] not in (axis, axis - rank):
            raise ValueError(f"axis_attr {attrs['axis']} is not axis {axis} of rank {rank}")
        attrs["stash_type"] = 1
    node = helper.make_node(op, node_in, node_out, domain=DOMAIN[op], **attrs)
    g_in = [helper.make_tensor_value_info(s, t, shape_of(s)) for s in in_slots if s in inputs]
    g_out = [helper.make_tensor_value_info(s, u if s in ("Mean", "InvStdDev") else t, shape_of(s))
             for s in out_slots if s in outputs]
    graph = helper.make_graph([node], f"normcheck_{op}", g_in, g_out)
    opsets = [helper.make_opsetid("", 17)]
    if DOMAIN[op]:
        opsets.append(helper.make_opsetid(DOMAIN[op], 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8, producer_name="normcheck")
    if op == "LayerNormalization":
        onnx.checker.check_model(model)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the model file to write")
    ap.add_argument("spec", help="the model's spec, JSON")
    a = ap.parse_args()
    try:
        model = build(json.loads(a.spec))
    except (ValueError, KeyError, TypeError, onnx.checker.ValidationError) as e:
        print(f"ort_models.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    d = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".model-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
        os.replace(tmp, a.out)
    except BaseException:
        os.unlink(tmp)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
