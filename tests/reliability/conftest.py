"""Fixtures of the reliability tests (helpers live in reliability_helpers.py)."""

from __future__ import annotations

import pytest

from reliability_helpers import NOISE_OFF, output, train


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """`uninterrupted(noise)`: the folder of a 2-rank run of all STEPS steps, made once per session."""
    runs = {}

    def get(noise: bool):
        if noise not in runs:
            run = tmp_path_factory.mktemp("uninterrupted") / ("noise" if noise else "no_noise")
            proc = train(2, run, *([] if noise else NOISE_OFF))
            assert proc.returncode == 0, output(proc)[-3000:]
            runs[noise] = run
        return runs[noise]

    return get
