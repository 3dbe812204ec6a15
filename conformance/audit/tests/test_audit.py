"""End-to-end tests of `normcheck audit` on real small checkpoints: PyTorch models with each
profiled architecture's norm layout, written as safetensors, GGUF and HDF5 (ckpt_writers.py).
Clean checkpoints must give no error findings; each planted fault (FAULTS.md class F) must be
found by its check, naming the tensors; bad files must exit 2 with a message naming the
problem, without a crash.

usage: test_audit.py NORMCHECK [--big]   (--big: also time a 10 GB sparse safetensors file)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_writers as w  # noqa: E402

NORMCHECK = sys.argv[1]
failures = []
count = 0
MAX_RSS_MIB = 0  # set in main(): `normcheck version`'s own peak (15 MiB; more under ASan) + 48 MiB


class Done:
    pass


# Linux keeps a process's peak RSS across fork and exec, so a child of this (torch-sized)
# interpreter would report this interpreter's peak: children whose memory is measured are
# started by a small interpreter without site packages, which reports wait4's ru_maxrss.
SPAWNER = """
import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_child(argv, measure=False):
    """Runs argv; returns returncode, stdout, stderr and (measure) its peak RSS in MiB."""
    with tempfile.TemporaryFile() as o, tempfile.TemporaryFile() as e, tempfile.NamedTemporaryFile() as r:
        if measure:
            argv = [sys.executable, "-S", "-c", SPAWNER, r.name, *argv]
        proc = subprocess.run(argv, stdout=o, stderr=e, timeout=120)
        o.seek(0)
        e.seek(0)
        d = Done()
        d.returncode, d.stdout, d.stderr = proc.returncode, o.read().decode(), e.read().decode()
        d.rss_mib = int(open(r.name).read() or 0) / 1024 if measure else 0
        return d


def run(args, tmp, measure=False):
    out = os.path.join(tmp, f"r{count}.json")
    p = run_child([NORMCHECK, "audit", *args, "--json", out], measure)
    res = json.load(open(out)) if os.path.exists(out) else None
    return p, res


def check(name, args, tmp, rc, expect=(), absent=(), stderr=None, measure=False):
    """expect: (severity, check, substring of a tensor name or of the message); absent: (severity, check)."""
    global count
    count += 1
    p, res = run(args, tmp, measure)
    problems = []
    if p.returncode != rc:
        problems.append(f"exit {p.returncode}, expected {rc}")
    if p.returncode < 0 or p.returncode > 3:
        problems.append("crashed")
    if p.rss_mib > MAX_RSS_MIB:
        problems.append(f"max RSS {p.rss_mib:.0f} MiB (bound {MAX_RSS_MIB})")
    if stderr and stderr not in p.stderr:
        problems.append(f"stderr lacks {stderr!r}: {p.stderr.strip()!r}")
    findings = res["findings"] if res else []
    for sev, chk, sub in expect:
        if not any(f["severity"] == sev and f["check"] == chk and (sub in f["message"] or any(sub in t for t in f["tensors"]))
                   for f in findings):
            problems.append(f"no {sev} {chk} finding mentioning {sub!r}")
    for sev, chk in absent:
        hits = [f["message"] for f in findings if f["severity"] == sev and (chk is None or f["check"] == chk)]
        if hits:
            problems.append(f"unexpected {sev} {chk}: {hits[:2]}")
    if res is not None:
        assert res["format"] == "normcheck-results" and res["mode"] == "audit", res.keys()
        assert sum(res["summary"].values()) == len(findings)
    status = "ok  " if not problems else "FAIL"
    print(f"{status} {name}" + ("" if not problems else "\n       " + "\n       ".join(problems)))
    if problems:
        failures.append(name)
        print("       stdout:", p.stdout[-2000:], "\n       stderr:", p.stderr[-500:])


def save(tmp, name, tensors, cfg=None, fmt="safetensors"):
    path = os.path.join(tmp, name)
    if fmt == "safetensors":
        w.write_safetensors(path, tensors, {"format": "pt"})
    elif fmt == "h5":
        w.write_h5_state_dict(path, tensors)
    args = [path]
    if cfg is not None:
        cpath = path + ".config.json"
        json.dump(cfg, open(cpath, "w"))
        args += ["--config", cpath]
    return args


