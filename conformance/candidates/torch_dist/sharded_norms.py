"""Bundled sharded LayerNorm/RMSNorm in plain torch: the correct tensor- and sequence-parallel
implementation, and one mutant per fault of the catalogue (README.md, "Mutants").

Factories (give one to the runtime as `sharded_norms:NAME`): each takes the rank's ShardContext
(README.md, "The module contract") and returns an nn.Module whose `weight`/`bias` are the rank's
shards, whose forward(x_local) returns y_local (setting `self.stats` to its mean/rstd), and
whose finalize_grads() reduces the parameter gradients after backward, as Megatron's
finalize_model_grads does.

Arithmetic of the correct implementation (float32 throughout, one rounding to each output dtype;
all_reduce_tp in the plan's stats_reduce dtype, float32 by default, rounded as the gradients'
16-bit reduce below where it is bfloat16 or float16; TOLERANCE.md, section 11):
  LayerNorm: s1 = all_reduce_tp(sum x) ; mu = s1 / n ; d = x - mu ;
             s2 = all_reduce_tp(sum d^2) ; rstd = rsqrt(s2 / n + eps)   (two-pass across ranks)
  RMSNorm:   s2 = all_reduce_tp(sum x^2) ; rstd = rsqrt(s2 / n + eps)
  y = d * rstd * (offset + w) + b ;  n is the FULL normalized size (every rank's shard counted)
  backward:  g = dy * scale ; sg = all_reduce_tp(sum g) ; sgx = all_reduce_tp(sum g xhat) ;
             dx = rstd (g - sg / n - xhat sgx / n)   (RMSNorm: no sg term)
             dweight = all_reduce_sp(sum_rows dy xhat), dbias = all_reduce_sp(sum_rows dy), in the
             plan's reduce dtype (float32: one fp32 all-reduce, rounded once to dtype_param;
             bfloat16/float16: each rank's partial rounded to it, then added in rank order with
             a rounding after each add, as a 16-bit all-reduce kernel does).
"""
import torch
import torch.distributed as dist

TDTYPE = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


class Declined(Exception):
    """The factory does not take this case (the runtime reports it UNSUPPORTED with the reason)."""


def all_reduce_sum(t, group, size, dtype="float32", flush=False):
    """Sum of `t` (float32) over the group, every rank getting the same bits.

    gloo has no bfloat16 all-reduce (torch 1.13: "Invalid scalar type"), so a 16-bit reduction is
    a gather of the rounded partials followed by rank-order adds rounded to the dtype after each:
    what a one-shot 16-bit all-reduce kernel computes (FlashInfer's non-Fp32Acc path). `flush`:
    every rounded value below the dtype's smallest normal becomes a zero of its sign, as an
    all-reduce that flushes subnormals gives (plan item flush_subnormals=1; a float32 one too)."""
    if size == 1:
        return t  # one rank: no all-reduce, nothing rounded
    if dtype == "float32" and not flush:
        t = t.clone()
        dist.all_reduce(t, group=group)
        return t
    low = TDTYPE[dtype]
    tiny = torch.finfo(low).tiny

    def rn(v):
        v = v.to(low)
        return torch.where(v.abs() < tiny, v * 0, v) if flush else v

    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, rn(t).float().contiguous(), group=group)
    acc = parts[0].to(low)
    for p in parts[1:]:
        acc = rn(acc.float() + p)
    return acc.float()


class _NormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, mod):
        c, fault = mod.ctx, mod.fault
        dims = tuple(range(x.dim() - len(c.norm_dims), x.dim()))
        rank_local = fault == "rank_local"
        n = c.n_local if rank_local else c.n_full

        def reduce_tp(t):  # the statistics' all-reduce, in the plan's stats_reduce dtype
            return t if rank_local else all_reduce_sum(t, c.tp_group, c.tp_size, c.stats_reduce, c.flush)

        xf = x.float()
        if c.op == "layernorm":
            mean = reduce_tp(xf.sum(dims, keepdim=True)) / n
            d = xf - mean
            var = reduce_tp((d * d).sum(dims, keepdim=True)) / n
        else:
            mean, d = None, xf
            if fault == "div_world":
                # vLLM MiniMaxText01RMSNormTP: per-shard mean of squares, all-reduced, / tp_world
                var = reduce_tp((d * d).sum(dims, keepdim=True) / c.n_local) / c.tp_size
            else:
                var = reduce_tp((d * d).sum(dims, keepdim=True)) / n
        rstd = torch.rsqrt(var + c.eps)
        xhat = d * rstd
        scale = None if w is None else (w.float() + c.weight_offset if c.weight_offset else w.float())
        y = xhat if scale is None else xhat * scale
        if b is not None:
            y = y + b.float()
        mod.stats = {"rstd": rstd} if mean is None else {"mean": mean, "rstd": rstd}
        ctx.mod, ctx.dims, ctx.n = mod, dims, n
        ctx.save_for_backward(xhat, rstd, scale)
        ctx.has_b = b is not None
        return y.to(TDTYPE[c.dtype_out])

    @staticmethod
    def backward(ctx, dy):
        xhat, rstd, scale = ctx.saved_tensors
        mod, dims, n = ctx.mod, ctx.dims, ctx.n
        c = mod.ctx
        rank_local = mod.fault == "rank_local"

        def reduce_tp(t):  # the statistics' all-reduce, in the plan's stats_reduce dtype
            return t if rank_local else all_reduce_sum(t, c.tp_group, c.tp_size, c.stats_reduce, c.flush)

        dyf = dy.float()
        g = dyf if scale is None else dyf * scale
        k = g - xhat * (reduce_tp((g * xhat).sum(dims, keepdim=True)) / n)
        if c.op == "layernorm":
            k = k - reduce_tp(g.sum(dims, keepdim=True)) / n
        dx = rstd * k
        rows = tuple(range(xhat.dim() - len(dims)))
        mod.partial = {}
        if scale is not None:
            mod.partial["weight"] = (dyf * xhat).sum(rows)
        if ctx.has_b:
            mod.partial["bias"] = dyf.sum(rows)
        if mod.fault == "reduced_twice":
            # the gradient reduced in backward already (as a sequence-parallel layer's
            # reduce-scatter would) and again in finalize_grads
            mod.partial = {k2: all_reduce_sum(v, c.sp_group, c.sp_size) for k2, v in mod.partial.items()}
        return dx.to(TDTYPE[c.dtype_x]), None, None, None


