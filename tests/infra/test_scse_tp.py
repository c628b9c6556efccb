"""SCSE under tensor parallelism (grt_titan/infra/parallelize.py, `apply_scse_tp`): the
zero-deviation mask of eq. 4 is per whole sequence, which TP shards. Its training parity on
FSDP 2 x TP 2 with compile is in test_method_parity.py; a training run never meets a zero
deviation, so this case plants one on one shard."""

import pytest

from grt_test_helpers import worker_result


@pytest.mark.slow
def test_the_mask_sums_over_the_whole_sequence_under_tp(tmp_path):
    result = worker_result(__file__, "scse_tp_worker", tmp_path)
    assert result["max_difference"] == 0.0  # the single-process step, bitwise
    assert result["sequence_0_second_half_moved"] and result["sequence_1_still"]
    assert result["plain_tensor"]  # the local shard back, as every step part returns
