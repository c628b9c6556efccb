"""Loss-spike rewind and corrupted checkpoints, end to end on 2 CPU ranks (gloo) under
torchrun: one run meets a planted spike, rewinds by itself (`--max-restarts=1`) and
finishes; then a byte of its newest checkpoint is flipped and the extended run resumes from
the checkpoint before it. The pieces in process: tests/components/test_loss_spike.py,
tests/components/test_checkpoint.py."""

from __future__ import annotations

import json

import pytest

from grt_test_helpers import flip_byte
from reliability_helpers import NOISE_OFF, output, records, train

SPIKE_STEP, SKIP = 5, 2
GLOBAL_BATCH = 4  # 2 ranks x local_batch_size 2
SPIKE = [
    "--loss_spike.enable",
    "--loss_spike.window",
    "2",
    "--loss_spike.skip_batches",
    str(SKIP),
    "--loss_spike.max_rewinds",
    "1",
    "--checkpoint.no-last_save_model_only",
]


@pytest.mark.slow
def test_spike_is_rewound_and_skipped_then_a_corrupted_checkpoint_is_passed_over(tmp_path):
    run, seen = tmp_path / "spike", tmp_path / "seen"
    env = {"GRT_TEST_SPIKE_STEP": str(SPIKE_STEP), "GRT_TEST_RECORD_DIR": str(seen)}
    proc = train(2, run, *NOISE_OFF, *SPIKE, env=env, max_restarts=1, timeout=420)
    out = output(proc)
    assert proc.returncode == 0, out[-3000:]
    assert f"step {SPIKE_STEP}: training loss" in out and "is a spike" in out
    assert "Training starts at step 5" in out  # the restart loaded step-4

    log = json.loads((run / "checkpoint" / "loss_spikes.json").read_text())
    (entry,) = log["rewinds"]
    start = (SPIKE_STEP - 1) * GLOBAL_BATCH
    window = (start, start + SKIP * GLOBAL_BATCH)
    assert entry["step"] == SPIKE_STEP and entry["skip_positions"] == list(window) and log["gave_up"] is None
    got = records(seen)
    first = {(d, g) for name in ("rank0-attempt0", "rank1-attempt0") for s, d, g in got[name] if s == SPIKE_STEP}
    assert first == set(zip(range(start, start + GLOBAL_BATCH), entry["skip_sequences"][:GLOBAL_BATCH]))
    assert len(entry["skip_sequences"]) == SKIP * GLOBAL_BATCH
    after = sorted((s, d) for name in ("rank0-attempt1", "rank1-attempt1") for s, d, g in got[name] if s >= 5)
    # steps 5 and 6 of the restart read the positions right after the window, none twice
    assert after == [(5 + (d - window[1]) // GLOBAL_BATCH, d) for d in range(window[1], window[1] + 2 * GLOBAL_BATCH)]
    skipped = set(entry["skip_sequences"])
    assert not skipped & {g for name in ("rank0-attempt1", "rank1-attempt1") for s, d, g in got[name] if s >= 5}

    # A silently corrupted shard of the newest checkpoint: the extended run names it and
    # resumes from step-4, and the spike's window stays skipped.
    flip_byte(run / "checkpoint" / "step-6" / "__1_0.distcp")
    seen_again = tmp_path / "seen_again"
    proc = train(2, run, *NOISE_OFF, *SPIKE, "--training.steps", "7", env={"GRT_TEST_RECORD_DIR": str(seen_again)})
    out = output(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "step-6 (step 6) is corrupted: __1_0.distcp: crc32" in out
    assert f"Resuming from checkpoint {run / 'checkpoint' / 'step-4'} (step 4)" in out
    assert "Training starts at step 5" in out
    again = records(seen_again)
    step5 = sorted(d for name in ("rank0-attempt0", "rank1-attempt0") for s, d, g in again[name] if s == 5)
    assert step5 == list(range(window[1], window[1] + GLOBAL_BATCH))