class ShardedNorm(torch.nn.Module):
    def __init__(self, ctx, fault=None):
        super().__init__()
        if ctx.op not in ("layernorm", "rmsnorm"):
            raise Declined(f"op {ctx.op}")
        if ctx.contract not in ("exact", "gemma"):
            raise Declined(f"contract {ctx.contract}: the bundled sharded norms compute in float32 and "
                           "round once (exact, gemma)")
        if ctx.dtype_compute != "float32":
            raise Declined("only float32 accumulation")
        self.ctx, self.fault, self.stats, self.partial = ctx, fault, {}, {}
        pdt = TDTYPE[ctx.dtype_param]
        has_w = ctx.affine in ("weight", "weight_bias")
        self.weight = torch.nn.Parameter(torch.ones(ctx.weight_shape, dtype=pdt)) if has_w else None
        self.bias = torch.nn.Parameter(torch.zeros(ctx.weight_shape, dtype=pdt)) if ctx.affine == "weight_bias" else None

    def forward(self, x):
        return _NormFn.apply(x, self.weight, self.bias, self)

    def finalize_grads(self):
        c = self.ctx
        for name, p in (("weight", self.weight), ("bias", self.bias)):
            if p is None or name not in self.partial:
                continue
            g = self.partial[name]
            if self.fault != "not_reduced":
                g = all_reduce_sum(g, c.sp_group, c.sp_size, c.reduce, c.flush)
                if self.fault == "averaged":
                    g = g / c.sp_size
            p.grad = g.to(p.dtype)


def correct(ctx):
    """Tensor- and sequence-parallel LayerNorm/RMSNorm: statistics all-reduced over the tp group
    with the full n, parameter gradients sum-reduced over the sp group."""
    return ShardedNorm(ctx)


def tp_rank_local(ctx):
    """Statistics over the rank's own shard of the normalized dims (gpt-neox #1424)."""
    return ShardedNorm(ctx, "rank_local")


def qk_norm_no_comm(ctx):
    """QK-norm over heads*head_dim applied to the rank's heads alone, with no gather or all-reduce
    (vLLM OLMo2 gathers q and k for exactly this reason)."""
    return ShardedNorm(ctx, "rank_local")


def sp_grad_not_reduced(ctx):
    """Replicated parameters' gradients left rank-local (Megatron-LM #1446)."""
    return ShardedNorm(ctx, "not_reduced")


def sp_grad_averaged(ctx):
    """Gradients averaged over the ranks instead of summed (gpt-neox #1259)."""
    return ShardedNorm(ctx, "averaged")


def sp_grad_reduced_twice(ctx):
    """Gradients reduced in backward and again in finalize_grads: R times the gradient
    (Megatron-LM #1528: LayerNorm grad multiplied by the TP size)."""
    return ShardedNorm(ctx, "reduced_twice")


def tp_rms_divided_by_world(ctx):
    """RMSNorm whose all-reduced per-shard mean of squares is divided by the world size: exact for
    equal shards only (vLLM MiniMaxText01RMSNormTP)."""
    if ctx.op != "rmsnorm":
        raise Declined("the MiniMax TP norm is an RMSNorm")
    return ShardedNorm(ctx, "div_world")


MUTANTS = {
    "tp_rank_local": "gpt-neox #1424",
    "qk_norm_no_comm": "vLLM olmo2.py (all_gather of q, k before the norm)",
    "sp_grad_not_reduced": "Megatron-LM #1446",
    "sp_grad_averaged": "gpt-neox #1259",
    "sp_grad_reduced_twice": "Megatron-LM #1528",
    "tp_rms_divided_by_world": "vLLM MiniMaxText01RMSNormTP",
}
