"""grt_titan/model/step_stats.py: the sums of one StepRecord and the statistics from summed
rows, against a numpy float64 computation written from the definitions."""

import math

import numpy as np
import pytest
import torch

from grt_titan.model.recurrence import StepRecord
from grt_titan.model.step_stats import (
    STATISTICS,
    SUMS,
    TRAINING_STATISTICS,
    TRAINING_SUMS,
    step_row,
    summarize,
)


def random_record(seed: int, shape=(2, 5, 8), index=1, depth=2) -> StepRecord:
    """A step with h_new = g h + (1 - g) o and gates on both sides of the saturation thresholds."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(shape, generator=gen)
    o = 3 * torch.randn(shape, generator=gen)
    g = torch.sigmoid(4 * torch.randn(shape, generator=gen))
    return StepRecord(index, depth, h, g * h + (1 - g) * o, g, o)


def hand_sums(record: StepRecord) -> dict[str, float]:
    h, h_new, g, o = (
        t.numpy().astype(np.float64) for t in (record.state, record.new_state, record.gate, record.proposal)
    )
    delta = h_new - h
    tok = lambda x: np.sqrt((x * x).sum(-1))  # noqa: E731  per-token L2 norms
    return {
        "count": g.size,
        "gate": g.sum(),
        "gate_sq": (g * g).sum(),
        "copy": (g > 0.95).sum(),
        "write": (g < 0.05).sum(),
        "update_sq": (delta * delta).sum(),
        "proposal_delta_sq": ((o - h) ** 2).sum(),
        "state_sq": (h * h).sum(),
        "tokens": g.size // g.shape[-1],
        "update_norm": tok(delta).sum(),
        "proposal_norm": tok(o).sum(),
        "state_cosine": ((h_new * h).sum(-1) / (tok(h_new) * tok(h))).sum(),
        "proposal_cosine": ((o * h).sum(-1) / (tok(o) * tok(h))).sum(),
    }


def hand_statistics(s: dict[str, float]) -> dict[str, float]:
    mean = s["gate"] / s["count"]
    return {
        "gate_mean": mean,
        "gate_std": math.sqrt(s["gate_sq"] / s["count"] - mean**2),
        "gate_copy_frac": s["copy"] / s["count"],
        "gate_write_frac": s["write"] / s["count"],
        "update_ratio": math.sqrt(s["update_sq"] / s["proposal_delta_sq"]),
        "update_norm": s["update_norm"] / s["tokens"],
        "proposal_norm": s["proposal_norm"] / s["tokens"],
        "state_cosine": s["state_cosine"] / s["tokens"],
        "proposal_cosine": s["proposal_cosine"] / s["tokens"],
        "relative_update": math.sqrt(s["update_sq"] / s["state_sq"]),
    }


def test_row_equals_hand_sums():
    record = random_record(0)
    row = step_row(record)
    assert row.dtype == torch.float64 and row.shape == (len(SUMS),)
    want = hand_sums(record)
    assert 0 < want["copy"] < want["count"] and 0 < want["write"] < want["count"]  # informative fixture
    for name, got in zip(SUMS, row.tolist()):
        # float32 inputs, float32 norms, float64 accumulation: ~1e-7 relative.
        assert got == pytest.approx(want[name], rel=1e-5), name
    # The training row is the prefix of the full one, computed the same way.
    training = step_row(record, full=False)
    assert training.shape == (len(TRAINING_SUMS),) and SUMS[: len(TRAINING_SUMS)] == TRAINING_SUMS
    assert torch.equal(training, row[: len(TRAINING_SUMS)])


def test_summary_of_summed_rows_pools_batches():
    a, b = random_record(1), random_record(2, shape=(3, 4, 8))
    rows = torch.stack([step_row(a) + step_row(b), torch.zeros(len(SUMS), dtype=torch.float64)])
    # Step 2 was never reached (count 0): the summary stops after step 1.
    (got,) = summarize(rows)
    assert tuple(got) == STATISTICS
    sa, sb = hand_sums(a), hand_sums(b)
    want = hand_statistics({k: sa[k] + sb[k] for k in sa})
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5), key
    (training,) = summarize(rows[:, : len(TRAINING_SUMS)])
    assert tuple(training) == TRAINING_STATISTICS
    assert training == {k: got[k] for k in TRAINING_STATISTICS}


def test_row_of_a_bfloat16_step_stays_float64():
    record = random_record(3)
    bf16 = StepRecord(1, 1, *(t.bfloat16() for t in (record.state, record.new_state, record.gate, record.proposal)))
    row = step_row(bf16)
    assert row.dtype == torch.float64 and torch.isfinite(row).all()
    assert row[SUMS.index("count")].item() == record.gate.numel()
