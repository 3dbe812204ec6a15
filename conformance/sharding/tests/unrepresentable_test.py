#!/usr/bin/env python3
"""normcheck check (and its alias normcheck-shard-check) rejects values an output's dtype cannot hold, as for plain outputs
(fixtures/SCHEMA.md, "Outputs files"): in the gathered outputs and in every rank's copy of a
replicated one, unless the file declares wider_values = 1. Sharded outputs files are written here
by hand from the certified values (no ranks needed): the control passes; one value halfway
between the certified bfloat16 (float32) value and the exact one — closer to the exact value, so
inside its allowance, but not a value of the dtype: the final rounding skipped — FAILS, naming
the output (`dweight[copy 1]` for a copy) and the element, with no diagnosis. Needs
NORMCHECK_EXE and NORMCHECK_SHARD_CHECK (ctest sets them)."""
import os
import re
import subprocess
import tempfile
import unittest

import numpy as np

try:
    import h5py
    WHY = ""
except ImportError:
    h5py, WHY = None, "h5py is not available"

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
NORMCHECK = os.environ.get("NORMCHECK_EXE", "")
SHARD_CHECK = os.environ.get("NORMCHECK_SHARD_CHECK", "")

BWD, BWD_PLAN = "shard_ln_bf16_h96_bwd", "sp=2"  # dx gathered; dweight, dbias: one copy per sp rank
FWD, FWD_PLAN = "shard_ln_bf16_h96_fwd", "tp=2"  # y gathered; mean, rstd (float32): one copy per tp rank
REPLICATED = {BWD: ("dweight", "dbias"), FWD: ("mean", "rstd")}


def representable(v, dtype):
    f = np.float64(np.float32(v))
    if f != v:
        return False
    return dtype == "float32" or (int(np.float32(v).view(np.uint32)) & 0xFFFF) == 0


