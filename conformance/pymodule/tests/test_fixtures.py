"""normcheck.fixtures: a tier's case list evaluated on demand, a generated file read back, a
case saved and reopened, and the pytest plugin over a tier."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import normcheck


def test_tier_cases_on_demand_and_check():
    cases = normcheck.fixtures.generate("smoke")
    assert cases.tier == "smoke" and len(cases) > 20
    case = cases["ln_f32_normal"]
    assert case.attributes["op"] == "layernorm" and case.inputs["x"].shape == (4, 64)
    assert case.check(case.expected).verdict == "PASSED"
    assert cases.attributes("rms_f32_normal")["op"] == "rmsnorm"


def test_generate_file_equals_cases_on_demand(tmp_path):
    src = json.load(open(normcheck.fixtures.tier_path("smoke")))
    small = dict(src, tier="tiny", cases=[c for c in src["cases"] if c.get("id") == "rms_f32_offset1"])
    lst = tmp_path / "tiny.json"
    lst.write_text(json.dumps(small))
    f = normcheck.fixtures.generate(cases=lst, output=tmp_path / "tiny.h5", progress=False)
    assert f.case_ids == ["rms_f32_offset1"] and "--cases" in f.provenance["command"]
    a, b = f["rms_f32_offset1"], normcheck.fixtures.generate(cases=lst)["rms_f32_offset1"]
    assert all(np.array_equal(a.expected[k], b.expected[k]) for k in a.dtypes)
    try:
        normcheck.fixtures.generate(cases=lst, output=tmp_path / "tiny.h5", progress=False)
        raise AssertionError("an existing file was replaced")
    except normcheck.FixtureError as e:
        assert "exist" in str(e)


def test_case_save_roundtrip(tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    case = normcheck.reference("rmsnorm", x, eps=1e-6, id="mine")
    case.save(tmp_path / "mine.h5")
    back = normcheck.fixtures.open(tmp_path / "mine.h5")["mine"]
    assert np.array_equal(back.inputs["x"], x) and np.array_equal(back.expected["y"], case.expected["y"])
    cli = os.environ.get("NORMCHECK_CLI")
    if cli:  # the CLI reads it and recomputes the same certified values
        p = subprocess.run([cli, "fixtures", "verify", str(tmp_path / "mine.h5")], capture_output=True, text=True)
        assert p.returncode == 0 and "0 differences" in p.stdout, p.stdout + p.stderr


def test_pytest_plugin_over_a_tier(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["normcheck.pytest_plugin"]\n')
    (tmp_path / "test_k.py").write_text(
        "import pytest\n"
        "@pytest.mark.normcheck(op='rmsnorm', direction='forward', dtype_x='float32', match='normal')\n"
        "def test_expected(normcheck_case):\n"
        "    assert normcheck_case.check(normcheck_case.expected).passed\n")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v",
                        "--normcheck-tier", "smoke", str(tmp_path)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "test_expected[rms_f32_normal] PASSED" in p.stdout, p.stdout


def test_pytest_plugin_leaves_quantized_cases_out_unless_asked(tmp_path):
    # The smoke tier holds quantized cases (outputs q, scale): a test of y never gets them; a
    # marker that names `quant` does.
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["normcheck.pytest_plugin"]\n')
    (tmp_path / "test_q.py").write_text(
        "import pytest\n"
        "@pytest.mark.normcheck(op='rmsnorm', direction='forward')\n"
        "def test_y(normcheck_case):\n"
        "    assert normcheck_case.attributes['quant'] is None\n"
        "@pytest.mark.normcheck(quant='vllm_static_fp8')\n"
        "def test_q(normcheck_case):\n"
        "    assert 'q' in normcheck_case.dtypes\n")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v",
                        "--normcheck-tier", "smoke", str(tmp_path)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "test_y[rms_f32_normal] PASSED" in p.stdout, p.stdout
    assert "test_y[q_" not in p.stdout, p.stdout
    assert "test_q[q_vllm_static_fp8_bfloat16_normal] PASSED" in p.stdout, p.stdout
    assert "test_q[q_vllm_static_fp8_bf16_nan_row] PASSED" in p.stdout, p.stdout


def test_generate_writes_the_cli_bytes(tmp_path):
    import shutil
    import pytest
    cli = os.environ.get("NORMCHECK_CLI") or shutil.which("normcheck")
    if not cli:
        pytest.skip("no normcheck CLI (NORMCHECK_CLI)")
    src = json.load(open(normcheck.fixtures.tier_path("smoke")))
    (tmp_path / "tiny.json").write_text(json.dumps(dict(src, tier="tiny", cases=[
        c for c in src["cases"] if c.get("id") in ("rms_f32_offset1", "rms_bf16_llama")])))
    subprocess.run([cli, "fixtures", "generate", "--cases", "tiny.json", "-o", "cli.h5"], cwd=tmp_path,
                   check=True, capture_output=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        normcheck.fixtures.generate(cases="tiny.json", output="py.h5", progress=False)
    finally:
        os.chdir(cwd)
    assert (tmp_path / "cli.h5").read_bytes() == (tmp_path / "py.h5").read_bytes()


def _tiny_list(tmp_path):
    src = json.load(open(normcheck.fixtures.tier_path("smoke")))
    ids = ("rms_f32_offset1",)
    lst = tmp_path / "tiny.json"
    lst.write_text(json.dumps(dict(src, tier="tiny", cases=[c for c in src["cases"] if c.get("id") in ids])))
    return lst


def _generate_in_child(tmp_path, name, stderr_tty, progress="None"):
    """Runs fixtures.generate in a child whose stderr is a pseudo-terminal (or a pipe); returns
    what it wrote to stderr."""
    import pty

    code = (f"import normcheck; normcheck.fixtures.generate(cases={str(_tiny_list(tmp_path))!r}, "
            f"output={str(tmp_path / name)!r}, progress={progress})")
    if not stderr_tty:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stderr
    try:
        master, slave = pty.openpty()
    except OSError as e:  # a container without /dev/ptmx or /dev/pts
        pytest.skip(f"no pseudo-terminal to test the progress bar on: {e}")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(timeout=120) == 0, out
    return out.decode(errors="replace")


def test_generate_progress_bar_on_a_terminal_only(tmp_path):
    bar = _generate_in_child(tmp_path, "a.h5", stderr_tty=True)
    assert "[" + "=" * 30 + "] 1/1 rms_f32_offset1" in bar, repr(bar)
    assert "] 1/1" not in _generate_in_child(tmp_path, "b.h5", stderr_tty=False)
    assert "] 1/1" not in _generate_in_child(tmp_path, "c.h5", stderr_tty=True, progress="False")


def test_quantized_case_is_judged_and_diagnosed():
    # A fused norm + quantization case: codes judged as `normcheck check` judges them
    # (TOLERANCE.md section 10), a failure diagnosed by the quantization dialects (class H).
    cases = normcheck.fixtures.generate("quant")
    case = cases["q_ocp_mxfp8_e5m2_bfloat16_normal"]  # MX E5M2: u up to 2^16
    assert case.check(case.expected).verdict == "PASSED"
    q = np.array(case.expected["q"])
    mag = q.astype(np.int64) & 0x7F
    assert (mag > 0x5F).any(), "the case has E5M2 values above 448"
    clamped = np.where(mag > 0x5F, (q.astype(np.int64) & 0x80) | 0x5F, q)  # 0x5F: E5M2's 448
    r = case.check(dict(case.expected, q=clamped))
    assert r.verdict == "FAILED"
    assert r.diagnosis[0].dialect == "e5m2_clamped_448" and r.diagnosis[0].explains
