"""Writers of the three checkpoint formats, by hand from their specs (the `safetensors` and
`gguf` Python packages are not installed here), and small PyTorch models with the norm layout
of each profiled architecture. Used by test_audit.py and to make the fuzz seed corpus."""
import json
import struct

import numpy as np
import torch
from torch import nn

# --- safetensors: u64 header length, JSON header (padded with spaces to 8 bytes), data ---------
ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
             torch.int64: "I64", torch.int32: "I32"}


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def safetensors_bytes(tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_safetensors(path, tensors, metadata=None):
    with open(path, "wb") as f:
        f.write(safetensors_bytes(tensors, metadata))


# --- GGUF v2/v3 (ggml/docs/gguf.md) ------------------------------------------------------------
GGML = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30, torch.float64: 28}
U32, F32, STRING, ARRAY, U64 = 4, 6, 8, 9, 10


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype, v):
    if vtype == U32:
        return struct.pack("<I", v)
    if vtype == F32:
        return struct.pack("<f", v)
    if vtype == U64:
        return struct.pack("<Q", v)
    if vtype == STRING:
        return gguf_string(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(gguf_value(etype, x) for x in items)
    raise ValueError(vtype)


def gguf_bytes(kv, tensors, version=3, alignment=32):
    """kv: list of (key, type, value); tensors: dict name -> torch tensor (row-major shape)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vtype, v in kv:
        out += gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, v)
    blobs, offset = [], 0
    for name, t in tensors.items():
        ne = list(reversed(t.shape)) or [1]
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", GGML[t.dtype], offset)
        b = tensor_bytes(t)
        b += b"\0" * (-len(b) % alignment)
        blobs.append(b)
        offset += len(b)
    out += b"\0" * (-len(out) % alignment)
    return out + b"".join(blobs)


def write_gguf(path, kv, tensors, **kw):
    with open(path, "wb") as f:
        f.write(gguf_bytes(kv, tensors, **kw))


def malformed_gguf(good):
    """Malformed GGUF files, each with a word of the audit's message: `good` is a well-formed
    file's bytes (truncated here). Used by test_audit.py and by the ggml differential test."""
    return {
        "gguf_truncated": (good[:40], "truncated"),
        "gguf_truncated_data": (good[:len(good) - 64], "beyond the data area"),
        "gguf_version1": (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "GGUF version 1"),
        "gguf_absurd_tensor_count": (b"GGUF" + struct.pack("<IQQ", 3, 2**60, 0) + b"\0" * 64, "tensor count"),
        "gguf_absurd_kv_count": (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**62) + b"\0" * 64, "key/value count"),
        "gguf_absurd_string": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"k" * 40, "string"),
        "gguf_absurd_array": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("k") + struct.pack("<IIQ", 9, 4, 2**61),
                              "array count"),
        "gguf_unknown_value_type": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("k") + struct.pack("<I", 77) + b"\0" * 16,
                                    "unknown metadata value type 77"),
        "gguf_unknown_ggml_type": (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + gguf_string("t") + struct.pack("<IQIQ", 1, 4, 99, 0)
                                   + b"\0" * 64, "unknown ggml type 99"),
        "gguf_rank5": (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + gguf_string("t") + struct.pack("<I", 5) + b"\0" * 80, "rank 5"),
        "gguf_offset_beyond": (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + gguf_string("t") + struct.pack("<IQIQ", 1, 4, 0, 2**40)
                               + b"\0" * 64, "beyond the data area"),
        "gguf_overlap": (b"GGUF" + struct.pack("<IQQ", 3, 2, 0) + gguf_string("a") + struct.pack("<IQIQ", 1, 16, 0, 0)
                         + gguf_string("b") + struct.pack("<IQIQ", 1, 16, 0, 32) + b"\0" * 160, "overlap"),
        "gguf_misaligned": (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + gguf_string("t") + struct.pack("<IQIQ", 1, 4, 0, 3)
                            + b"\0" * 64, "alignment"),
        "gguf_empty_key": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("") + struct.pack("<I", 4) + struct.pack("<I", 1),
                           "key 0 is empty"),
        "gguf_nul_in_name": (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + gguf_string("blk.0\0.attn_norm.weight")
                             + struct.pack("<IQIQ", 1, 4, 0, 0) + b"\0" * 64, "NUL byte"),
        "gguf_quant_partial_block": (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + gguf_string("t") + struct.pack("<IQIQ", 1, 33, 2, 0)
                                     + b"\0" * 64, "whole number"),
    }


