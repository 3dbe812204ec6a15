#!/usr/bin/env python3
"""Runs a user's sharded nn.Module on real torch.distributed ranks over a fixture file's cases and
writes an outputs file (fixtures/SCHEMA.md, "Outputs files" and "Sharded outputs").

    dist_runtime.py --fixtures sharded.h5 --module sharded_norms:correct --plan tp=4 -o tp4.h5
    dist_runtime.py --fixtures sharded.h5 --module my.pkg:make_norm --plans ci_plans.json --out-dir out/

Each plan's ranks are R processes on this machine (spawned once per rank count and reused for
every case and plan: start-up dominates), joined in a process group of the chosen backend
(`gloo`; `nccl` on a GPU machine, one GPU per rank). A rank that dies or hangs ends that case
CRASHED or TIMEOUT for all its ranks; the group is torn down (every rank killed) and a fresh one
serves the next case. README.md describes the module contract and the plans.
"""
import argparse
import fnmatch
import importlib
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from shard_plan import Plan, PlanError  # noqa: E402

OUTPUTS = {"forward": ("y", "mean", "rstd"), "backward": ("dx", "dweight", "dbias")}
ROLE = {"x": "dtype_x", "dy": "dtype_out", "weight": "dtype_param", "bias": "dtype_param"}


class Context:
    """What a module factory is given (README.md, "The module contract")."""

    def __repr__(self):
        return "Context(" + ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.endswith("group")) + ")"


def load_factory(path):
    mod, sep, attr = path.partition(":")
    if not sep:
        mod, _, attr = path.rpartition(".")
    if not mod or not attr:
        raise ValueError(f"--module {path}: expected package.module:factory")
    return getattr(importlib.import_module(mod), attr)


# ---------------------------------------------------------------- rank side

def _die_with_parent():
    try:  # Linux: a rank must not outlive the runtime that spawned it (a hung rank included)
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _rank_main(rank, world, port, backend, timeout_s, conn, paths):
    _die_with_parent()
    sys.path[:0] = paths
    import datetime
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    tdt = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
           "bfloat16": torch.bfloat16}
    if backend == "nccl":
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=2 * timeout_s + 10))  # the runtime's watchdog fires first
    device = torch.device(f"cuda:{rank % max(1, torch.cuda.device_count())}") if backend == "nccl" else torch.device("cpu")
    groups = {}

    def grid(tp, sp):
        # every rank creates every group, in the same order (torch.distributed requires it)
        if (tp, sp) not in groups:
            tps = [dist.new_group([s * tp + t for t in range(tp)]) for s in range(sp)]
            sps = [dist.new_group([s * tp + t for s in range(sp)]) for t in range(tp)]
            groups[(tp, sp)] = (tps, sps)
        return groups[(tp, sp)]

    factories = {}
    conn.send(("ready", rank))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            break
        case, plan_text, factory_path, local = msg
        t0 = time.perf_counter()
        try:
            plan = Plan(plan_text)
            t, s = plan.coords(rank)
            tps, sps = grid(plan.tp, plan.sp)
            c = Context()
            for k in ("op", "contract", "affine", "direction", "dtype_x", "dtype_param", "dtype_out",
                      "dtype_compute"):
                c.__dict__[k] = case[k]
            c.case_id = case.get("case_id", "")
            c.eps, c.weight_offset = float.fromhex(case["epsilon_hex"]), float.fromhex(case["weight_offset_hex"])
            c.norm_dims, c.n_full, c.n_local = case["norm_dims"], case["n_full"], case["n_local"][t]
            c.weight_shape = local["weight_shape"]
            c.rank, c.world, c.tp_rank, c.tp_size, c.sp_rank, c.sp_size = rank, world, t, plan.tp, s, plan.sp
            c.tp_group, c.sp_group, c.reduce, c.device = tps[s], sps[t], plan.reduce, device
            c.stats_reduce, c.flush = plan.stats_reduce, plan.flush_subnormals
            if factory_path not in factories:
                factories[factory_path] = load_factory(factory_path)
            module = factories[factory_path](c)
            module = module.to(device)
            backward = case["direction"] == "backward"
            with torch.no_grad():
                for name in ("weight", "bias"):
                    p = getattr(module, name, None)
                    if p is not None and name in local:
                        p.copy_(torch.from_numpy(local[name]).to(tdt[c.dtype_param]))

            def tensor(name):
                return torch.from_numpy(local[name]).to(device=device, dtype=tdt[case[ROLE[name]]])

            x = tensor("x").requires_grad_(backward)
            with torch.set_grad_enabled(backward):
                y = module(x)
                out = {}
                if backward:
                    y.backward(tensor("dy"))
                    if hasattr(module, "finalize_grads"):
                        module.finalize_grads()
                    out["dx"] = x.grad
                    for name in ("weight", "bias"):
                        p = getattr(module, name, None)
                        if p is not None and p.grad is not None:
                            out["d" + name] = p.grad
                else:
                    out["y"] = y
                    out.update(getattr(module, "stats", {}) or {})
            arrays = {k: v.detach().cpu().double().numpy() for k, v in out.items() if v is not None}
            conn.send(("result", arrays, time.perf_counter() - t0))
        except Exception as e:  # noqa: BLE001 - any failure of the user's code is this case's failure
            kind = "decline" if type(e).__name__ == "Declined" else "error"
            if kind == "error":
                traceback.print_exc(file=sys.stderr)
            conn.send((kind, f"{type(e).__name__}: {e}", time.perf_counter() - t0))
    dist.destroy_process_group()


