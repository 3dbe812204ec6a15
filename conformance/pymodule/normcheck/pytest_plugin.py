"""The normcheck pytest plugin: a ``normcheck_case`` fixture parametrized over the golden cases
of a tier or a fixture file, with the case ids as test ids.

Enable it in a conftest.py (pytest has no entry point for a package installed by CMake):

    pytest_plugins = ["normcheck.pytest_plugin"]

or on the command line with ``-p normcheck.pytest_plugin``. Options:

    --normcheck-tier TIER        the tier's cases (smoke, ci, nightly; default smoke), drawn and
                                 certified as each test runs (no file)
    --normcheck-fixtures PATH    the cases of a fixture file instead
    --normcheck-seed N           the seed of a tier's inputs (default 1, the CLI's)

A test narrows the cases with a marker: ``@pytest.mark.normcheck(op="rmsnorm",
direction="forward", dtype_x="float32", match=r"_h4096_")``: each keyword but ``match`` (a
regular expression searched in the case id) must equal the case's attribute of that name, or be
one of a tuple of values (``dtype_x=("float32", "float64")``). Quantized cases (outputs ``q``
and ``scale``: the smoke and ci tiers hold some) are left out unless a marker names ``quant``
(``quant="vllm_static_fp8"``, the preset, else the code format; ``quant=None`` is the default's
unquantized cases): a kernel that writes y cannot be judged on them.
"""
import re

import pytest

import normcheck
from normcheck import fixtures


def pytest_addoption(parser):
    group = parser.getgroup("normcheck", "normcheck golden cases")
    group.addoption("--normcheck-tier", default=None, help="tier of the normcheck_case fixture (default smoke)")
    group.addoption("--normcheck-fixtures", default=None, help="fixture file of the normcheck_case fixture")
    group.addoption("--normcheck-seed", type=int, default=1, help="seed of a tier's inputs (default 1)")


def pytest_configure(config):
    config.addinivalue_line("markers", "normcheck(match=REGEX, **attributes): the normcheck cases a test takes")


_SOURCES = {}


def _source(config):
    """The cases of this session: a FixtureFile or a CaseList (one per session)."""
    path, tier = config.getoption("normcheck_fixtures"), config.getoption("normcheck_tier")
    if path and tier:
        raise pytest.UsageError("normcheck: give one of --normcheck-tier and --normcheck-fixtures")
    key = ("file", path) if path else ("tier", tier or "smoke", config.getoption("normcheck_seed"))
    if key not in _SOURCES:
        try:
            _SOURCES[key] = (fixtures.open(path) if path
                             else fixtures.CaseList(fixtures.tier_path(key[1]), key[2]))
        except (normcheck.FixtureError, OSError) as e:
            raise pytest.UsageError(f"normcheck: {e}")
    return _SOURCES[key]


def _attributes(source, case_id):
    if isinstance(source, fixtures.CaseList):
        return source.attributes(case_id)
    return source[case_id].attributes  # a fixture file: the case is read


def _matches(value, wanted):
    """A marker keyword matches an attribute equal to it, or one of a list/tuple/set of values."""
    return value in wanted if isinstance(wanted, (list, tuple, set, frozenset)) else value == wanted


def pytest_generate_tests(metafunc):
    if "normcheck_case" not in metafunc.fixturenames:
        return
    source = _source(metafunc.config)
    ids = source.case_ids
    marks = list(metafunc.definition.iter_markers("normcheck"))
    if not any("quant" in m.kwargs for m in marks):  # no quantized case unless asked for
        ids = [i for i in ids if _attributes(source, i).get("quant") is None]
    for mark in marks:
        want = dict(mark.kwargs)
        match = want.pop("match", None)
        if match is not None:
            ids = [i for i in ids if re.search(match, i)]
        if want:
            unknown = set(want) - set(_attributes(source, ids[0]) if ids else want)
            if unknown:
                raise pytest.UsageError(f"normcheck marker: unknown case attribute(s) {sorted(unknown)}")
            attrs = {i: _attributes(source, i) for i in ids}  # one read per case
            ids = [i for i in ids if all(_matches(attrs[i].get(k), v) for k, v in want.items())]
    metafunc.parametrize("normcheck_case", ids, ids=ids, indirect=True)


@pytest.fixture
def normcheck_case(request):
    """A golden case (normcheck.Case): inputs, attributes, expected outputs, check(outputs)."""
    return _source(request.config)[request.param]
