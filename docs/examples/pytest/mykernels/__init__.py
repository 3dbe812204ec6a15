"""A small kernel repository: the kernels its pytest suite (tests/) checks with normcheck."""
import torch


def rmsnorm(x, weight=None, bias=None, eps=1e-6, offset=0.0):
    """RMSNorm over the last dim, statistics in float32 (float64 for float64 x), one rounding to
    x's dtype at the end."""
    xf = x if x.dtype == torch.float64 else x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (offset + weight.to(xf.dtype))
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """PyTorch's own."""
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


def faulty_rmsnorm(x, weight=None, bias=None, eps=1e-6, offset=0.0):
    """Deliberately wrong: eps added outside the sqrt, 1 / (rms + eps) (a real-world fault)."""
    xf = x if x.dtype == torch.float64 else x.float()
    y = xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps)
    if weight is not None:
        y = y * (offset + weight.to(xf.dtype))
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)
