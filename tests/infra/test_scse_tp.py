"""SCSE under tensor parallelism (grt_titan/infra/parallelize.py, `apply_scse_tp`): the
zero-deviation mask of eq. 4 is per whole sequence, which TP shards. Its training parity on
FSDP 2 x TP 2 with compile is in test_method_parity.py; a training run never meets a zero
deviation, so this case plants one on one shard."""

import json

import pytest

from grt_test_helpers import worker_env


@pytest.mark.slow
def test_the_mask_sums_over_the_whole_sequence_under_tp(run_torchrun, tmp_path):
    out = tmp_path / "scse_tp.json"
    env = worker_env(__file__)  # the worker imports its folder's helpers and grt_test_helpers
    proc = run_torchrun(2, [str(out)], tmp_path, timeout=300, module="scse_tp_worker", env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(out.read_text())
    assert result["max_difference"] == 0.0  # the single-process step, bitwise
    assert result["sequence_0_second_half_moved"] and result["sequence_1_still"]
    assert result["plain_tensor"]  # the local shard back, as every step part returns