# ---------------------------------------------------------------- runtime side

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_text(code):
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class Group:
    """R rank processes in one process group, reused for case after case."""

    def __init__(self, world, backend, timeout_s, startup_s=120):
        t0 = time.perf_counter()
        self.world = world
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.conns, self.procs = [], []
        paths = [p for p in sys.path if p]
        for r in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_rank_main, args=(r, world, port, backend, timeout_s, child, paths), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        for r in range(world):
            if not self.conns[r].poll(startup_s):
                self.kill()
                raise RuntimeError(f"rank {r} of {world} did not start within {startup_s} s")
            try:
                self.conns[r].recv()
            except EOFError:
                self.procs[r].join(5)
                code = self.procs[r].exitcode
                self.kill()
                raise RuntimeError(f"rank {r} of {world} failed to start: {_exit_text(code)} "
                                   f"(its traceback is on stderr; --backend {backend})")
        self.startup_s = time.perf_counter() - t0

    def run(self, msgs, timeout_s, grace_s=5.0):
        """Sends one message per rank; returns (status, per-rank results, message).
        status: result, decline, error (CRASHED), died (CRASHED), timeout (TIMEOUT)."""
        for r, m in enumerate(msgs):
            try:
                self.conns[r].send(m)
            except (BrokenPipeError, OSError):
                return "died", {}, f"rank {r} {_exit_text(self.procs[r].exitcode)} before the case was sent"
        pending = set(range(self.world))
        replies = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            waitables = {self.conns[r]: r for r in pending}
            waitables.update({self.procs[r].sentinel: r for r in pending})
            left = deadline - time.monotonic()
            ready = mp.connection.wait(list(waitables), timeout=max(0.0, left)) if left > 0 else []
            if not ready:
                ranks = ", ".join(map(str, sorted(pending)))
                errs = [f"rank {r}: {v[1]}" for r, v in sorted(replies.items()) if v[0] == "error"]
                if errs:
                    return "error", replies, "; ".join(errs) + f"; rank(s) {ranks} left waiting (in a collective)"
                return "timeout", replies, f"rank(s) {ranks} of {self.world} did not answer within {timeout_s:g} s"
            for w in ready:
                r = waitables[w]
                if r not in pending:
                    continue
                if w is self.conns[r] or self.conns[r].poll():
                    try:
                        replies[r] = self.conns[r].recv()
                        pending.discard(r)
                        if replies[r][0] == "error" and pending:
                            # the others may be blocked in a collective the failed rank never joins
                            deadline = min(deadline, time.monotonic() + grace_s)
                        continue
                    except EOFError:
                        pass
                self.procs[r].join(1)
                return "died", replies, f"rank {r} of {self.world} {_exit_text(self.procs[r].exitcode)}"
        kinds = {k for k, *_ in replies.values()}
        if "error" in kinds:
            errs = [f"rank {r}: {v[1]}" for r, v in sorted(replies.items()) if v[0] == "error"]
            return "error", replies, "; ".join(errs)
        if "decline" in kinds:
            return "decline", replies, next(v[1] for v in replies.values() if v[0] == "decline")
        return "result", replies, ""

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.join(5)
        for c in self.conns:
            c.close()

    def close(self):
        for c in self.conns:
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 5
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self.kill()


def read_case(f, cid):
    """A fixture case as the runtime needs it: attributes (with *_hex forms), inputs, output specs."""
    g = f[f"cases/{cid}"]
    a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
    case = {k: (v.tolist() if isinstance(v, np.ndarray) else v.item() if hasattr(v, "item") else v)
            for k, v in a.items()}
    for k in ("epsilon", "weight_offset", "alpha"):
        case[k + "_hex"] = float(case.get(k, 0.0)).hex()
    inputs = {k: g[f"inputs/{k}"][...].astype(np.float64) for k in g["inputs"]}
    rank = inputs["x"].ndim
    if "axes" in case:
        dims = sorted(int(d) % rank for d in np.atleast_1d(case["axes"]))
    else:
        dims = list(range(int(case.get("axis", -1)) % rank, rank))
    case["norm_dims"] = dims
    case["case_id"] = cid
    outs = {k: g[f"expected/{k}"].shape for k in g["expected"]} if "expected" in g else {}
    return case, inputs, outs


