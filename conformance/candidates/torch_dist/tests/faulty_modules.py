"""Modules that break their ranks on purpose, for the isolation tests: the runtime must turn each
into CRASHED or TIMEOUT for that case, tear the group down and go on with a fresh one. Each is
the correct module except on forward cases, where one rank does something bad before its first
collective (so the other rank waits inside that all-reduce)."""
import os
import signal
import time

from sharded_norms import correct


def _raise():
    raise RuntimeError("planted failure on rank 0")


def _breaks(rank, action):
    def factory(ctx):
        if ctx.rank == rank and ctx.direction == "forward":
            action()
        return correct(ctx)
    return factory


exit_rank1_forward = _breaks(1, lambda: os._exit(3))                       # exits with status 3
segv_rank1_forward = _breaks(1, lambda: os.kill(os.getpid(), signal.SIGSEGV))  # killed by SIGSEGV
hang_rank1_forward = _breaks(1, lambda: time.sleep(3600))                  # never answers
raise_rank0_forward = _breaks(0, _raise)                                   # an exception on one rank
