"""Small numpy kernels for the tests, written independently of normcheck: correct ones (two-pass,
Welford, in float32 like a GPU kernel's accumulators) and faulty ones (one-pass variance with
pairwise or sequential sums, eps outside the sqrt)."""
import numpy as np

F = np.float32


def two_pass(x, w, b, eps):
    x = x.astype(F)
    mean = x.mean(axis=-1, keepdims=True, dtype=F)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True, dtype=F)
    rstd = F(1) / np.sqrt(var + F(eps))
    return ((x - mean) * rstd * w + b).astype(F)


def welford(x, w, b, eps):
    x = x.astype(F)
    mean = np.zeros(x.shape[:-1] + (1,), F)
    m2 = np.zeros_like(mean)
    for k in range(x.shape[-1]):
        v = x[..., k:k + 1]
        d = v - mean
        mean = mean + d / F(k + 1)
        m2 = m2 + d * (v - mean)
    rstd = F(1) / np.sqrt(m2 / F(x.shape[-1]) + F(eps))
    return ((x - mean) * rstd * w + b).astype(F)


def one_pass(x, w, b, eps):
    """var = E[x^2] - E[x]^2 in float32: cancels catastrophically when |mean| >> sigma."""
    x = x.astype(F)
    mean = x.mean(axis=-1, keepdims=True, dtype=F)
    var = np.maximum((x * x).mean(axis=-1, keepdims=True, dtype=F) - mean * mean, F(0))
    rstd = F(1) / np.sqrt(var + F(eps))
    return ((x - mean) * rstd * w + b).astype(F)


def one_pass_seq(x, w, b, eps):
    """The same one-pass variance with sequential float32 sums (a loop over the row, as one
    thread's accumulator): np.cumsum adds in order. one_pass's sums are numpy's pairwise ones."""
    x = x.astype(F)
    n = F(x.shape[-1])
    mean = np.cumsum(x, axis=-1, dtype=F)[..., -1:] / n
    var = np.maximum(np.cumsum(x * x, axis=-1, dtype=F)[..., -1:] / n - mean * mean, F(0))
    rstd = F(1) / np.sqrt(var + F(eps))
    return ((x - mean) * rstd * w + b).astype(F)


def eps_outside_sqrt(x, w, b, eps):
    x = x.astype(F)
    mean = x.mean(axis=-1, keepdims=True, dtype=F)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True, dtype=F)
    rstd = F(1) / (np.sqrt(var) + F(eps))
    return ((x - mean) * rstd * w + b).astype(F)


def rows(mean, shape, seed=0):
    """float32 rows of N(mean, 1)."""
    return (np.random.default_rng(seed).standard_normal(shape) + mean).astype(F)
