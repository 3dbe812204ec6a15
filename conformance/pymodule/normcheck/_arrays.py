"""Arrays in and out of the C++ layer: numpy arrays and torch tensors (CPU or CUDA, copied to the
host) become C-contiguous numpy arrays with the name of their dtype. numpy has no bfloat16: a
bfloat16 tensor travels as its uint16 bit patterns, and a numpy uint16 array is taken as bit
patterns of the dtype named by the caller's ``dtype=`` argument ("bfloat16" or "float16")."""
import numpy as np

_NUMPY_FLOATS = {np.dtype(np.float64): "float64", np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}
BITS_DTYPES = ("bfloat16", "float16")


def is_torch(value):
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def to_core(value, arg, bits_dtype=None):
    """(C-contiguous numpy array, dtype name) for the C++ layer; TypeError naming `arg` otherwise."""
    if is_torch(value):
        import torch

        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            return np.ascontiguousarray(t.view(torch.int16).numpy().view(np.uint16)), "bfloat16"
        if t.dtype not in (torch.float64, torch.float32, torch.float16):
            raise TypeError(f"{arg}: a torch tensor of {t.dtype}; normcheck takes float64, float32, float16 "
                            "and bfloat16 tensors")
        value = t.numpy()
    elif isinstance(value, (list, tuple, float, int)) and not isinstance(value, bool):
        value = np.asarray(value, dtype=np.float64)  # Python numbers are binary64
    elif isinstance(value, np.generic):
        value = np.asarray(value)  # a numpy scalar keeps its dtype
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{arg}: expected a numpy array or a torch tensor, got {type(value).__name__}")
    a = np.ascontiguousarray(value)
    if a.dtype in _NUMPY_FLOATS:
        return a, _NUMPY_FLOATS[a.dtype]
    if a.dtype == np.uint16:
        if bits_dtype is None:
            raise TypeError(f"{arg}: a uint16 array is taken as bit patterns only with dtype='bfloat16' "
                            "(or 'float16'); pass dtype=")
        if bits_dtype not in BITS_DTYPES:
            raise ValueError(f"dtype: {bits_dtype!r} for uint16 bit patterns (bfloat16 or float16)")
        return a, bits_dtype
    raise TypeError(f"{arg}: an array of {a.dtype}; normcheck takes float64, float32, float16, and bfloat16 "
                    "as a torch tensor or uint16 bit patterns with dtype='bfloat16'")


def bfloat16_bits(values):
    """uint16 bit patterns of a float32 array holding bfloat16 values (exact: the low 16 bits are 0)."""
    return (np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