def run_case(groups, failures, args, case, inputs, out_shapes, plan, factory):
    """Runs one case under one plan. Returns (status, gathered outputs, copies, message, seconds)."""
    if case.get("residual", "none") != "none" or case.get("block", "none") != "none":
        return "unsupported", {}, {}, "sharded cases have no residual and no block", 0.0
    try:
        lay = plan.layout(inputs["x"].shape, case["norm_dims"])
    except PlanError as e:
        return "unsupported", {}, {}, f"plan {plan}: {e}", 0.0
    case = dict(case, n_full=lay.n_full, n_local=lay.n_local)
    world = plan.world
    failed = failures  # rank count -> (start-ups failed in a row, the last error)
    if world not in groups:
        # as the subprocess host does (PROTOCOL.md): after 3 failed start-ups in a row, stop trying
        if failed.get(world, (0, ""))[0] >= 3:
            return "crashed", {}, {}, f"the {world} ranks could not start: {failed[world][1]}", 0.0
        try:
            groups[world] = Group(world, args.backend, args.timeout)
            failed.pop(world, None)
        except RuntimeError as e:
            failed[world] = (failed.get(world, (0, ""))[0] + 1, str(e))
            return "crashed", {}, {}, f"the {world} ranks could not start: {e}", 0.0
    g = groups[world]
    msgs = []
    for r in range(world):
        local = {"x": inputs["x"][lay.x_slice(r)]}
        if "dy" in inputs:
            local["dy"] = inputs["dy"][lay.x_slice(r)]
        wshape = list(np.empty([inputs["x"].shape[d] for d in case["norm_dims"]])[lay.param_slice(r)].shape)
        local["weight_shape"] = wshape
        for name in ("weight", "bias"):
            if name in inputs:
                local[name] = np.ascontiguousarray(inputs[name][lay.param_slice(r)])
        msgs.append((case, plan.text, factory, {k: (np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v)
                                                 for k, v in local.items()}))
    t0 = time.perf_counter()
    status, replies, message = g.run(msgs, args.timeout)
    seconds = time.perf_counter() - t0
    if status == "decline" and all(v[0] == "decline" for v in replies.values()):
        return "unsupported", {}, {}, message, seconds  # before any collective: the group is sound
    if status != "result":
        # a rank that died, hung or failed may leave the others inside a collective: tear down
        g.kill()
        del groups[world]
        message += f"; process group of {world} ranks torn down"
        return ("timeout" if status == "timeout" else "crashed"), {}, {}, message, seconds
    per_rank = {r: v[1] for r, v in replies.items()}
    gathered, copies = {}, {}
    for name, shape in out_shapes.items():
        if not all(name in a for a in per_rank.values()):
            continue  # MISSING for the checker
        n = lay.copies(name)
        arrays = {r: a[name] for r, a in per_rank.items()}
        gathered[name] = lay.gather(name, shape, arrays, 0)
        if n > 1:
            copies[name] = [lay.gather(name, shape, arrays, k) for k in range(n)]
    return "result", gathered, copies, "", seconds


def write_outputs(path, header, records):
    """Writes the file whole, then renames it into place: never a half-written file."""
    import h5py
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        for k, v in header.items():
            f.attrs[k] = v
        for cid, rec in sorted(records.items()):
            g = f.create_group(f"cases/{cid}")
            g.attrs["shard_plan"] = rec["plan"]
            g.attrs["seconds"] = rec["seconds"]
            if rec["status"] != "result":
                g.create_group("outputs")  # empty: `normcheck check` reports every output MISSING
                g.attrs["status"] = rec["status"].upper()
                g.attrs["message"] = rec["message"]
                continue
            for name, a in rec["outputs"].items():
                g.create_dataset(f"outputs/{name}", data=a)
            for name, cps in rec["copies"].items():
                for k, a in enumerate(cps):
                    g.create_dataset(f"copies/{k}/{name}", data=a)
    os.replace(tmp, path)