@unittest.skipUnless(h5py and NORMCHECK and SHARD_CHECK, WHY or "NORMCHECK_EXE / NORMCHECK_SHARD_CHECK not set")
class Unrepresentable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.fixtures = os.path.join(cls.tmp.name, "sharded.h5")
        subprocess.run([NORMCHECK, "fixtures", "generate", "--cases", os.path.join(REPO, "fixtures/cases/sharded.json"),
                        "-o", cls.fixtures], check=True, capture_output=True, timeout=300)
        cls.expected, cls.exact, cls.dtype = {}, {}, {}
        with h5py.File(cls.fixtures) as f:
            for cid in (BWD, FWD):
                g = f["cases"][cid]
                for name, ds in g["expected"].items():
                    cls.expected[cid, name] = ds[...].astype(np.float64)
                    cls.exact[cid, name] = g["expected_f64"][name][...].astype(np.float64)
                    dt = ds.attrs["dtype"]
                    cls.dtype[cid, name] = dt.decode() if isinstance(dt, bytes) else str(dt)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def midpoint(self, cid, name):
        """(flat index, value): the first element whose certified value is not the exact one, moved
        halfway towards the exact value (inside its allowance; not a value of the dtype)."""
        v, e = self.expected[cid, name], self.exact[cid, name]
        k = int(np.flatnonzero(v != e)[0])
        m = (v.flat[k] + e.flat[k]) / 2
        self.assertFalse(representable(m, self.dtype[cid, name]), f"{cid} {name}[{k}]: {m!r}")
        self.assertTrue(representable(v.flat[k], self.dtype[cid, name]))
        return k, m

    def write(self, label, cid, plan, altered=(), wider=None):
        """A sharded outputs file of case `cid` under `plan` (SCHEMA.md, "Sharded outputs"), float64
        datasets holding the certified values, except at the midpoint of each dataset in `altered`
        ("outputs/dx", "copies/1/dweight"); `wider`: where to put wider_values = 1 ("root",
        "case" or a dataset path)."""
        path = os.path.join(self.tmp.name, f"{label}.h5")
        ranks = 2
        with h5py.File(path, "w") as out:
            g = out.create_group(f"cases/{cid}")
            g.attrs["shard_plan"] = plan
            for where in ["outputs"] + [f"copies/{k}" for k in range(ranks)]:
                for (c, name), v in self.expected.items():
                    if c != cid or (where != "outputs" and name not in REPLICATED[cid]):
                        continue
                    v = v.copy()
                    if f"{where}/{name}" in altered:
                        k, m = self.midpoint(cid, name)
                        v.flat[k] = m
                    ds = g.create_dataset(f"{where}/{name}", data=v)
                    if wider == f"{where}/{name}":
                        ds.attrs["wider_values"] = 1
            if wider == "root":
                out.attrs["wider_values"] = 1
            elif wider == "case":
                g.attrs["wider_values"] = 1
        return path

    def check(self, path):
        r = subprocess.run([SHARD_CHECK, "--fixtures", self.fixtures, path], capture_output=True, text=True,
                           timeout=120)
        self.assertNotEqual(r.returncode, 2, r.stderr)
        # `normcheck check` judges the sharded file itself, with the same verdict
        c = subprocess.run([NORMCHECK, "check", "--fixtures", self.fixtures, "--outputs", path], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(c.returncode, r.returncode, c.stdout + c.stderr)
        return r.returncode, r.stdout + r.stderr

    def assert_names(self, text, output, cid, name, dtype):
        """`output FAILED: not a <dtype> value: element [..] (flat k) holds <hex>` for the midpoint."""
        k, _ = self.midpoint(cid, name)
        coords = ", ".join(str(int(i)) for i in np.unravel_index(k, self.expected[cid, name].shape))
        line = f"    {output} FAILED: not a {dtype} value: element [{coords}] (flat {k}) holds "
        self.assertRegex(text, re.escape(line) + r"-?0x[0-9a-f.]+p[-+]\d+, which the output's dtype cannot hold")

    def test_control_conforms(self):
        for cid, plan in ((BWD, BWD_PLAN), (FWD, FWD_PLAN)):
            rc, text = self.check(self.write(f"control_{cid}", cid, plan))
            self.assertEqual(rc, 0, text)
            self.assertIn(": 1 PASSED", text)

    def test_gathered_dx(self):
        rc, text = self.check(self.write("dx", BWD, BWD_PLAN, ["outputs/dx"]))
        self.assertEqual(rc, 1, text)
        self.assert_names(text, "dx", BWD, "dx", "bfloat16")
        self.assertIn("store the outputs as bfloat16 values, or declare wider values", text)
        self.assertNotIn("diagnosis:", text)  # malformed for its dtype: never diagnosed

    def test_copy_of_dweight(self):
        rc, text = self.check(self.write("copy1_dweight", BWD, BWD_PLAN, ["copies/1/dweight"]))
        self.assertEqual(rc, 1, text)
        self.assert_names(text, r"dweight[copy 1]", BWD, "dweight", "bfloat16")
        self.assertIn("dweight[copies 0,1] FAILED", text)  # and it differs from copy 0
        self.assertNotIn("    dweight FAILED", text)
        self.assertNotIn("diagnosis:", text)

    def test_copy_of_rstd(self):
        rc, text = self.check(self.write("copy1_rstd", FWD, FWD_PLAN, ["copies/1/rstd"]))
        self.assertEqual(rc, 1, text)
        self.assert_names(text, "rstd[copy 1]", FWD, "rstd", "float32")
        self.assertNotIn("diagnosis:", text)

    def test_copy_0_is_the_gathered_output(self):
        # outputs/dweight right, every copy wrong alike: copy 0 contradicts outputs/ (SCHEMA.md)
        rc, text = self.check(self.write("copies_only", BWD, BWD_PLAN, ["copies/0/dweight", "copies/1/dweight"]))
        self.assertEqual(rc, 1, text)
        self.assertIn("dweight[copy 0] FAILED: copies/0/dweight must hold outputs/dweight bit for bit", text)
        self.assertNotIn("copies 0,1", text)  # the copies agree with each other
        self.assertNotIn("diagnosis:", text)

    def test_wider_values(self):
        # every copy agrees bit for bit, so only the dtype check can fail it
        everywhere = ["outputs/dx", "outputs/dweight", "copies/0/dweight", "copies/1/dweight"]
        rc, text = self.check(self.write("everywhere", BWD, BWD_PLAN, everywhere))
        self.assertEqual(rc, 1, text)
        for output, name in (("dx", "dx"), ("dweight", "dweight"), ("dweight[copy 1]", "dweight")):
            self.assert_names(text, output, BWD, name, "bfloat16")
        self.assertNotIn("copies 0,1", text)
        for wider in ("root", "case"):
            rc, text = self.check(self.write(f"wider_{wider}", BWD, BWD_PLAN, everywhere, wider))
            self.assertEqual(rc, 0, f"wider_values = 1 on the {wider}: {text}")
            self.assertIn(": 1 PASSED", text)
        # declared on outputs/dweight: that output and its copies are judged as stored; dx is not
        rc, text = self.check(self.write("wider_dweight", BWD, BWD_PLAN, everywhere, "outputs/dweight"))
        self.assertEqual(rc, 1, text)
        self.assert_names(text, "dx", BWD, "dx", "bfloat16")
        self.assertIsNone(re.search(r"^    dweight.* FAILED", text, re.M), text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
