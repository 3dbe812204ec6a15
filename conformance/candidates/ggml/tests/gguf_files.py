"""Writes the GGUF files of the audit's tests into OUT for the ggml differential test
(gguf_differential.cpp): every architecture's small checkpoint as the audit tests write it
(ckpt_writers.py), as GGUF v3 float32, v2 float16 and bfloat16, with alignment 64 and without the
norm offset, a vocabulary-only file, and the malformed files of test_audit.py's bad-input checks.

usage: gguf_files.py OUT
"""
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "audit", "tests"))
import ckpt_writers as w  # noqa: E402


def main(out):
    os.makedirs(out, exist_ok=True)
    good = None
    for arch in w.ARCHS:
        cfg, sd = w.trained_state(arch)
        variants = {
            "f32": dict(),
            "f16_v2": dict(dtype=torch.float16, version=2),
            "bf16": dict(dtype=torch.bfloat16),
            "align64": dict(alignment=64),
            "no_offset": dict(add_offset=False),
        }
        for name, kw in variants.items():
            conv = {k: kw.pop(k) for k in ("dtype", "add_offset") if k in kw}
            kv, tensors = w.to_gguf(arch, cfg, sd, **conv)
            w.write_gguf(os.path.join(out, f"{arch}_{name}.gguf"), kv, tensors, **kw)
        if arch == "llama":
            good = w.gguf_bytes(kv, tensors)
            w.write_gguf(os.path.join(out, "llama_vocab_only.gguf"), kv, {})
    for name, (data, _) in w.malformed_gguf(good).items():
        with open(os.path.join(out, name + ".gguf"), "wb") as f:
            f.write(data)
    print(f"gguf_files: {len(os.listdir(out))} files in {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
