"""Shard plans: how a case's tensors are split across ranks (README.md, "Shard plans").

A plan string is comma-separated `key=value` items:

    tp=R | tp=s1+s2+...+sR   split the first normalized dim into R contiguous shards
                             (R alone: numpy.array_split sizes, the first n % R one larger)
    sp=R | sp=s1+...+sR      split a non-normalized dim (sp_dim, default 0) into R contiguous
                             shards; parameters replicated, their gradients sum-reduced
    sp_dim=D                 the dim sp splits (1 for QK-norm per head over [tokens, heads, head_dim])
    reduce=DTYPE             dtype of the parameter-gradient all-reduce: float32 (default),
                             bfloat16 or float16 (TOLERANCE section, README.md)
    stats_reduce=DTYPE       dtype of the tp all-reduce of the row statistics' partial sums:
                             float32 (default), bfloat16 or float16 (TOLERANCE.md, section 11)
    flush_subnormals=0|1     the plan's all-reduces flush subnormals of their dtype to zero

tp and sp together make a grid of T*S ranks, rank = s*T + t (tensor-parallel ranks adjacent, as
Megatron orders them). Pure Python + numpy: the runtime, the tests and any tool read plans alike.
"""
import numpy as np

DTYPES = ("float32", "bfloat16", "float16")


class PlanError(ValueError):
    """A plan string that does not parse, or does not fit the case it is applied to."""


def _sizes(text, key):
    if "+" in text:
        try:
            sizes = [int(s) for s in text.split("+")]
        except ValueError:
            raise PlanError(f"{key}={text}: shard sizes must be integers joined by '+'")
        if any(s <= 0 for s in sizes):
            raise PlanError(f"{key}={text}: every shard needs at least one element")
        return len(sizes), sizes
    try:
        r = int(text)
    except ValueError:
        raise PlanError(f"{key}={text}: expected a rank count or sizes s1+s2+...")
    if r < 1:
        raise PlanError(f"{key}={text}: the rank count must be at least 1")
    return r, None


class Plan:
    def __init__(self, text):
        self.text = text
        self.tp, self.tp_sizes, self.sp, self.sp_sizes = 1, None, 1, None
        self.sp_dim, self.reduce, self.stats_reduce, self.flush_subnormals = 0, "float32", "float32", False
        seen = set()
        for item in [p for p in text.split(",") if p]:
            key, eq, value = item.partition("=")
            if not eq or key in seen:
                raise PlanError(f"plan '{text}': '{item}' is not a new key=value")
            seen.add(key)
            if key == "tp":
                self.tp, self.tp_sizes = _sizes(value, key)
            elif key == "sp":
                self.sp, self.sp_sizes = _sizes(value, key)
            elif key == "sp_dim":
                if not value.isdigit():
                    raise PlanError(f"plan '{text}': sp_dim must be a dim number")
                self.sp_dim = int(value)
            elif key in ("reduce", "stats_reduce"):
                if value not in DTYPES:
                    raise PlanError(f"plan '{text}': {key}={value} is not one of {', '.join(DTYPES)}")
                setattr(self, key, value)
            elif key == "flush_subnormals":
                if value not in ("0", "1"):
                    raise PlanError(f"plan '{text}': flush_subnormals={value} is not 0 or 1")
                self.flush_subnormals = value == "1"
            else:
                raise PlanError(f"plan '{text}': unknown key '{key}' "
                                "(tp, sp, sp_dim, reduce, stats_reduce, flush_subnormals)")
        if self.tp * self.sp < 2:
            raise PlanError(f"plan '{text}': a plan needs at least 2 ranks")

    @property
    def world(self):
        return self.tp * self.sp

    def coords(self, rank):
        """(t, s): the rank's index in its tensor- and sequence-parallel groups."""
        return rank % self.tp, rank // self.tp

    def layout(self, shape, norm_dims):
        """Per-rank slices for a tensor of x's shape whose normalized dims are `norm_dims`
        (sorted, trailing). Returns Layout; raises PlanError when the plan does not fit."""
        return Layout(self, list(shape), list(norm_dims))

    def __str__(self):
        return self.text