# --- HDF5 ---------------------------------------------------------------------------------------
def write_h5_state_dict(path, tensors):
    """A flat h5py state dict: one dataset per tensor, named by its full dotted name."""
    import h5py
    with h5py.File(path, "w") as f:
        for name, t in tensors.items():
            f.create_dataset(name, data=t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy())


def write_keras_h5(path, tensors, model_name="tf_bert_model"):
    """The Keras 2 save_weights layout of HF's tf_model.h5: /<layer>/<model>/<path>/<var>:0 with
    root attribute layer_names and per-layer weight_names; HF names 'encoder.layer.0...' are
    written the TF way 'encoder/layer_._0/...'."""
    import re

    import h5py
    with h5py.File(path, "w") as f:
        layer = model_name.replace("tf_", "").replace("_model", "")
        g = f.create_group(layer)
        names = []
        for name, t in tensors.items():
            tf_name = re.sub(r"\.(\d+)\.", r"._\1.", name).replace("._", "/layer_._", 1) if ".layer." in name else name
            tf_name = tf_name.replace("layer/layer_._", "layer_._").replace(".", "/")
            full = f"{model_name}/{tf_name}:0"
            g.create_dataset(full, data=t.detach().numpy())
            names.append(full.encode())
        g.attrs["weight_names"] = names
        f.attrs["layer_names"] = [layer.encode()]
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.11.0"


# --- Small models with each architecture's norm layout -----------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


class Attn(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, qk_norm=None):
        super().__init__()
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        if qk_norm == "head":
            self.q_norm, self.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)
        elif qk_norm == "full":  # OLMo 2: over all heads
            self.q_norm, self.k_norm = RMSNorm(heads * head_dim), RMSNorm(kv_heads * head_dim)


class DecoderLayer(nn.Module):
    """Llama/Mistral/Qwen/Phi-3/Gemma (pre-norm), Gemma 2/3 (sandwich), OLMo 2 (post-norm)."""

    def __init__(self, cfg, layout, qk_norm):
        super().__init__()
        h = cfg["hidden_size"]
        self.self_attn = Attn(h, cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], qk_norm)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, 2 * h, bias=False)
        if layout in ("pre", "sandwich"):
            self.input_layernorm = RMSNorm(h)
        self.post_attention_layernorm = RMSNorm(h)
        if layout == "sandwich":
            self.pre_feedforward_layernorm = RMSNorm(h)
        if layout in ("sandwich", "post"):
            self.post_feedforward_layernorm = RMSNorm(h)


class DecoderModel(nn.Module):
    def __init__(self, cfg, layout="pre", qk_norm=None):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(32, cfg["hidden_size"])
        self.model.layers = nn.ModuleList(DecoderLayer(cfg, layout, qk_norm) for _ in range(cfg["num_hidden_layers"]))
        self.model.norm = RMSNorm(cfg["hidden_size"])