def main():
    global MAX_RSS_MIB
    MAX_RSS_MIB = run_child([NORMCHECK, "version"], measure=True).rss_mib + 48
    print(f"peak RSS bound per audit: {MAX_RSS_MIB:.0f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        # --- clean checkpoints of every profile, in safetensors and GGUF, and HDF5 for a few ----
        for arch in w.ARCHS:
            cfg, sd = w.trained_state(arch)
            check(f"clean {arch} safetensors", save(tmp, f"{arch}.safetensors", sd, cfg), tmp, 0,
                  expect=[("info", "profile", arch)], absent=[("error", None), ("warning", None)])
            kv, t = w.to_gguf(arch, cfg, sd)
            g = os.path.join(tmp, f"{arch}.gguf")
            w.write_gguf(g, kv, t)
            want = "llama" if arch == "mistral" else arch
            check(f"clean {arch} gguf", [g], tmp, 0, expect=[("info", "profile", want)], absent=[("error", None), ("warning", None)])
            check(f"diff {arch} hf -> gguf (llama.cpp convention)", [g, "--source", os.path.join(tmp, f"{arch}.safetensors")], tmp, 0,
                  expect=[("info", "transform", "offset +1" if w.ARCHS[arch][2] else "renamed")], absent=[("error", None)])
        cfg, sd = w.trained_state("llama")
        check("clean llama h5 state dict", save(tmp, "llama.h5", sd, cfg, "h5"), tmp, 0, expect=[("info", "profile", "llama")],
              absent=[("error", None), ("warning", None)])
        check("clean llama bf16", save(tmp, "llama_bf16.safetensors", {k: v.bfloat16() for k, v in sd.items()}, cfg), tmp, 0,
              absent=[("error", None), ("warning", None)])
        check("clean llama by names only (no config)", save(tmp, "llama_nocfg.safetensors", sd), tmp, 0,
              expect=[("info", "profile", "chosen by tensor names")], absent=[("error", None)])
        check("clean GGUF v2", [_gguf(tmp, "llama_v2.gguf", "llama", version=2)], tmp, 0, absent=[("error", None)])

        # --- planted faults, one checkpoint each -------------------------------------------------
        cfg, sd = w.trained_state("gemma2")
        baked = {k: (v + 1 if w.is_norm(k) else v) for k, v in sd.items()}
        check("gemma2 HF with the +1 baked in", save(tmp, "g2_baked.safetensors", baked, cfg), tmp, 1,
              expect=[("error", "offset_convention", "centre near 1")])
        kv, t = w.to_gguf("gemma2", cfg, sd, add_offset=False)
        g = os.path.join(tmp, "g2_noplus.gguf")
        w.write_gguf(g, kv, t)
        check("gemma2 GGUF without the +1", [g], tmp, 1, expect=[("error", "offset_convention", "centre near 0")])
        check("diff gemma2 HF -> GGUF without the +1", [g, "--source", os.path.join(tmp, "gemma2.safetensors")], tmp, 1,
              expect=[("error", "offset_convention", "must shift the stored weights by +1")])
        kv, t = w.to_gguf("gemma2", cfg, baked)
        g = os.path.join(tmp, "g2_twice.gguf")
        w.write_gguf(g, kv, t)
        check("gemma2 GGUF with the +1 applied twice", [g], tmp, 1, expect=[("error", "offset_convention", "centre near 2")])

        check("diff gemma2 HF -> GGUF with the +1 applied twice", [g, "--source", os.path.join(tmp, "gemma2.safetensors")], tmp, 1,
              expect=[("error", "offset_convention", "offset +2"), ("error", "offset_convention", "applied twice")],
              absent=[("error", "transform")])
        check("diff gemma2 HF -> HF with +2", [save(tmp, "g2_plus2.safetensors", {k: (v + 2 if w.is_norm(k) else v) for k, v in sd.items()})[0],
              "--source", os.path.join(tmp, "gemma2.safetensors")], tmp, 1,
              expect=[("error", "offset_convention", "applied twice")], absent=[("error", "transform")])
        check("diff gemma2 GGUF -> HF (offset -1)", [os.path.join(tmp, "gemma2.safetensors"), "--source", os.path.join(tmp, "gemma2.gguf")],
              tmp, 0, expect=[("info", "transform", "offset -1")], absent=[("error", None)])
        check("diff gemma2 HF -> HF", [os.path.join(tmp, "gemma2.safetensors"), "--source", os.path.join(tmp, "gemma2.safetensors")],
              tmp, 0, expect=[("info", "transform", "13 norm tensor(s) identical")], absent=[("error", None), ("warning", None)])

        cfg, sd = w.trained_state("gemma3")
        kv, t = w.to_gguf("gemma3", cfg, sd)
        for k in list(t):
            if "attn_q_norm" in k or "attn_k_norm" in k:
                t[k] = t[k] - 1  # the converter forgot the q/k norms
        g = os.path.join(tmp, "g3_qk.gguf")
        w.write_gguf(g, kv, t)
        check("gemma3 GGUF with +1 on all norms but q/k", [g], tmp, 0,
              expect=[("warning", "offset_mixed", "blk.0.attn_q_norm.weight"), ("warning", "offset_mixed", "blk.2.attn_k_norm.weight")])

        cfg, sd = w.trained_state("llama")
        check("llama scaled by w + 1", save(tmp, "llama_plus1.safetensors", {k: (v + 1 if w.is_norm(k) else v) for k, v in sd.items()}, cfg),
              tmp, 1, expect=[("error", "offset_convention", "centre near 2")])
        check("llama zero-centred (a Gemma-style export)", save(tmp, "llama_zc.safetensors",
              {k: (v - 1 if w.is_norm(k) else v) for k, v in sd.items()}, cfg), tmp, 1, expect=[("error", "offset_convention", "centre near 0")])
        dropped = {k: v for k, v in sd.items() if k != "model.layers.1.input_layernorm.weight"}
        check("llama missing layer 1 input_layernorm", save(tmp, "llama_drop.safetensors", dropped, cfg), tmp, 1,
              expect=[("error", "missing_tensor", "model.layers.1.input_layernorm.weight")])
        check("llama missing layer 1 input_layernorm (no config)", save(tmp, "llama_drop_nocfg.safetensors", dropped), tmp, 1,
              expect=[("error", "missing_tensor", "model.layers.1.input_layernorm.weight")])
        nofinal = {k: v for k, v in sd.items() if k != "model.norm.weight"}
        check("llama missing final norm", save(tmp, "llama_nofinal.safetensors", nofinal, cfg), tmp, 1,
              expect=[("error", "missing_tensor", "model.norm.weight")])
        bad = dict(sd)
        bad["model.norm.weight"] = torch.ones(32) + 0.1 * torch.randn(32)
        check("llama final norm of the wrong shape", save(tmp, "llama_shape.safetensors", bad, cfg), tmp, 1,
              expect=[("error", "shape_mismatch", "model.norm.weight")])
        bad = dict(sd)
        bad["model.layers.2.post_attention_layernorm.weight"] = bad["model.layers.2.post_attention_layernorm.weight"].clone()
        bad["model.layers.2.post_attention_layernorm.weight"][5] = float("nan")
        check("llama NaN in a norm weight", save(tmp, "llama_nan.safetensors", bad, cfg), tmp, 1,
              expect=[("error", "non_finite", "model.layers.2.post_attention_layernorm.weight")])
        bad = dict(sd)
        bad["model.layers.0.input_layernorm.weight"] = torch.full((64,), float("inf")).bfloat16()
        check("llama inf in a bf16 norm weight", save(tmp, "llama_inf.safetensors", bad, cfg), tmp, 1,
              expect=[("error", "non_finite", "model.layers.0.input_layernorm.weight")])
        bad = dict(sd)
        bad["model.layers.1.post_attention_layernorm.weight"] = torch.ones(64)
        check("llama norm weight at its initialization (all ones)", save(tmp, "llama_ones.safetensors", bad, cfg), tmp, 0,
              expect=[("warning", "untrained", "model.layers.1.post_attention_layernorm.weight")])
        bad = dict(sd)
        bad["model.layers.1.post_attention_layernorm.weight"] = torch.zeros(64)
        check("llama norm weight all zero", save(tmp, "llama_zeros.safetensors", bad, cfg), tmp, 1,
              expect=[("error", "untrained", "model.layers.1.post_attention_layernorm.weight")])
        bad = dict(sd)
        bad["model.layers.0.extra_layernorm.weight"] = torch.ones(64)
        check("llama with an extra norm tensor", save(tmp, "llama_extra.safetensors", bad, cfg), tmp, 0,
              expect=[("warning", "unexpected_tensor", "model.layers.0.extra_layernorm.weight")])
        check("llama config without eps", save(tmp, "llama_noeps.safetensors", sd, {k: v for k, v in cfg.items() if k != "rms_norm_eps"}),
              tmp, 0, expect=[("warning", "eps", "no eps in the config")])
        check("llama config eps 1e-3", save(tmp, "llama_eps3.safetensors", sd, dict(cfg, rms_norm_eps=1e-3)), tmp, 0,
              expect=[("warning", "eps", "eps 0.001")])
        kv, t = w.to_gguf("llama", cfg, sd, eps=False)
        g = os.path.join(tmp, "llama_noeps.gguf")
        w.write_gguf(g, kv, t)
        check("llama GGUF without eps metadata", [g], tmp, 0, expect=[("warning", "eps", "llama.attention.layer_norm_rms_epsilon")])
        check("diff llama HF eps 1e-5 -> GGUF without eps", [g, "--source", os.path.join(tmp, "llama.safetensors"),
              "--source-config", os.path.join(tmp, "llama.safetensors.config.json")], tmp, 1, expect=[("error", "eps", "not carried")])

        cfg, sd = w.trained_state("qwen3")
        noqk = {k: v for k, v in sd.items() if "q_norm" not in k and "k_norm" not in k}
        check("qwen3 with q_norm/k_norm dropped", save(tmp, "qwen3_noqk.safetensors", noqk, cfg), tmp, 1,
              expect=[("error", "missing_tensor", "model.layers.0.self_attn.q_norm.weight"),
                      ("error", "missing_tensor", "model.layers.2.self_attn.k_norm.weight")])
        kv, t = w.to_gguf("qwen3", cfg, noqk)
        g = os.path.join(tmp, "qwen3_noqk.gguf")
        w.write_gguf(g, kv, t)
        check("qwen3 GGUF with q/k norms dropped", [g], tmp, 1, expect=[("error", "missing_tensor", "blk.1.attn_q_norm.weight")])
        check("diff qwen3 HF -> GGUF with q/k norms dropped", [g, "--source", os.path.join(tmp, "qwen3.safetensors")], tmp, 1,
              expect=[("error", "missing_tensor", "model.layers.0.self_attn.q_norm.weight")])

        cfg, sd = w.trained_state("bert")
        legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in sd.items()}
        check("bert with legacy gamma/beta", save(tmp, "bert_legacy.safetensors", legacy, cfg), tmp, 0,
              expect=[("warning", "legacy_name", "embeddings.LayerNorm.gamma"), ("warning", "legacy_name", "encoder.layer.2.output.LayerNorm.beta")],
              absent=[("error", None)])
        h5 = os.path.join(tmp, "tf_model.h5")
        w.write_keras_h5(h5, {"bert." + k: v for k, v in legacy.items()})
        check("bert Keras tf_model.h5 (gamma/beta)", [h5, "--config", os.path.join(tmp, "bert_legacy.safetensors.config.json")], tmp, 0,
              expect=[("info", "profile", "bert"), ("warning", "legacy_name", "encoder.layer.1.attention.output.LayerNorm.gamma")],
              absent=[("error", None)])
        check("diff bert gamma/beta -> weight/bias (renamed)", [os.path.join(tmp, "bert.safetensors"), "--source",
              os.path.join(tmp, "bert_legacy.safetensors")], tmp, 0, expect=[("info", "transform", "identical but renamed")],
              absent=[("error", None)])
        reinit = dict(sd)
        for k in reinit:
            if "LayerNorm.weight" in k:
                reinit[k] = torch.ones_like(reinit[k])
            elif "LayerNorm.bias" in k:
                reinit[k] = torch.zeros_like(reinit[k])
        check("bert re-initialized on load (transformers #29554)", save(tmp, "bert_reinit.safetensors", reinit, cfg), tmp, 0,
              expect=[("warning", "untrained", "encoder.layer.0.output.LayerNorm.weight")])
        check("diff bert legacy -> re-initialized", [os.path.join(tmp, "bert_reinit.safetensors"), "--source",
              os.path.join(tmp, "bert_legacy.safetensors")], tmp, 1,
              expect=[("error", "untrained", "encoder.layer.0.output.LayerNorm.weight"),
                      ("error", "untrained", "encoder.layer.0.output.LayerNorm.bias")], absent=[("error", "transform")])

        # --- diff mode ---------------------------------------------------------------------------
        cfg, sd = w.trained_state("llama")
        src = os.path.join(tmp, "llama.safetensors")
        check("diff llama f32 -> bf16", [os.path.join(tmp, "llama_bf16.safetensors"), "--source", src], tmp, 0,
              expect=[("info", "transform", "dtype rounding only (F32 -> BF16)")], absent=[("error", None)])
        check("diff llama f32 -> h5 (identical)", [os.path.join(tmp, "llama.h5"), "--source", src], tmp, 0,
              expect=[("info", "transform", "identical")], absent=[("error", None), ("warning", None)])
        check("diff llama -> w + 1", [os.path.join(tmp, "llama_plus1.safetensors"), "--source", src], tmp, 1,
              expect=[("error", "offset_convention", "offset +1")])
        noisy = dict(sd)
        noisy["model.layers.1.input_layernorm.weight"] = noisy["model.layers.1.input_layernorm.weight"] * 1.01
        check("diff llama with one tensor changed", [save(tmp, "llama_noisy.safetensors", noisy)[0], "--source", src], tmp, 1,
              expect=[("error", "transform", "model.layers.1.input_layernorm.weight")])
        check("diff llama with a tensor dropped", [os.path.join(tmp, "llama_drop.safetensors"), "--source", src], tmp, 1,
              expect=[("error", "missing_tensor", "model.layers.1.input_layernorm.weight")])
        shaped = dict(sd)
        shaped["model.norm.weight"] = shaped["model.norm.weight"].reshape(8, 8)
        check("diff llama with a reshaped norm", [save(tmp, "llama_reshaped.safetensors", shaped)[0], "--source", src], tmp, 0,
              expect=[("warning", "transform", "identical values, reshaped [64] -> [8, 8]")])

        generic_and_ci(tmp)
        functional(tmp)
        bad_inputs(tmp)
        if "--big" in sys.argv:
            big(tmp)
    print(f"{count - len(failures)} of {count} passed")
    return 1 if failures else 0


