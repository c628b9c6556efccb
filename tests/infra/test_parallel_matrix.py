"""The corners of the parallel-combination matrix (benchmarks/parallel_matrix.py) in CI.

The whole product (36 cases, ~15 min on 2 cores) is a benchmark script whose table is in
docs/parallelism.md; CI runs the corners: the largest TP with compile and full AC, and float8
TP with selective AC. TP 2 + compile + every AC mode is tests/infra/test_tp_compile_ac.py;
the presets' own layouts are tests/infra/test_presets.py.
"""

import pytest
import torch

from benchmarks.parallel_matrix import CASES, run_case, runnable_here
from grt_test_helpers import launch

CORNERS = ["tp4-compile-ac_full-bf16", "tp4-eager-ac_selective-float8"]


def test_matrix_is_the_full_product():
    assert len(CASES) == 3 * 2 * 3 * 2
    assert set(CORNERS) <= set(CASES)
    # float8 under compile needs an SM89+ GPU: torchtitan's emulation is eager-only.
    assert runnable_here("tp2-compile-ac_full-float8") == torch.cuda.is_available()
    assert runnable_here("tp2-eager-ac_full-float8") and runnable_here("tp2-compile-ac_full-bf16")


@pytest.mark.slow
@pytest.mark.parametrize("name", CORNERS)
def test_matrix_corner_steps(name, tmp_path):
    result = run_case(name, str(tmp_path / name), runner=launch)
    assert result["returncode"] == 0, result["output"][-4000:]
    assert 5 < result["loss"] < 12  # one step of a fresh model on GPT-2's vocabulary (ln 50257 = 10.8)
    if "float8" in name:
        assert "Applied Float8 tensorwise Tensor Parallelism to the GRT" in result["output"]
