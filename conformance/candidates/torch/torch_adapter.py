#!/usr/bin/env python3
"""PyTorch as a normcheck candidate (subprocess protocol, conformance/PROTOCOL.md).

    --candidate "cmd:/usr/bin/python3 conformance/candidates/torch/torch_adapter.py [--device cpu|cuda]"

LayerNorm is torch.nn.functional.layer_norm (forward; backward by autograd: dx, dweight, dbias);
mean and rstd come from torch.native_layer_norm, the op layer_norm calls. RMSNorm is written as
Hugging Face writes it (torch 1.13 has no rms_norm):
  contract `llama`: LlamaRMSNorm.forward: x.float(), variance = pow(2).mean, x * rsqrt(var + eps),
                    cast to the input dtype, then `weight * x_hat` in torch's promoted dtype;
  contract `gemma` (and `exact`): GemmaRMSNorm.forward: everything in float32,
                    x_hat * (1 + weight.float()), one cast at the end.
Fused residual add: h = alpha*x + residual (+ residual_bias) in float32; with the
`fused_add_lowp` contract h is rounded to dtype_residual before the statistics (vLLM's fused
kernel), otherwise the statistics see the float32 h. residual_out is h in dtype_residual.

What PyTorch does with low-precision LayerNorm (checked with torch 1.13.0 on this machine's CPU,
2026-11; see the report of the subprocess transport):
  - float32: one float32 kernel; the `exact` contract within float32 rounding.
  - bfloat16: the native kernel is NOT "float32 compute, one rounding": it returns mean and
    rstd in bfloat16, the mean off by up to 1.8 bfloat16 ulps, and y differs from the correctly
    rounded value in 40-70 % of the elements, up to several ulps (the float32 path rounded once
    matches it everywhere): normcheck FAILS it against float32 compute. The adapter therefore
    declines bfloat16/float16 LayerNorm on the CPU in `native` mode (UNSUPPORTED, with this
    reason); --layernorm-lowp upcast runs float32 and rounds once (what autocast does: it runs
    layer_norm in float32), and --layernorm-lowp native-as-float32 claims float32 compute for
    the native kernel anyway, to see the difference.
  - float16: torch 1.13 has no CPU float16 layer_norm kernel; such cases are declined with the
    error torch gives (on CUDA the native float16 kernel runs).
Declined: `llama` with a bias (LlamaRMSNorm has none) or with weight * x-hat rounded in a promoted
dtype other than dtype_out where the product is not exact there (a rounding the contract does not
have); backward of `fused_add_lowp` where dtype_residual is narrower than dtype_x or
dtype_param, or narrower than float32 with alpha != 1, dtype_x != dtype_residual or a residual
bias (autograd's gradient of h.to(dtype_residual) is itself rounded to dtype_residual, so dx and
the residual bias's gradient carry a rounding the reference's backward does not have; found by
`normcheck prop`), blocks,
normalized dims that are not the trailing ones (layer_norm's normalized_shape
covers trailing dims only; an `axis`, or an `axes` list that is a trailing range, is fine),
dtype_compute other than float32, contracts other than the above for each op.
"""
import argparse
import os
import sys

