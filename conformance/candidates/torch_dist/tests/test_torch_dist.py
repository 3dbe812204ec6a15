#!/usr/bin/env python3
"""The torch.distributed runtime on real gloo ranks: the bundled correct TP/SP norms conform on
every plan of ci_plans.json (2 and 4 ranks, equal and unequal shards, float32 and bfloat16
gradient all-reduce), every mutant is rejected with its diagnosis, and a rank that dies, hangs
or raises costs its case only. Needs NORMCHECK_EXE and NORMCHECK_SHARD_CHECK (ctest sets them)."""
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


def shard_check(*args):
    return subprocess.run([SHARD_CHECK, *args], capture_output=True, text=True, timeout=300)


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
        r = shard_check("--fixtures", self.fixtures, *self.files("correct"))
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-2000:])
        self.assertNotIn("FAILED", r.stdout)
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
                r = shard_check("--fixtures", self.fixtures, "--expect-reject", *self.files(mutant))
                self.assertEqual(r.returncode, 0, r.stdout[-3000:])
                r = shard_check("--fixtures", self.fixtures, os.path.join(self.out, mutant, plan + ".h5"))
                self.assertEqual(r.returncode, 1, r.stdout[-3000:])
                self.assertIn(diagnosis, r.stdout)

    def test_minimax_division_is_exact_for_equal_shards(self):
        r = shard_check("--fixtures", self.fixtures, os.path.join(self.out, "tp_rms_divided_by_world", "tp4.h5"))
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
                c = shard_check("--fixtures", self.fixtures, os.path.join(out, module, "tp_2.h5"))
                self.assertEqual(c.returncode, 1, c.stdout)
                fwd = re.search(r"shard_ln_f32_h96_fwd \[tp=2\]: (\w+) (.*)", c.stdout)
                self.assertIsNotNone(fwd, c.stdout)
                self.assertEqual(fwd.group(1), status)
                self.assertIn(message, fwd.group(2))
                self.assertIn("torn down", fwd.group(2))
                # the run went on: the case after it ran on a fresh group and conforms
                self.assertIn("2 PASSED", c.stdout)
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

    def test_plans(self):
        p = Plan("tp=10+30+20+36,sp=2,reduce=bfloat16")
        self.assertEqual((p.tp, p.sp, p.world, p.reduce), (4, 2, 8, "bfloat16"))
        lay = p.layout([8, 96], [1])
        self.assertEqual(lay.n_local, [10, 30, 20, 36])
        self.assertEqual(lay.x_slice(5), (slice(4, 8), slice(10, 40)))  # rank 5 = (t 1, s 1)
        for bad in ("tp=1", "tp=2,tp=2", "tq=2", "tp=3+0", "sp=2,reduce=float64"):
            with self.assertRaises(PlanError, msg=bad):
                Plan(bad)
        with self.assertRaises(PlanError):
            Plan("tp=10+30").layout([8, 96], [1])
        with self.assertRaises(PlanError):
            Plan("sp=2,sp_dim=1").layout([8, 96], [1])


if __name__ == "__main__":
    unittest.main(verbosity=2)