def generic_and_ci(tmp):
    """Architectures no profile knows (the generic profile), files without tensors, --fail-on."""
    torch.manual_seed(3)
    trained = lambda n: 1 + 0.1 * torch.randn(n)
    keras = {"dense_1.kernel": torch.randn(8, 8), "layer_normalization_3.gamma": trained(8),
             "layer_normalization_3.beta": 0.1 * torch.randn(8), "my_block.ln_out.weight": trained(8)}
    h5 = os.path.join(tmp, "custom_keras.h5")
    w.write_h5_state_dict(h5, {k.replace(".", "/", 1) + ":0" if k.startswith("layer_norm") else k: v for k, v in keras.items()})
    check("generic profile: a Keras-named custom model", [h5], tmp, 0,
          expect=[("info", "profile", "profile generic"), ("info", "offset_convention", "near 1")],
          absent=[("error", None), ("warning", None)])
    ones = dict(keras, **{"layer_normalization_3.gamma": torch.ones(8)})
    args = save(tmp, "custom_ones.safetensors", ones)
    check("generic profile: a norm weight at its initialization", args, tmp, 0,
          expect=[("warning", "untrained", "layer_normalization_3.gamma")])
    check("--fail-on warning: an untrained norm weight fails CI", args + ["--fail-on", "warning"], tmp, 1,
          expect=[("warning", "untrained", "layer_normalization_3.gamma")])
    nan = dict(keras, **{"my_block.ln_out.weight": torch.tensor([1.0, float("nan")] * 4)})
    check("generic profile: NaN in a norm weight", save(tmp, "custom_nan.safetensors", nan), tmp, 1,
          expect=[("error", "non_finite", "my_block.ln_out.weight")])
    # Zero-centred weights (scale = 1 + w, near 0) with the +1 added twice: near 2.
    twice = {k: (v - 1 + 2 if k.endswith(("gamma", "weight")) and "dense" not in k else v) for k, v in keras.items()}
    check("generic profile: weights centred near 2 (offset twice)", save(tmp, "custom_twice.safetensors", twice), tmp, 0,
          expect=[("warning", "offset_convention", "applied twice")])
    check("generic profile: diff of the same custom model", [os.path.join(tmp, "custom_ones.safetensors"), "--source",
          save(tmp, "custom.safetensors", keras)[0]], tmp, 1, expect=[("error", "untrained", "layer_normalization_3.gamma")])
    cfg, sd = w.trained_state("llama")
    ones = dict(sd, **{"model.layers.1.post_attention_layernorm.weight": torch.ones(64)})
    args = save(tmp, "llama_ones_ci.safetensors", ones, cfg)
    check("--fail-on warning (llama, all ones)", args + ["--fail-on", "warning"], tmp, 1,
          expect=[("warning", "untrained", "model.layers.1.post_attention_layernorm.weight")])
    check("--fail-on error (the default) passes warnings", args + ["--fail-on", "error"], tmp, 0)
    kv, _ = w.to_gguf("llama", cfg, sd)
    vocab = os.path.join(tmp, "vocab_only.gguf")
    w.write_gguf(vocab, kv, {})
    check("a vocabulary-only GGUF (no tensors)", [vocab], tmp, 1, expect=[("error", "no_tensors", "holds no tensors at all")],
          absent=[("error", "missing_tensor")])
    check("diff against a file without tensors", [os.path.join(tmp, "llama.safetensors"), "--source", vocab], tmp, 1,
          expect=[("error", "no_tensors", "source: ")], absent=[("error", "missing_tensor")])
    empty = os.path.join(tmp, "empty.safetensors")
    w.write_safetensors(empty, {})
    check("a safetensors file without tensors", [empty], tmp, 1, expect=[("error", "no_tensors", "holds no tensors at all")])
    p = run_child([NORMCHECK, "audit", os.path.join(tmp, "llama.safetensors"), "--fail-on", "sometimes"])
    global count
    count += 1
    if p.returncode != 2 or "--fail-on" not in p.stderr:
        failures.append("--fail-on sometimes")
        print("FAIL --fail-on with an unknown severity", p.returncode, p.stderr)
    else:
        print("ok   --fail-on with an unknown severity exits 2")


