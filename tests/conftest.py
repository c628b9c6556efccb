"""Fixtures shared by every test folder (helpers live in grt_test_helpers.py)."""

import sys

import pytest

from grt_test_helpers import REPO, torchrun

# Tests reuse the benchmark scripts' case definitions (benchmarks/parallel_matrix.py).
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture
def run_torchrun():
    return torchrun
