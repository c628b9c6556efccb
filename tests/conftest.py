"""Fixtures shared by every test folder (helpers live in grt_test_helpers.py)."""

import pytest

from grt_test_helpers import torchrun


@pytest.fixture
def run_torchrun():
    return torchrun
