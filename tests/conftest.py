"""Fixtures shared by every test folder (helpers live in grt_test_helpers.py)."""

import shutil
import sys
from pathlib import Path

import pytest

from grt_test_helpers import REPO, torchrun

# `tests.launcher`, `tests.cases` and the job modules (`tests.<folder>.<worker>`) import from here.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture
def run_torchrun():
    return torchrun


@pytest.fixture(scope="module")
def module_tmp(request, tmp_path_factory):
    """`module_tmp(name)`: a new folder, as `tmp_path_factory.mktemp(name)`, for runs that a
    module's tests share; removed once the module is done unless one of its tests failed.
    Why: the suite's checkpoints add up to ~8 GB and CI's disk is shared; pyproject's
    `tmp_path_retention_policy = "failed"` does the same for each test's `tmp_path`."""
    made: list[Path] = []
    failed_before = request.session.testsfailed

    def make(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield make
    if request.session.testsfailed == failed_before:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