def plan_jobs(args):
    if args.plans:
        with open(args.plans) as fh:
            spec = json.load(fh)
        if not isinstance(spec, dict) or spec.get("format") != "normcheck-shard-plans" or spec.get("version") != 1:
            raise SystemExit(f"dist_runtime: {args.plans}: not a normcheck-shard-plans version 1 file")
        jobs = []
        for i, e in enumerate(spec.get("plans", [])):
            if set(e) - {"name", "plan", "cases", "comment"} or "plan" not in e or "name" not in e:
                raise SystemExit(f"dist_runtime: {args.plans}: plans[{i}] needs name, plan, cases (and nothing else)")
            jobs.append((e["name"], Plan(e["plan"]), list(e.get("cases", ["*"]))))
        return jobs
    name = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in args.plan)
    return [(name, Plan(args.plan), args.cases or ["*"])]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--module", required=True, action="append",
                    help="package.module:factory (the directory of this file and the working directory are on the "
                    "import path); repeatable with --out-dir: DIR/<factory>/<plan name>.h5, one group of ranks for all")
    ap.add_argument("--plan", help="one plan (shard_plan.py), with -o")
    ap.add_argument("--plans", help="a plan list (normcheck-shard-plans JSON), with --out-dir")
    ap.add_argument("--cases", action="append", help="case id glob (repeatable; with --plan)")
    ap.add_argument("-o", "--out", help="outputs file (with --plan)")
    ap.add_argument("--out-dir", help="one outputs file per plan: DIR/<name>.h5 (with --plans)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case for all ranks (default 60)")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--timing", help="write per-case seconds and start-up times as JSON")
    args = ap.parse_args(argv)
    if bool(args.plan) == bool(args.plans) or (args.plan and not (args.out or args.out_dir)) or (args.plans and not args.out_dir):
        ap.error("give --plan with -o or --out-dir, or --plans with --out-dir")
    if args.out and len(args.module) > 1:
        ap.error("several --module need --out-dir")
    sys.path.insert(0, os.getcwd())
    import h5py
    try:
        jobs = plan_jobs(args)
        for m in args.module:
            load_factory(m)
    except (PlanError, ValueError, ImportError, AttributeError) as e:
        print(f"dist_runtime: {e}", file=sys.stderr)
        return 2
    def out_path(module, name):
        if args.out:
            return args.out
        return os.path.join(args.out_dir, module.replace(":", ".").split(".")[-1], name + ".h5")

    existing = [out_path(m, j[0]) for m in args.module for j in jobs if os.path.exists(out_path(m, j[0]))]
    if existing and not args.force:
        print(f"dist_runtime: {existing[0]} exists (use --force to replace it)", file=sys.stderr)
        return 2
    if not os.path.exists(args.fixtures):
        print(f"dist_runtime: no fixture file {args.fixtures}", file=sys.stderr)
        return 2
    groups, failures, timing, t_all = {}, {}, {"cases": [], "startup_s": []}, time.perf_counter()
    counts = {}
    try:
        with h5py.File(args.fixtures, "r") as f:
            ids = sorted(f["cases"].keys())
            for module, (name, plan, globs) in [(m, j) for m in args.module for j in jobs]:
                records = {}
                for cid in [i for i in ids if any(fnmatch.fnmatchcase(i, g) for g in globs)]:
                    case, inputs, outs = read_case(f, cid)
                    before = set(groups)
                    status, gathered, copies, message, secs = run_case(groups, failures, args, case, inputs, outs, plan, module)
                    for w in set(groups) - before:
                        timing["startup_s"].append({"world": w, "seconds": groups[w].startup_s})
                    records[cid] = {"plan": plan.text, "status": status, "outputs": gathered, "copies": copies,
                                    "message": message, "seconds": secs}
                    counts[status] = counts.get(status, 0) + 1
                    timing["cases"].append({"module": module, "plan": plan.text, "case": cid, "status": status,
                                            "seconds": secs})
                    if status != "result":
                        print(f"{module} {name} {cid}: {status.upper()}: {message}", file=sys.stderr)
                out = out_path(module, name)
                os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
                header = {"generator": "normcheck dist_runtime", "module": module, "shard_plan": plan.text,
                          "backend": args.backend, "fixtures": os.path.basename(args.fixtures),
                          "command": " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:]))}
                write_outputs(out, header, records)
    finally:
        for g in groups.values():
            g.close()
    timing["total_s"] = time.perf_counter() - t_all
    ran = [c["seconds"] for c in timing["cases"] if c["status"] == "result"]
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    per = f"; {1e3 * sum(ran) / len(ran):.1f} ms per case run" if ran else ""
    start = sum(s["seconds"] for s in timing["startup_s"])
    print(f"dist_runtime: {summary}{per}; start-up {start:.1f} s; total {timing['total_s']:.1f} s", file=sys.stderr)
    if args.timing:
        with open(args.timing, "w") as fh:
            json.dump(timing, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
