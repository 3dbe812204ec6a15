#!/usr/bin/python3
"""ctest onnxruntime.verdicts: the onnxruntime-* candidates give the verdicts they must.

    ort_test.py NORMCHECK WORK_DIR SMOKE_H5

1. Without the npm package (NORMCHECK_ORT_DIR pointed at an empty folder) every candidate is
   still listed and makes every case UNSUPPORTED with the reason "ONNX Runtime is not installed",
   and the run exits 0: a machine without npm keeps a working suite.
2. With it (else the test ends here with exit 77, SKIPPED, saying why), the case list
   tests/ort_cases.json, one case per mapping the adapter makes or declines, gives exactly the
   verdicts of EXPECTED below (a wrong mapping, e.g. the Skip ops' Bias in the Beta slot, turns
   a PASSED into FAILED), and the smoke tier conforms: no FAILED, CRASHED, TIMEOUT or MISSING,
   and every candidate passes some case.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ORT_DIR = os.path.dirname(HERE)
KERNELS = ["layernorm", "rmsnorm", "skip-layernorm", "skip-rmsnorm"]
BAD = {"FAILED", "CRASHED", "TIMEOUT", "MISSING"}

# (candidate, case) -> verdict, or (verdict, a piece of the reason). Cases of the other op are
# UNSUPPORTED for each candidate and are checked as such below.
EXPECTED = {
    "layernorm": {
        "ln_f32_wb": "PASSED", "ln_f32_noaffine": "PASSED", "ln_f16_wb": "PASSED", "ln_f32_axis1": "PASSED",
        "ln_f32_h256_mean1000": "PASSED",
        "ln_f32_eps0_constant": "MISTRUSTED",  # rows with q = 0: y is NaN, TOLERANCE.md section 5
        "ln_f32_add_bias": ("UNSUPPORTED", "fused residual"), "ln_f16_add": ("UNSUPPORTED", "fused residual"),
        "ln_f32_alpha": ("UNSUPPORTED", "fused residual"),
        "ln_f16_add_near_overflow": ("UNSUPPORTED", "fused residual"),
        "ln_f32_add_bias_large_mean": ("UNSUPPORTED", "fused residual"),
        "ln_bf16": ("UNSUPPORTED", "bfloat16"), "ln_f16_onnx": ("UNSUPPORTED", "contract onnx"),
    },
    "rmsnorm": {
        "rms_f32_w": "PASSED", "rms_f16_w": "PASSED", "rms_f32_axis_m2": "PASSED",
        "rms_f32_wb": ("UNSUPPORTED", "no bias input"),
        "rms_f32_add_bias": ("UNSUPPORTED", "fused residual"), "rms_f16_add": ("UNSUPPORTED", "fused residual"),
        "rms_f16_lowp": ("UNSUPPORTED", "fused residual"), "rms_f16_add_bias": ("UNSUPPORTED", "fused residual"),
    },
    "skip-layernorm": {
        "ln_f32_add_bias": "PASSED", "ln_f16_add": "PASSED", "ln_f32_add_bias_large_mean": "PASSED",
        "ln_f16_add_near_overflow": "PASSED",  # residual_out inf where x + skip > 65504, as it must
        # residual none runs with skip = 0 (exact): the Skip kernel's own statistics
        "ln_f32_wb": "PASSED", "ln_f32_noaffine": "PASSED", "ln_f16_wb": "PASSED", "ln_f32_h256_mean1000": "PASSED",
        "ln_f32_eps0_constant": "MISTRUSTED",
        "ln_f32_axis1": ("UNSUPPORTED", "other than the last"), "ln_f32_alpha": ("UNSUPPORTED", "alpha 0.5"),
        "ln_bf16": ("UNSUPPORTED", "bfloat16"), "ln_f16_onnx": ("UNSUPPORTED", "contract onnx"),
    },
    "skip-rmsnorm": {
        "rms_f32_add_bias": "PASSED", "rms_f16_add": "PASSED", "rms_f16_add_bias": "PASSED",
        "rms_f32_w": "PASSED", "rms_f16_w": "PASSED",
        "rms_f32_wb": ("UNSUPPORTED", "no output bias"), "rms_f16_lowp": ("UNSUPPORTED", "fused_add_lowp"),
        "rms_f32_axis_m2": ("UNSUPPORTED", "other than the last"),
    },
}


def run(normcheck, fixtures, out, env=None, extra=()):
    cmd = [normcheck, "run", "--fixtures", fixtures, "--json-dir", out, "--force", *extra]
    for k in KERNELS:
        cmd += ["--candidate", f"builtin:onnxruntime-{k}"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    print(p.stdout + p.stderr)
    results = {}
    for k in KERNELS:
        with open(os.path.join(out, f"builtin_onnxruntime-{k}.json")) as f:
            results[k] = {c["case_id"]: c for c in json.load(f)["cases"]}
    return p.returncode, results


def main():
    normcheck, work, smoke = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    errors = []
    cases_h5 = os.path.join(work, "ort_cases.h5")
    subprocess.run([normcheck, "fixtures", "generate", "--cases", os.path.join(HERE, "ort_cases.json"),
                    "-o", cases_h5, "--force"], check=True)

    # 1. Not installed: listed, every case UNSUPPORTED with the reason, and exit 1 ("nothing was
    #    checked": a CI job must not pass on candidates that never ran; --allow-empty exits 0).
    with tempfile.TemporaryDirectory() as empty:
        env = dict(os.environ, NORMCHECK_ORT_DIR=empty)
        listing = subprocess.run([normcheck, "candidates"], env=env, capture_output=True, text=True, check=True).stdout
        for k in KERNELS:
            if f"builtin:onnxruntime-{k} " not in listing or "ONNX Runtime is not installed" not in listing:
                errors.append(f"without the package, builtin:onnxruntime-{k} is not listed with the reason")
        rc, res = run(normcheck, cases_h5, os.path.join(work, "absent"), env)
        if rc != 1:
            errors.append(f"without the package the run exits {rc}, not 1 (nothing was checked)")
        rc_allowed, _ = run(normcheck, cases_h5, os.path.join(work, "absent"), env, ["--allow-empty"])
        if rc_allowed != 0:
            errors.append(f"without the package the run with --allow-empty exits {rc_allowed}, not 0")
        for k, cases in res.items():
            for cid, c in cases.items():
                if c["verdict"] != "UNSUPPORTED":
                    errors.append(f"absent package: {k} {cid} is {c['verdict']}, not UNSUPPORTED")
            if not any("ONNX Runtime is not installed" in c.get("message", "") for c in cases.values()):
                errors.append(f"absent package: {k} never says 'ONNX Runtime is not installed'")

    if not os.path.exists(os.path.join(ORT_DIR, "node_modules", "onnxruntime-node", "package.json")):
        if errors:
            print("\n".join("FAIL: " + e for e in errors))
            return 1
        print("SKIPPED: onnxruntime-node is not installed (scripts/install-onnxruntime.sh); the absent-package "
              "behaviour was checked")
        return 77

    # 2. Installed: the expected verdicts, case by case.
    rc, res = run(normcheck, cases_h5, os.path.join(work, "cases"))
    if rc != 0:
        errors.append(f"the case list run exits {rc}")
    for k, cases in res.items():
        for cid, c in cases.items():
            want = EXPECTED[k].get(cid, ("UNSUPPORTED", "not supported"))
            verdict, reason = (want, None) if isinstance(want, str) else want
            if c["verdict"] != verdict or (reason and reason not in c.get("message", "")):
                errors.append(f"{k} {cid}: {c['verdict']} ({c.get('message', '')}), expected {verdict}"
                              + (f" with '{reason}'" if reason else ""))

    # 3. The smoke tier conforms.
    rc, res = run(normcheck, smoke, os.path.join(work, "smoke"))
    if rc != 0:
        errors.append(f"the smoke tier run exits {rc}")
    for k, cases in res.items():
        for cid, c in cases.items():
            if c["verdict"] in BAD:
                errors.append(f"smoke: {k} {cid} is {c['verdict']}: {c.get('message', '')}")
        if k in ("layernorm", "rmsnorm", "skip-layernorm") and not any(c["verdict"] == "PASSED" for c in cases.values()):
            errors.append(f"smoke: {k} passes no case")

    if errors:
        print("\n".join("FAIL: " + e for e in errors))
        return 1
    print("onnxruntime verdicts: as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
