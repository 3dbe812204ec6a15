#!/usr/bin/env python3
"""The torch.distributed runtime on real gloo ranks: the bundled correct TP/SP norms conform on
every plan of ci_plans.json (2 and 4 ranks, equal and unequal shards, float32, bfloat16 and
float16 gradient all-reduce, 16-bit statistics all-reduce, flushing all-reduces), judged by plain
`normcheck check`; every mutant is rejected with its diagnosis, also under a 16-bit statistics
all-reduce; a rank that dies, hangs or raises costs its case only; normcheck-shard-check, the
compatibility alias, agrees. The NCCL run is skipped, with the reason, without two CUDA devices.
Needs NORMCHECK_EXE and NORMCHECK_SHARD_CHECK (ctest sets them)."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
REPO = os.path.abspath(os.path.join(PKG, "..", "..", ".."))
sys.path.insert(0, PKG)
from shard_plan import Plan, PlanError  # noqa: E402

NORMCHECK = os.environ.get("NORMCHECK_EXE", "")
SHARD_CHECK = os.environ.get("NORMCHECK_SHARD_CHECK", "")

try:
    import torch.distributed as dist
    GLOO = dist.is_available() and dist.is_gloo_available()
    WHY = "" if GLOO else "torch.distributed with gloo is not available"
except Exception as e:  # noqa: BLE001
    GLOO, WHY = False, f"cannot import torch.distributed: {e}"
try:
    import h5py  # noqa: F401
except ImportError:
    GLOO, WHY = False, "h5py is not available"

# mutant -> (a plan it must fail under, the diagnosis it must be given there)
MUTANTS = {
    "tp_rank_local": ("tp4_unequal", "rank-local statistics"),
    "qk_norm_no_comm": ("tp4_unequal_heads", "rank-local statistics"),
    "sp_grad_not_reduced": ("sp4_unequal", "rank-local: the sum over sp rank"),
    "sp_grad_averaged": ("sp2", "averaged: the all-reduced sum divided by the 2 sp ranks"),
    "sp_grad_reduced_twice": ("sp4", "multiplied by 4"),
    "tp_rms_divided_by_world": ("tp4_unequal", "sum of squares divided by the world size"),
}


# tp mutants under a 16-bit statistics all-reduce (TOLERANCE.md, section 11): still rejected, still named
STATS_MUTANTS = {
    "tp_rank_local": ("tp4_unequal_f16_stats", "rank-local statistics"),
    "qk_norm_no_comm": ("tp2_bf16_stats", "rank-local statistics"),
    "tp_rms_divided_by_world": ("tp4_unequal_f16_stats", "sum of squares divided by the world size"),
}


def shard_check(*args):
    return subprocess.run([SHARD_CHECK, *args], capture_output=True, text=True, timeout=300)


def check(fixtures, outputs, *args):
    """Plain `normcheck check` of a sharded outputs file; every failing case printed."""
    return subprocess.run([NORMCHECK, "check", "--fixtures", fixtures, "--outputs", outputs, "--max-print", "10000",
                           *args], capture_output=True, text=True, timeout=300)


def nccl_unavailable():
    """Why the NCCL run cannot happen here ("" where it can). Each reason holds an apostrophe, so
    unittest prints it in double quotes: ctest's SKIP_REGULAR_EXPRESSION "skipped '" (the whole
    test skipped where gloo is missing) does not turn this one skipped method into a skipped test."""
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001
        return f"cannot import torch.distributed ('{e}')"
    if not dist.is_nccl_available():
        return "this torch has no NCCL backend (Debian's CPU build); the NCCL run needs a GPU machine"
    if torch.cuda.device_count() < 2:
        return (f"{torch.cuda.device_count()} CUDA device(s): NCCL puts one rank per GPU and the 2-rank plan "
                "needs two; run on a GPU machine (README.md, 'On a GPU machine')")
    return ""


@unittest.skipUnless(GLOO and NORMCHECK and SHARD_CHECK, WHY or "NORMCHECK_EXE / NORMCHECK_SHARD_CHECK not set")
class TorchDist(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.fixtures = os.path.join(d, "sharded.h5")
        subprocess.run([NORMCHECK, "fixtures", "generate", "--cases", os.path.join(REPO, "fixtures/cases/sharded.json"),
                        "-o", cls.fixtures], check=True, capture_output=True, timeout=300)
        cls.out = os.path.join(d, "out")
        modules = ["sharded_norms:correct"] + [f"sharded_norms:{m}" for m in MUTANTS]
        cmd = [sys.executable, os.path.join(PKG, "dist_runtime.py"), "--fixtures", cls.fixtures,
               "--plans", os.path.join(PKG, "ci_plans.json"), "--out-dir", cls.out,
               "--timing", os.path.join(d, "timing.json")]
        for m in modules:
            cmd += ["--module", m]
        t0 = time.perf_counter()
        cls.run_ = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        cls.wall = time.perf_counter() - t0
        with open(os.path.join(d, "timing.json")) as fh:
            cls.timing = json.load(fh)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def files(self, module):
        d = os.path.join(self.out, module)
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".h5"))

    def test_correct_conforms_on_every_plan(self):
        self.assertEqual(self.run_.returncode, 0, self.run_.stderr[-3000:])
        for f in self.files("correct"):
            with self.subTest(plan=os.path.basename(f)):
                r = check(self.fixtures, f)
                self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-2000:])
        # the results file of a sharded check: the plan leads each case's message
        res = os.path.join(self.tmp.name, "tp4_unequal_f16_stats.json")
        r = check(self.fixtures, os.path.join(self.out, "correct", "tp4_unequal_f16_stats.h5"), "--json", res)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:])
        with open(res) as fh:
            j = json.load(fh)
        self.assertEqual(j["summary"]["PASSED"], 12, j["summary"])
        self.assertTrue(all(c["message"].startswith("shard plan tp=10+30+20+36,stats_reduce=float16")
                            for c in j["cases"]), j["cases"][0])
        runs = [c for c in self.timing["cases"] if c["module"] == "sharded_norms:correct" and c["status"] == "result"]
        self.assertGreaterEqual(len(runs), 150)
        ms = 1e3 * sum(c["seconds"] for c in runs) / len(runs)
        print(f"\ncorrect: {len(runs)} sharded case runs, {ms:.1f} ms per case; start-up "
              f"{sum(s['seconds'] for s in self.timing['startup_s']):.1f} s for ranks of "
              f"{[s['world'] for s in self.timing['startup_s']]}; whole runtime {self.wall:.1f} s "
              f"({len(self.timing['cases'])} case runs, 7 modules)", file=sys.stderr)

    def test_every_mutant_rejected_with_its_diagnosis(self):
        for mutant, (plan, diagnosis) in MUTANTS.items():
            with self.subTest(mutant=mutant):
                rejected = [f for f in self.files(mutant) if check(self.fixtures, f, "--expect-reject").returncode == 0]
                self.assertTrue(rejected, mutant)
                r = check(self.fixtures, os.path.join(self.out, mutant, plan + ".h5"))
                self.assertEqual(r.returncode, 1, r.stdout[-3000:])
                self.assertIn(diagnosis, r.stdout)
        for mutant, (plan, diagnosis) in STATS_MUTANTS.items():
            with self.subTest(mutant=mutant, plan=plan):
                r = check(self.fixtures, os.path.join(self.out, mutant, plan + ".h5"))
                self.assertEqual(r.returncode, 1, r.stdout[-3000:])
                self.assertIn(diagnosis, r.stdout)

    def test_the_alias_agrees_with_check(self):
        r = shard_check("--fixtures", self.fixtures, *self.files("correct"))
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-2000:])
        self.assertNotIn("FAILED", r.stdout)
        r = shard_check("--fixtures", self.fixtures, "--expect-reject", *self.files("sp_grad_averaged"))
        self.assertEqual(r.returncode, 0, r.stdout[-3000:])

    def test_minimax_division_is_exact_for_equal_shards(self):
        r = check(self.fixtures, os.path.join(self.out, "tp_rms_divided_by_world", "tp4.h5"))
        self.assertEqual(r.returncode, 0, r.stdout[-3000:])

    def test_a_dead_hung_or_failing_rank_costs_its_case(self):
        faulty = (("exit_rank1_forward", "CRASHED", "rank 1 of 2 exited with status 3"),
                  ("segv_rank1_forward", "CRASHED", "killed by signal 11 (SIGSEGV)"),
                  ("hang_rank1_forward", "TIMEOUT", "did not answer within 5 s"),
                  ("raise_rank0_forward", "CRASHED", "planted failure on rank 0"))
        out = os.path.join(self.tmp.name, "faulty")
        cmd = [sys.executable, os.path.join(PKG, "dist_runtime.py"), "--fixtures", self.fixtures, "--plan", "tp=2",
               "--cases", "shard_ln_f32_h96_[bf]wd", "--cases", "shard_ln_f32_h96_mean3_bwd",
               "--out-dir", out, "--timeout", "5"]
        for module, _, _ in faulty:
            cmd += ["--module", f"faulty_modules:{module}"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=HERE)
        wall = time.perf_counter() - t0
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        for module, status, message in faulty:
            with self.subTest(module=module):
                res = os.path.join(out, module + ".json")
                c = check(self.fixtures, os.path.join(out, module, "tp_2.h5"), "--json", res)
                self.assertEqual(c.returncode, 1, c.stdout)
                fwd = re.search(r"(\w+) +shard_ln_f32_h96_fwd: shard plan tp=2; (.*)", c.stdout)
                self.assertIsNotNone(fwd, c.stdout)
                self.assertEqual(fwd.group(1), status)
                self.assertIn(message, fwd.group(2))
                self.assertIn("torn down", fwd.group(2))
                # the run went on: the case after it ran on a fresh group and conforms
                with open(res) as fh:
                    self.assertEqual(json.load(fh)["summary"]["PASSED"], 2)
        print(f"\nisolation: 4 modules x 3 cases with 4 groups torn down and restarted: {wall:.1f} s", file=sys.stderr)

    def test_bad_input_is_a_clear_error(self):
        runtime = [sys.executable, os.path.join(PKG, "dist_runtime.py"), "--fixtures", self.fixtures]
        correct = ["--module", "sharded_norms:correct"]
        for extra, words in ((correct + ["--plan", "tp=4,tq=2", "-o", "x.h5"], "unknown key 'tq'"),
                             (correct + ["--plan", "tp=2", "-o", os.path.join(self.out, "correct", "tp2.h5")], "exists"),
                             (["--module", "no_such_module:f", "--plan", "tp=2", "-o", "y.h5"], "no_such_module")):
            r = subprocess.run(runtime + extra, capture_output=True, text=True, timeout=120, cwd=self.tmp.name)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(words, r.stderr)
        # an ordinary outputs file has no shard_plan: the checker says so and exits 2
        plain = os.path.join(self.tmp.name, "plain.h5")
        import h5py
        with h5py.File(plain, "w") as f, h5py.File(self.fixtures, "r") as fx:
            cid = sorted(fx["cases"])[0]
            for k in fx[f"cases/{cid}/expected"]:
                f.create_dataset(f"cases/{cid}/outputs/{k}", data=fx[f"cases/{cid}/expected/{k}"][...])
        r = shard_check("--fixtures", self.fixtures, plain)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("shard_plan", r.stderr)

    @unittest.skipIf(nccl_unavailable(), nccl_unavailable())
    def test_nccl_backend(self):
        """The same runtime on NCCL (README.md, "On a GPU machine"): the correct module conforms on
        every 2-rank plan of the ci tier and the averaging mutant is rejected. Runs only where torch
        has NCCL and two CUDA devices; skipped here, with the reason."""
        out = os.path.join(self.tmp.name, "nccl")
        # the 2-rank plans of the ci tier: NCCL puts one rank per GPU
        with open(os.path.join(PKG, "ci_plans.json")) as fh:
            plans = json.load(fh)
        plans["plans"] = [p for p in plans["plans"] if Plan(p["plan"]).world == 2]
        plans_file = os.path.join(self.tmp.name, "nccl_plans.json")
        with open(plans_file, "w") as fh:
            json.dump(plans, fh)
        cmd = [sys.executable, os.path.join(PKG, "dist_runtime.py"), "--fixtures", self.fixtures, "--backend", "nccl",
               "--plans", plans_file, "--out-dir", out,
               "--module", "sharded_norms:correct", "--module", "sharded_norms:sp_grad_averaged"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        for f in self.files_in(os.path.join(out, "correct")):
            with self.subTest(plan=os.path.basename(f)):
                c = check(self.fixtures, f)
                self.assertEqual(c.returncode, 0, c.stdout[-3000:])
        c = check(self.fixtures, os.path.join(out, "sp_grad_averaged", "sp2.h5"))
        self.assertEqual(c.returncode, 1, c.stdout[-3000:])
        self.assertIn("averaged", c.stdout)

    @staticmethod
    def files_in(d):
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".h5"))

    def test_plans(self):
        p = Plan("tp=10+30+20+36,sp=2,reduce=bfloat16")
        self.assertEqual((p.tp, p.sp, p.world, p.reduce), (4, 2, 8, "bfloat16"))
        lay = p.layout([8, 96], [1])
        self.assertEqual(lay.n_local, [10, 30, 20, 36])
        self.assertEqual(lay.x_slice(5), (slice(4, 8), slice(10, 40)))  # rank 5 = (t 1, s 1)
        p = Plan("tp=2,stats_reduce=float16,flush_subnormals=1")
        self.assertEqual((p.stats_reduce, p.flush_subnormals, p.reduce), ("float16", True, "float32"))
        for bad in ("tp=1", "tp=2,tp=2", "tq=2", "tp=3+0", "sp=2,reduce=float64", "tp=2,stats_reduce=float64",
                    "tp=2,flush_subnormals=yes"):
            with self.assertRaises(PlanError, msg=bad):
                Plan(bad)
        with self.assertRaises(PlanError):
            Plan("tp=10+30").layout([8, 96], [1])
        with self.assertRaises(PlanError):
            Plan("sp=2,sp_dim=1").layout([8, 96], [1])


if __name__ == "__main__":
    unittest.main(verbosity=2)
