"""Writes the seed corpus of the reader fuzzers (corpus/<format>/, packed with the inputs the
fuzzers added into corpus.tar.xz: README.md, "Fuzzing"): tiny valid checkpoints of a
few architectures in each format, from the same writers as the tests."""
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests"))
import ckpt_writers as w  # noqa: E402

TINY = dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=4)
for arch in ("llama", "gemma3", "gpt2", "bert"):
    cfg, make, _, _ = w.ARCHS[arch]
    cfg = dict(cfg, **{k: v for k, v in TINY.items() if k in cfg})
    if arch == "gpt2":
        cfg.update(n_embd=8, n_layer=2)
    if arch == "bert":
        cfg.update(hidden_size=8, num_hidden_layers=2)
    torch.manual_seed(0)
    sd = {k: v.float() for k, v in make(dict(cfg)).state_dict().items() if w.is_norm(k) or "q_proj" in k}
    for fmt in ("safetensors", "gguf", "hdf5"):
        os.makedirs(os.path.join(here, "corpus", fmt), exist_ok=True)
    w.write_safetensors(os.path.join(here, "corpus", "safetensors", arch), sd, {"format": "pt"})
    w.write_safetensors(os.path.join(here, "corpus", "safetensors", arch + "_bf16"), {k: v.bfloat16() for k, v in sd.items()})
    kv, t = w.to_gguf(arch, cfg, sd)
    kv = [x for x in kv if x[0] != "tokenizer.ggml.tokens"] + [("tokenizer.ggml.tokens", w.ARRAY, (w.STRING, ["a", "b"]))]
    w.write_gguf(os.path.join(here, "corpus", "gguf", arch), kv, t)
    w.write_gguf(os.path.join(here, "corpus", "gguf", arch + "_v2"), kv, {k: v.half() for k, v in t.items()}, version=2)
    w.write_h5_state_dict(os.path.join(here, "corpus", "hdf5", arch), sd)
