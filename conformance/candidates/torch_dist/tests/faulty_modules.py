"""Modules that break their ranks on purpose, for the isolation tests: the runtime must turn each
into CRASHED or TIMEOUT for that case, tear the group down and go on with a fresh one."""
import os
import signal
import time

from sharded_norms import correct


def exit_rank1_forward(ctx):
    """Rank 1 exits with status 3 on forward cases; the other rank waits in its all-reduce."""
    if ctx.rank == 1 and ctx.direction == "forward":
        os._exit(3)
    return correct(ctx)


def segv_rank1_forward(ctx):
    if ctx.rank == 1 and ctx.direction == "forward":
        os.kill(os.getpid(), signal.SIGSEGV)
    return correct(ctx)


def hang_rank1_forward(ctx):
    """Rank 1 never answers on forward cases (a rank stuck outside any collective)."""
    if ctx.rank == 1 and ctx.direction == "forward":
        time.sleep(3600)
    return correct(ctx)


def raise_rank0_forward(ctx):
    """Rank 0 raises; rank 1 is left inside the first all-reduce of the case."""
    if ctx.rank == 0 and ctx.direction == "forward":
        raise RuntimeError("planted failure on rank 0")
    return correct(ctx)