class GPT2Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.ln_1 = nn.LayerNorm(h)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(h, 3 * h)
        self.ln_2 = nn.LayerNorm(h)


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(32, cfg["n_embd"])
        self.h = nn.ModuleList(GPT2Block(cfg["n_embd"]) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(cfg["n_embd"])


class BertLayer(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.attention = nn.Module()
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(h, h)
        self.attention.output.LayerNorm = nn.LayerNorm(h)
        self.output = nn.Module()
        self.output.dense = nn.Linear(2 * h, h)
        self.output.LayerNorm = nn.LayerNorm(h)


class Bert(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(32, h)
        self.embeddings.LayerNorm = nn.LayerNorm(h)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer(h) for _ in range(cfg["num_hidden_layers"]))


class T5Sub(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.layer_norm = RMSNorm(h)
        self.proj = nn.Linear(h, h, bias=False)


class T5Block(nn.Module):
    def __init__(self, h, n):
        super().__init__()
        self.layer = nn.ModuleList(T5Sub(h) for _ in range(n))


class T5Stack(nn.Module):
    def __init__(self, h, layers, subs):
        super().__init__()
        self.block = nn.ModuleList(T5Block(h, subs) for _ in range(layers))
        self.final_layer_norm = RMSNorm(h)


class T5(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.encoder = T5Stack(cfg["d_model"], cfg["num_layers"], 2)
        self.decoder = T5Stack(cfg["d_model"], cfg["num_decoder_layers"], 3)


DECODER_CFG = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
ARCHS = {
    # name: (config, model factory, HF offset, GGUF architecture)
    "llama": (dict(DECODER_CFG, model_type="llama", rms_norm_eps=1e-5), lambda c: DecoderModel(c), 0, "llama"),
    "mistral": (dict(DECODER_CFG, model_type="mistral", rms_norm_eps=1e-5), lambda c: DecoderModel(c), 0, "llama"),
    "qwen2": (dict(DECODER_CFG, model_type="qwen2", rms_norm_eps=1e-6), lambda c: DecoderModel(c), 0, "qwen2"),
    "qwen3": (dict(DECODER_CFG, model_type="qwen3", rms_norm_eps=1e-6), lambda c: DecoderModel(c, qk_norm="head"), 0, "qwen3"),
    "phi3": (dict(DECODER_CFG, model_type="phi3", rms_norm_eps=1e-5), lambda c: DecoderModel(c), 0, "phi3"),
    "gemma": (dict(DECODER_CFG, model_type="gemma", rms_norm_eps=1e-6), lambda c: DecoderModel(c), 1, "gemma"),
    "gemma2": (dict(DECODER_CFG, model_type="gemma2", rms_norm_eps=1e-6), lambda c: DecoderModel(c, "sandwich"), 1, "gemma2"),
    "gemma3": (dict(DECODER_CFG, model_type="gemma3_text", rms_norm_eps=1e-6),
               lambda c: DecoderModel(c, "sandwich", qk_norm="head"), 1, "gemma3"),
    "olmo2": (dict(DECODER_CFG, model_type="olmo2", rms_norm_eps=1e-6, head_dim=None),
              lambda c: DecoderModel(dict(c, head_dim=16), "post", qk_norm="full"), 0, "olmo2"),
    "gpt2": (dict(model_type="gpt2", n_embd=64, n_layer=3, layer_norm_epsilon=1e-5), lambda c: GPT2(c), 0, "gpt2"),
    "bert": (dict(model_type="bert", hidden_size=64, num_hidden_layers=3, layer_norm_eps=1e-12), lambda c: Bert(c), 0, "bert"),
    "t5": (dict(model_type="t5", d_model=64, num_layers=3, num_decoder_layers=2, layer_norm_epsilon=1e-6), lambda c: T5(c), 0, "t5"),
}


def is_norm(name):
    return any(k in name for k in ("norm", "ln_", "LayerNorm"))


def trained_state(arch, seed=0):
    """The state dict of a small model of `arch` with trained-looking norm parameters: scales
    1 + 0.1 N(0,1) stored as the HF convention stores them (w, or w - 1 for Gemma)."""
    cfg, make, offset, _ = ARCHS[arch]
    torch.manual_seed(seed)
    model = make(dict(cfg))
    sd = {}
    for name, p in model.state_dict().items():
        p = p.clone()
        if is_norm(name):
            p = (1.0 - offset) + 0.1 * torch.randn(p.shape) if name.endswith("weight") else 0.05 * torch.randn(p.shape)
        sd[name] = p.float()
    return cfg, sd


# HF name -> llama.cpp GGUF name, per the profiles (norms) and a generic rule for other tensors.
def gguf_name(arch, name):
    import re
    table = [
        (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blk.\1.attn_norm.weight"),
        (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", r"blk.\1.attn_q_norm.weight"),
        (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", r"blk.\1.attn_k_norm.weight"),
        (r"model\.layers\.(\d+)\.pre_feedforward_layernorm\.weight", r"blk.\1.ffn_norm.weight"),
        (r"model\.layers\.(\d+)\.post_feedforward_layernorm\.weight", r"blk.\1.post_ffw_norm.weight"),
        (r"model\.norm\.weight", "output_norm.weight"),
        (r"h\.(\d+)\.ln_1\.(weight|bias)", r"blk.\1.attn_norm.\2"),
        (r"h\.(\d+)\.ln_2\.(weight|bias)", r"blk.\1.ffn_norm.\2"),
        (r"ln_f\.(weight|bias)", r"output_norm.\1"),
        (r"embeddings\.LayerNorm\.(weight|bias)", r"token_embd_norm.\1"),
        (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)", r"blk.\1.attn_output_norm.\2"),
        (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)", r"blk.\1.layer_output_norm.\2"),
        (r"encoder\.block\.(\d+)\.layer\.0\.layer_norm\.weight", r"enc.blk.\1.attn_norm.weight"),
        (r"encoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight", r"enc.blk.\1.ffn_norm.weight"),
        (r"encoder\.final_layer_norm\.weight", "enc.output_norm.weight"),
        (r"decoder\.block\.(\d+)\.layer\.0\.layer_norm\.weight", r"dec.blk.\1.attn_norm.weight"),
        (r"decoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight", r"dec.blk.\1.cross_attn_norm.weight"),
        (r"decoder\.block\.(\d+)\.layer\.2\.layer_norm\.weight", r"dec.blk.\1.ffn_norm.weight"),
        (r"decoder\.final_layer_norm\.weight", "dec.output_norm.weight"),
    ]
    # post_attention_layernorm is the pre-FFN norm in the Llama layout, a sandwich norm in Gemma 2/3 and OLMo 2.
    sandwich = arch in ("gemma2", "gemma3", "olmo2")
    table.insert(0, (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight",
                     r"blk.\1.post_attention_norm.weight" if sandwich else r"blk.\1.ffn_norm.weight"))
    for pat, rep in table:
        if re.fullmatch(pat, name):
            return re.sub(pat, rep, name)
    m = re.search(r"\.(\d+)\.", name)
    return f"blk.{m.group(1)}.other.{name.split('.')[-2]}.weight" if m else "token_embd.weight"


def to_gguf(arch, cfg, sd, add_offset=True, eps=True, dtype=torch.float32):
    """What llama.cpp's convert_hf_to_gguf does to the norms: rename, F32, and for Gemma add the 1
    into the stored weights (its GGUF Gemma graphs apply plain scales)."""
    ga = ARCHS[arch][3]
    offset = ARCHS[arch][2]
    tensors = {}
    for name, t in sd.items():
        if is_norm(name) and name.endswith("weight") and offset and add_offset:
            t = t + 1
        tensors[gguf_name(arch, name)] = t.to(dtype) if is_norm(name) else t
    hidden = cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("d_model")
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers")
    kv = [("general.architecture", STRING, ga), ("general.name", STRING, f"tiny-{arch}"),
          (f"{ga}.embedding_length", U32, hidden), (f"{ga}.block_count", U32, layers),
          ("tokenizer.ggml.tokens", ARRAY, (STRING, [f"tok{i}" for i in range(100)]))]
    if "num_decoder_layers" in cfg:
        kv.append((f"{ga}.decoder_block_count", U32, cfg["num_decoder_layers"]))
    if "num_attention_heads" in cfg:
        kv += [(f"{ga}.attention.head_count", U32, cfg["num_attention_heads"]),
               (f"{ga}.attention.head_count_kv", U32, cfg["num_key_value_heads"]),
               (f"{ga}.attention.key_length", U32, 16)]
    if eps:
        e = cfg.get("rms_norm_eps") or cfg.get("layer_norm_epsilon") or cfg.get("layer_norm_eps")
        key = "layer_norm_epsilon" if arch in ("gpt2", "bert") else "layer_norm_rms_epsilon"
        kv.append((f"{ga}.attention.{key}", F32, e))
    return kv, tensors