def _bounds(n, parts, sizes, what):
    if sizes is None:
        if n < parts:
            raise PlanError(f"{what} has {n} elements, fewer than its {parts} ranks")
        sizes = [len(a) for a in np.array_split(np.arange(n), parts)]
    elif sum(sizes) != n:
        raise PlanError(f"{what} has {n} elements; the shard sizes {'+'.join(map(str, sizes))} add up to {sum(sizes)}")
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [(int(starts[i]), int(starts[i + 1])) for i in range(parts)]


class Layout:
    """Where each rank's data sits in the full tensors of one case."""

    def __init__(self, plan, shape, norm_dims):
        rank = len(shape)
        if norm_dims != list(range(rank - len(norm_dims), rank)):
            raise PlanError(f"normalized dims {norm_dims} are not trailing (sharded cases normalize trailing dims)")
        self.plan, self.shape, self.norm_dims = plan, shape, norm_dims
        self.tp_dim = norm_dims[0]
        self.tp_bounds = _bounds(shape[self.tp_dim], plan.tp, plan.tp_sizes, f"dim {self.tp_dim} (tp)")
        if plan.sp > 1:
            if plan.sp_dim >= norm_dims[0]:
                raise PlanError(f"sp_dim {plan.sp_dim} is a normalized dim (x has {rank} dims, "
                                f"normalized {norm_dims}): sp splits rows")
            self.sp_bounds = _bounds(shape[plan.sp_dim], plan.sp, plan.sp_sizes, f"dim {plan.sp_dim} (sp)")
        else:
            self.sp_bounds = [(0, shape[plan.sp_dim] if plan.sp_dim < rank else 1)]
        # the tp-sharded extent of the flattened normalized dims
        inner = int(np.prod(shape[self.tp_dim + 1:], dtype=np.int64)) if rank > self.tp_dim + 1 else 1
        self.n_full = int(np.prod([shape[d] for d in norm_dims], dtype=np.int64))
        self.n_local = [(b - a) * inner for a, b in self.tp_bounds]

    def _slc(self, t, s, ndim, dims):
        idx = [slice(None)] * ndim
        for kind, d in dims:
            a, b = (self.tp_bounds[t] if kind == "tp" else self.sp_bounds[s])
            idx[d] = slice(a, b)
        return tuple(idx)

    def x_slice(self, rank):
        """x, dy, y, dx: split along the tp dim and the sp dim."""
        t, s = self.plan.coords(rank)
        dims = [("tp", self.tp_dim)] + ([("sp", self.plan.sp_dim)] if self.plan.sp > 1 else [])
        return self._slc(t, s, len(self.shape), dims)

    def stat_slice(self, rank):
        """mean, rstd (normalized dims of extent 1): split along the sp dim, replicated over tp."""
        t, s = self.plan.coords(rank)
        dims = [("sp", self.plan.sp_dim)] if self.plan.sp > 1 else []
        return self._slc(t, s, len(self.shape), dims)

    def param_slice(self, rank):
        """weight, bias and their gradients (the normalized dims): split along tp, replicated over sp."""
        t, s = self.plan.coords(rank)
        return self._slc(t, s, len(self.norm_dims), [("tp", 0)])

    # Which plan axis replicates an output: its copies must agree (README.md, "Gathered outputs").
    REPLICATED = {"mean": "tp", "rstd": "tp", "dweight": "sp", "dbias": "sp"}

    def copies(self, name):
        axis = self.REPLICATED.get(name)
        return {"tp": self.plan.tp, "sp": self.plan.sp}.get(axis, 1)

    def gather(self, name, full_shape, per_rank, copy=0):
        """Assembles one copy of output `name` from per-rank arrays (rank -> array). Copy k is the
        one held by the ranks with index k along the replicating axis."""
        out = np.empty(full_shape, dtype=np.float64)
        for rank, a in per_rank.items():
            t, s = self.plan.coords(rank)
            axis = self.REPLICATED.get(name)
            if (axis == "tp" and t != copy) or (axis == "sp" and s != copy):
                continue
            if name in ("mean", "rstd"):
                slc = self.stat_slice(rank)
            elif name in ("dweight", "dbias"):
                slc = self.param_slice(rank)
            else:
                slc = self.x_slice(rank)
            out[slc] = np.asarray(a, dtype=np.float64).reshape(out[slc].shape)
        return out
