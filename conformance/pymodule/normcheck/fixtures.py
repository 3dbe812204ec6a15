"""Golden cases from Python: a fixture file (normcheck.fixtures.open) or a tier's case list
(normcheck.fixtures.generate), each case a normcheck.Case with inputs, expected outputs,
attributes and check(outputs)."""
import os
import sys

import normcheck
from normcheck import _core

TIERS = ("smoke", "ci", "nightly")


def _installed_cases_dir():
    """<prefix>/share/normcheck/cases for a package installed in <prefix>/lib/python3.X/dist-packages."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "..", "share", "normcheck", "cases"))


def tier_path(tier):
    """The case list of a tier: $NORMCHECK_CASES_DIR, the install's share/normcheck/cases, or the
    source tree the module was built from; FixtureError naming where it looked otherwise."""
    dirs = [d for d in (os.environ.get("NORMCHECK_CASES_DIR"), _installed_cases_dir()) if d]
    return _core.tier_path(str(tier), dirs)


class FixtureFile:
    """A fixture file, read lazily: ``case_ids``, ``provenance``, ``file[case_id]`` -> Case,
    iteration over every case in id order. Checksums are verified as each case is read."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"path: no fixture file {self.path!r}")
        self._file = _core.FixtureFile(self.path)

    case_ids = property(lambda self: list(self._file.case_ids))
    provenance = property(lambda self: self._file.provenance)

    def __len__(self):
        return len(self._file.case_ids)

    def __getitem__(self, case_id):
        return normcheck.Case(self._file.read(str(case_id)))

    def __iter__(self):
        for cid in self._file.case_ids:
            yield self[cid]

    def __repr__(self):
        return f"<normcheck.fixtures.FixtureFile {self.path!r}: {len(self)} cases>"


def open(path):  # noqa: A001  (the module's verb, as in h5py.File / tarfile.open)
    """Opens a fixture file (fixtures/SCHEMA.md) -> FixtureFile."""
    return FixtureFile(path)


class CaseList:
    """A tier's (or a user's) case list: ``case_ids`` at once, each case's inputs drawn and its
    outputs certified by the reference only when it is asked for (``cases[case_id]``)."""

    def __init__(self, path, seed=1):
        self.path, self.seed = os.fspath(path), int(seed)
        self._list = _core.CaseList(self.path)

    tier = property(lambda self: self._list.tier)
    case_ids = property(lambda self: list(self._list.case_ids))

    def __len__(self):
        return len(self._list.case_ids)

    def __getitem__(self, case_id):
        return normcheck.Case(self._list.case(str(case_id), self.seed))

    def attributes(self, case_id):
        """The case's attributes (op, dtypes, ...) without drawing its inputs."""
        return self._list.attributes(str(case_id))

    def __iter__(self):
        for cid in self._list.case_ids:
            yield self[cid]


def generate(tier=None, *, cases=None, output=None, seed=1, threads=0, overwrite=False, progress=None):
    """A tier's golden cases (tier "smoke" | "ci" | "nightly", or cases=PATH of a case list).

    Without output: a CaseList whose cases are evaluated one at a time as they are read (no
    file). With output=PATH: writes the fixture file as `normcheck fixtures generate` does
    (a progress bar on stderr when it is a terminal; progress=False hides it) and returns it
    opened (FixtureFile); an existing file is replaced only with overwrite=True."""
    if (tier is None) == (cases is None):
        raise ValueError("tier: give exactly one of tier and cases")
    path = tier_path(tier) if tier is not None else os.fspath(cases)
    if output is None:
        return CaseList(path, seed)
    # The command that regenerates this content, as the CLI records it (output path and thread
    # count left out: they do not change it), so that both make byte-identical files.
    command = f"normcheck fixtures generate {'--tier ' + tier if tier else '--cases ' + path} --seed {seed}"
    show = sys.stderr.isatty() if progress is None else bool(progress)
    _core.generate(path, os.fspath(output), int(seed), int(threads), bool(overwrite), command, show)
    return FixtureFile(output)