# normcheck_protocol.py: beside this file in an installation (share/normcheck/python), in
# conformance/python/ in the source tree (this file is conformance/candidates/torch/).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "python")]
from normcheck_protocol import Declined, serve, serve_error_at_startup  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--layernorm-lowp", choices=["native", "upcast", "native-as-float32"], default="native",
                    help="float16/bfloat16 LayerNorm: PyTorch's own kernel, or float32 rounded once")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means no candidate
        serve_error_at_startup(f"cannot import torch: {type(e).__name__}: {e}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        serve_error_at_startup(f"CUDA not available: torch {torch.__version__} reports "
                               f"torch.cuda.is_available() = False")
    device = torch.device(args.device)
    tdtype = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
              "bfloat16": torch.bfloat16}
    role = {"x": "dtype_x", "weight": "dtype_param", "bias": "dtype_param", "residual_bias": "dtype_param",
            "residual": "dtype_residual", "dy": "dtype_out"}

    def run(case, inputs):
        parts = set(case["contract"].split("+"))
        lowp_h = "fused_add_lowp" in parts
        rest = parts - {"fused_add_lowp"}
        op = case["op"]
        if op == "layernorm" and not rest <= {"exact"}:
            raise Declined(f"contract {case['contract']} is not what torch layer_norm does")
        if op == "rmsnorm" and not (len(rest) <= 1 and rest <= {"exact", "llama", "gemma"}):
            raise Declined(f"contract {case['contract']} is not one of the Hugging Face RMSNorms")
        if case["block"] != "none":
            raise Declined("residual blocks are not implemented")
        if case["dtype_compute"] != "float32":
            raise Declined("only float32 accumulation")
        if (op == "rmsnorm" and "llama" in rest and case["direction"] == "backward"
                and case["dtype_x"] in ("bfloat16", "float16")):
            # Autograd through LlamaRMSNorm rounds the gradient of x-hat to dtype_x (the backward
            # of .to(input_dtype)) and takes dweight = sum dy * x-hat rounded to dtype_x, the
            # derivative of the function computed; the reference's backward is float32 compute
            # with the unrounded x-hat (reference/README.md). Measured on the ci tier: dweight
            # off by up to 21 % where the row sum cancels.
            raise Declined("autograd through HF LlamaRMSNorm computes the x-hat gradient in "
                           f"{case['dtype_x']} and dweight from the rounded x-hat: not the float32 backward "
                           "the reference defines")
        prec = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}
        if op == "rmsnorm" and "llama" in rest and "bias" in inputs:
            # LlamaRMSNorm has no bias; adding one after `weight * x_hat` (rounded in the promoted
            # dtype) rounds twice where the contract rounds once. Found by `normcheck prop`
            # (agreement, seed 7): float16 y 1.06x its allowance.
            raise Declined("HF LlamaRMSNorm has no bias (weight * x-hat is rounded before any bias "
                           "could be added)")
        if op == "rmsnorm" and "llama" in rest and "weight" in inputs and float.fromhex(case["weight_offset_hex"]) == 0:
            promoted = str(torch.promote_types(tdtype[case["dtype_param"]], tdtype[case["dtype_x"]])).split(".")[-1]
            # The product is rounded in the promoted dtype, then cast to dtype_out: one rounding
            # as the contract has it only when the two dtypes are the same or the product is exact
            # in a promoted float32/float64 (as wide as both operands' significands together, and a
            # range holding every output). Found by `normcheck prop` twice: float16 y 1.06x its
            # allowance (seed 7, promoted narrower than dtype_out), and bfloat16 y 1.1x (10000
            # tests, seed 11: a float16 product cast to bfloat16, rounded twice).
            exact = (promoted in ("float32", "float64")
                     and prec[promoted] >= prec[case["dtype_param"]] + prec[case["dtype_x"]])
            if promoted != case["dtype_out"] and not exact:
                raise Declined(f"LlamaRMSNorm rounds weight * x-hat to {promoted} before the cast to "
                               f"{case['dtype_out']}: a rounding point the llama contract does not have")
        if lowp_h and case["residual"] != "none" and case["direction"] == "backward":
            # Autograd through h.to(dtype_residual) hands back dh in dtype_residual; the reference's
            # backward of the fused_add_lowp contract rounds only at the outputs. The rounding shows
            # where dtype_residual is narrower than dx's or the parameters' dtype, and, below
            # float32, where dx = alpha * round(dh) is rounded again (alpha != 1, another dx dtype)
            # or the residual bias's gradient sums rounded terms. Found by `normcheck prop`:
            # agreement, seed 7, dx 776x its float32 allowance (a bfloat16 residual, float32 x);
            # 10000 tests, seed 11, test 1124: bfloat16 x and residual, alpha 1.25, dx one bfloat16
            # ulp off (1.61x its allowance).
            res = case["dtype_residual"]
            narrower = prec[res] < max(prec[case["dtype_x"]], prec[case["dtype_param"]])
            rounded_again = prec[res] < prec["float32"] and (
                float.fromhex(case["alpha_hex"]) != 1 or case["dtype_x"] != res or case["residual"] == "add_bias")
            if narrower or rounded_again:
                raise Declined(f"autograd through h.to({res}) rounds the gradient of h to {res}, which dx "
                               "(or the residual bias's gradient) then carries: a rounding point the reference's "
                               "backward of fused_add_lowp does not have")
        rank = inputs["x"].ndim
        dims = list(case["norm_dims"])
        if dims != list(range(rank - len(dims), rank)):
            raise Declined(f"normalized dims {dims} are not trailing: layer_norm's normalized_shape "
                           f"covers trailing dims only")
        backward = case["direction"] == "backward"
        dt = {k: tdtype[case[k]] for k in ("dtype_x", "dtype_param", "dtype_out", "dtype_residual")}

        def tensor(name):
            if name not in inputs:
                return None
            t = torch.from_numpy(inputs[name]).to(device=device).to(dtype=dt[role[name]])
            return t.requires_grad_(backward and name != "dy")

        x, w, b = tensor("x"), tensor("weight"), tensor("bias")
        r, rb, dy = tensor("residual"), tensor("residual_bias"), tensor("dy")
        eps = float.fromhex(case["epsilon_hex"])
        alpha = float.fromhex(case["alpha_hex"])
        offset = float.fromhex(case["weight_offset_hex"])
        out = {}
        with torch.set_grad_enabled(backward):
            h = x
            if case["residual"] != "none":
                h = alpha * x.float() + r.float()
                if rb is not None:
                    h = h + rb.float()
                if lowp_h:
                    h = h.to(dt["dtype_residual"])
                out["residual_out"] = h.to(dt["dtype_residual"])
            nshape = tuple(h.shape[rank - len(dims):])
            if op == "layernorm":
                scale = w if (w is None or offset == 0) else (offset + w.float())
                tensors = [t for t in (h, scale, b) if t is not None]
                native = args.layernorm_lowp != "upcast" and len({t.dtype for t in tensors}) == 1
                cdt = h.dtype if native else torch.float32
                if args.layernorm_lowp == "native" and native and device.type == "cpu" and cdt in (torch.bfloat16, torch.float16):
                    # Measured with torch 1.13 (module docstring): the CPU kernel keeps mean and
                    # rstd in the input dtype, so it is not the float32 compute the case asks for.
                    raise Declined(f"torch {torch.__version__} CPU {case['dtype_x']} layer_norm keeps its statistics "
                                   f"in {case['dtype_x']}, not float32; --layernorm-lowp upcast runs float32 and "
                                   f"rounds once")
                hc, sc, bc = (None if t is None else t.to(cdt) for t in (h, scale, b))
                try:
                    y = F.layer_norm(hc, nshape, sc, bc, eps)
                    if not backward:
                        _, mean, rstd = torch.native_layer_norm(hc, nshape, sc, bc, eps)
                        out["mean"], out["rstd"] = mean, rstd
                except RuntimeError as e:
                    if "not implemented for" in str(e):
                        raise Declined(f"torch {torch.__version__} on {device}: {e}")
                    raise
            else:
                hs = h.float()
                var = hs.pow(2).mean(dim=tuple(dims), keepdim=True)
                rstd = torch.rsqrt(var + eps)
                out["rstd"] = rstd
                xhat = hs * rstd
                if "llama" in rest:
                    scale = w if (w is None or offset == 0) else (offset + w.float())
                    xhat = xhat.to(dt["dtype_x"])  # LlamaRMSNorm: hidden_states.to(input_dtype)
                    y = xhat if scale is None else scale * xhat
                else:
                    y = xhat if w is None else xhat * (offset + w.float())
                if b is not None:
                    y = y.float() + b.float()
            y = y.to(dt["dtype_out"])
            if not backward:
                out["y"] = y
            else:
                y.backward(dy)
                grads = {"dx": x, "dweight": w, "dbias": b, "dresidual": r, "dresidual_bias": rb}
                out = {k: v.grad for k, v in grads.items() if v is not None and v.grad is not None}
        result = {}
        for name, t in out.items():
            spec = case["outputs"].get(name)
            if spec is None:
                continue
            t = t.detach().reshape(spec["shape"]).cpu()
            # numpy has no bfloat16: widen exactly; the module rounds it back (exactly).
            result[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        return result

    caps = {
        "ops": ["layernorm", "rmsnorm"],
        "dtypes": ["float32", "float16", "bfloat16"],
        "compute_dtypes": ["float32"],
        "directions": ["forward", "backward"],
        "contracts": ["exact", "llama", "gemma", "fused_add_lowp"],
        "residual": True,
        "blocks": False,
        "general_axes": True,
        "weight_offset": True,
        "device": str(device),
    }
    serve(f"torch {torch.__version__} ({device})", caps, run,
          description=f"F.layer_norm and HF-style RMSNorm; low-precision LayerNorm: {args.layernorm_lowp}")


if __name__ == "__main__":
    main()
