"""The corners of the parallel-combination matrix (tests/cases.py MATRIX_CASES) in CI.

The whole product (36 cases) is benchmarks/parallel_matrix.py, whose table is in
docs/results/parallelism_matrix.md; CI runs the corners: the largest TP with compile and full AC, and float8
TP with selective AC, one step each on 8 fake-backend ranks. Collectives move no data there,
so the step's numbers mean nothing: the tests check what ran (plans, compile, AC, float8),
not the loss. TP 2 + compile + every AC mode is tests/infra/test_tp_compile_ac.py; the
presets' own layouts are tests/infra/test_presets.py.
"""

import pytest
import torch

from grt_test_helpers import mesh_degrees, step_losses
from tests.cases import MATRIX_CASES, MATRIX_WORLD_SIZE, matrix_case_args, runnable_here
from tests.launcher import fake_backend_env, launch

CORNERS = ["tp4-compile-ac_full-bf16", "tp4-eager-ac_selective-float8"]


def test_matrix_is_the_full_product():
    assert len(MATRIX_CASES) == 3 * 2 * 3 * 2
    assert set(CORNERS) <= set(MATRIX_CASES)
    # float8 under compile needs an SM89+ GPU: torchtitan's emulation is eager-only.
    assert runnable_here("tp2-compile-ac_full-float8") == torch.cuda.is_available()
    assert runnable_here("tp2-eager-ac_full-float8") and runnable_here("tp2-compile-ac_full-bf16")


@pytest.mark.slow
@pytest.mark.parametrize("name", CORNERS)
def test_matrix_corner_steps(name, tmp_path):
    # The benchmark compiles with inductor; here the path before its C++ code generation
    # (tests/infra/test_tp_compile_ac.py says why that path holds the plans' defects).
    args = matrix_case_args(name, str(tmp_path / name), compile_backend="aot_eager_decomp_partition")
    proc = launch("grt_titan.train", args, fake_backend_env(MATRIX_WORLD_SIZE), timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert list(step_losses(output)) == [1], output[-2000:]
    tp = MATRIX_CASES[name][0]
    degrees = mesh_degrees(output)
    assert degrees and (degrees["dp_shard"], degrees["tp"]) == (MATRIX_WORLD_SIZE // tp, tp), output[-2000:]
    if "compile" in name:
        assert "Compiling each TransformerBlock with torch.compile" in output
    assert f"Applied {MATRIX_CASES[name][2]} activation checkpointing to the model" in output
    if "float8" in name:
        assert "Applied Float8 tensorwise Tensor Parallelism to the GRT" in output