def _gguf(tmp, name, arch, **kw):
    cfg, sd = w.trained_state(arch)
    kv, t = w.to_gguf(arch, cfg, sd)
    path = os.path.join(tmp, name)
    w.write_gguf(path, kv, t, **kw)
    return path


def record_fixtures(tmp, arch, name):
    """Fixtures recorded from the original (HF) model's norm layers: one case per norm module,
    id = its HF module name, x drawn, the module's parameters as inputs, the expected outputs
    completed by the certified reference (`normcheck fixtures complete`)."""
    import h5py
    import numpy as np
    cfg, sd = w.trained_state(arch)
    offset = w.ARCHS[arch][2]
    eps = cfg.get("rms_norm_eps") or cfg.get("layer_norm_epsilon") or cfg.get("layer_norm_eps")
    rng = np.random.default_rng(1)
    inputs = os.path.join(tmp, name + ".inputs.h5")
    with h5py.File(inputs, "w") as f:
        for key, t in sd.items():
            if not (w.is_norm(key) and key.endswith(".weight")):
                continue
            module = key[: -len(".weight")]
            g = f.create_group(f"cases/{module}")
            layernorm = module + ".bias" in sd
            g.attrs["op"] = "layernorm" if layernorm else "rmsnorm"
            g.attrs["epsilon"] = float(eps)
            g.attrs["weight_offset"] = float(offset)
            g.attrs["dtype_x"] = "float32"
            g.create_dataset("inputs/x", data=rng.standard_normal((3, t.numel())).astype(np.float32))
            g.create_dataset("inputs/weight", data=t.numpy().astype(np.float32))
            if layernorm:
                g.create_dataset("inputs/bias", data=sd[module + ".bias"].numpy().astype(np.float32))
    out = os.path.join(tmp, name + ".fixtures.h5")
    p = subprocess.run([NORMCHECK, "fixtures", "complete", inputs, "-o", out, "--threads", "1"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return out


def functional(tmp):
    fl = record_fixtures(tmp, "llama", "llama")
    check("functional llama", [os.path.join(tmp, "llama.safetensors"), "--fixtures", fl], tmp, 0,
          expect=[("info", "functional", "7 fixture case(s) pass")], absent=[("error", None), ("warning", None)])
    check("functional llama GGUF (renamed tensors)", [os.path.join(tmp, "llama.gguf"), "--fixtures", fl], tmp, 0,
          expect=[("info", "functional", "7 fixture case(s) pass")], absent=[("error", None)])
    check("functional llama bf16 (rounded parameters)", [os.path.join(tmp, "llama_bf16.safetensors"), "--fixtures", fl], tmp, 1,
          expect=[("error", "functional", "the checkpoint stores BF16")])
    check("functional llama w + 1", [os.path.join(tmp, "llama_plus1.safetensors"), "--fixtures", fl], tmp, 1,
          expect=[("error", "functional", "model.layers.0.input_layernorm.weight")])
    fg = record_fixtures(tmp, "gemma2", "gemma2")
    check("functional gemma2 HF", [os.path.join(tmp, "gemma2.safetensors"), "--fixtures", fg, "--profile", "gemma2"], tmp, 0,
          expect=[("info", "functional", "13 fixture case(s) pass")], absent=[("error", None)])
    check("functional gemma2 GGUF (+1 added by the converter)", [os.path.join(tmp, "gemma2.gguf"), "--fixtures", fg], tmp, 0,
          expect=[("info", "functional", "13 fixture case(s) pass")], absent=[("error", None)])
    check("functional gemma2 GGUF without the +1", [os.path.join(tmp, "g2_noplus.gguf"), "--fixtures", fg], tmp, 1,
          expect=[("error", "functional", "blk.1.post_ffw_norm.weight")])
    fb = record_fixtures(tmp, "bert", "bert")
    check("functional bert legacy gamma/beta", [os.path.join(tmp, "bert_legacy.safetensors"), "--fixtures", fb], tmp, 0,
          expect=[("info", "functional", "7 fixture case(s) pass")], absent=[("error", "functional")])
    check("functional bert re-initialized", [os.path.join(tmp, "bert_reinit.safetensors"), "--fixtures", fb], tmp, 1,
          expect=[("error", "functional", "encoder.layer.0.output.LayerNorm.weight")])
    check("functional with a checkpoint of another model", [os.path.join(tmp, "gpt2.safetensors"), "--fixtures", fl], tmp, 0,
          expect=[("warning", "functional", "names no weight")])
    check("functional fixture file not HDF5", [os.path.join(tmp, "llama.safetensors"), "--fixtures",
          os.path.join(tmp, "llama.safetensors")], tmp, 2, stderr="llama.safetensors")
    check("functional and --source together", [os.path.join(tmp, "llama.safetensors"), "--fixtures", fl, "--source",
          os.path.join(tmp, "llama.safetensors")], tmp, 2, stderr="separate modes")


def bad_inputs(tmp):
    cfg, sd = w.trained_state("llama")
    good_st = w.safetensors_bytes(sd)
    kv, t = w.to_gguf("llama", cfg, sd)
    good_gguf = w.gguf_bytes(kv, t)

    def st(header, data=b""):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data

    cases = {
        "st_truncated_header": (good_st[:100], "header length"),
        "st_length_beyond_file": (struct.pack("<Q", 10**6) + b'{"a": 1}', "runs beyond the file"),
        "st_absurd_length": (struct.pack("<Q", 2**63) + b"{}", "runs beyond the file"),
        "st_not_json": (struct.pack("<Q", 4) + b"{abc", "not valid JSON"),
        "st_unknown_dtype": (st({"x": {"dtype": "F13", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "unknown dtype 'F13'"),
        "st_offsets_out_of_range": (st({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8), "beyond the data area"),
        "st_size_mismatch": (st({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8), "needs 16"),
        "st_overlap": (st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12), "overlap"),
        "st_shape_overflow": (st({"x": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 8]}}, b"\0" * 8), "overflows"),
        "st_negative_dim": (st({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8), "not a non-negative integer"),
        "st_truncated_data": (good_st[:len(good_st) - 100], "beyond the data area"),
        "empty": (b"", "empty"),
        "garbage": (b"hello world, not a checkpoint", "not a checkpoint"),
    }
    cases.update(w.malformed_gguf(good_gguf))
    with open(os.path.join(tmp, "llama.h5"), "rb") as f:
        h5 = f.read()
    cases["h5_truncated"] = (h5[:len(h5) // 2], "HDF5")
    # Corrupt files found by fuzz_hdf5 on which libhdf5 1.10.8 itself fails: a null read (a
    # segfault in process; the HDF5 reader runs in a child) and a 512 GiB allocation.
    data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    cases["h5_libhdf5_null_read"] = (open(os.path.join(data_dir, "libhdf5_null_read.h5"), "rb").read(), "")
    cases["h5_libhdf5_huge_alloc"] = (open(os.path.join(data_dir, "libhdf5_huge_alloc.h5"), "rb").read(), "corrupt")
    for name, (data, message) in cases.items():
        path = os.path.join(tmp, name + ".bin")
        with open(path, "wb") as f:
            f.write(data)
        # Not measured where libhdf5 crashes its child: under ASan that child's report (with
        # symbolization) alone takes over 100 MiB.
        check(f"bad input {name}", [path], tmp, 2, stderr=message, measure=name != "h5_libhdf5_null_read")
    existing = os.path.join(tmp, "exists.json")
    open(existing, "w").write("{}")
    p = run_child([NORMCHECK, "audit", os.path.join(tmp, "llama.safetensors"), "--json", existing])
    global count
    count += 1
    if p.returncode != 2 or "--force" not in p.stderr or open(existing).read() != "{}":
        failures.append("existing results file")
        print("FAIL existing results file not replaced without --force", p.returncode, p.stderr)
    else:
        print("ok   existing results file not replaced without --force")
    check("bad input unknown profile", [os.path.join(tmp, "llama.safetensors"), "--profile", "nope"], tmp, 2, stderr="unknown profile")
    check("bad input config not JSON", [os.path.join(tmp, "llama.safetensors"), "--config", os.path.join(tmp, "garbage.bin")], tmp, 2,
          stderr="not valid JSON")
    check("bad input no norm tensors", [save(tmp, "nonorm.safetensors", {"lm_head.weight": torch.zeros(4, 4)})[0]], tmp, 2,
          stderr="no profile names")


def big(tmp):
    """A 10 GB safetensors file (sparse: a huge non-norm tensor of zeros after the norms): the
    audit must read the header and the norms only."""
    cfg, sd = w.trained_state("llama")
    header, offset = {}, 0
    blobs = []
    for name, t in sd.items():
        b = w.tensor_bytes(t)
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    n = 10 * 2**30 // 2
    header["lm_head.weight"] = {"dtype": "BF16", "shape": [n // 4096, 4096], "data_offsets": [offset, offset + 2 * n]}
    h = json.dumps(header).encode()
    path = os.path.join(tmp, "big.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        f.truncate(8 + len(h) + offset + 2 * n)
    cpath = os.path.join(tmp, "big.config.json")
    json.dump(cfg, open(cpath, "w"))
    t0 = time.perf_counter()
    p = run_child([NORMCHECK, "audit", path, "--config", cpath], measure=True)
    dt = time.perf_counter() - t0
    print(f"big: {os.path.getsize(path) / 2**30:.1f} GiB safetensors audited in {dt:.3f} s, exit {p.returncode}, "
          f"max RSS {p.rss_mib:.1f} MiB")
    global count
    count += 1
    if p.returncode != 0 or dt > 5 or p.rss_mib > MAX_RSS_MIB:
        failures.append("big")
        print("FAIL big", p.stdout[-1000:], p.stderr[-500:])


if __name__ == "__main__":
    sys.exit(main())
