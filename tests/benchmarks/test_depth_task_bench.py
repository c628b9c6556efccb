"""benchmarks/depth_task_bench.py's summary of eval-task results (no training here: the rows
train through torchrun for minutes): accuracy at r = 1 / R / 2R per depth, arrival, and each
halting row's table as eval-task prints it; and the commands each row runs."""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from grt_titan.analysis.task_eval import halting_summary, halting_table

from grt_test_helpers import import_benchmark


@pytest.fixture
def bench(monkeypatch):
    yield from import_benchmark(monkeypatch, "depth_task_bench")


def test_summary_has_each_rows_cells_arrival_and_eval_tasks_halting_table(bench):
    correct = [{1: False, 2: True}, {1: True, 2: True}]  # two problems of depths 2 and 1
    halting = halting_summary([2, 1], [(True, 1.5), (True, 1.0)], correct, "kl", 0.01)
    grt = {"1": {"1": 1.0, "2": 1.0, "4": 1.0}, "2": {"1": 0.0, "2": 1.0, "4": 1.0}}
    results = [
        {"row": "grt", "steps": 10, "train_s": 3.0, "eval": {"accuracy": grt, "arrival": {"2": [2]}}},
        {"row": "dense", "steps": 12, "train_s": 4.0, "eval": {"accuracy": {"1": {"dense": 0.5}, "2": {}}}},
    ]
    results[0]["eval"]["halting"] = [halting]
    text = bench.summary(results, range(1, 3), recurrences=2)
    assert "| grt | 10 | 3 | 1.00/1.00/1.00 | 0.00/1.00/1.00 |" in text
    assert "| dense | 12 | 4 | 0.50 | - |" in text
    assert "| grt | d2: 2.0 (1/1) |" in text
    assert text.endswith("Halting, grt:\n\n" + halting_table([halting]))
    assert "Halting, dense" not in text and halting["steps_saved"] == 1 - 1.25 / 2


def test_each_row_trains_from_the_preset_and_halts_where_it_can_with_the_learned_rules_probe_data(bench, tmp_path):
    """The commands a row runs (no process started): torchrun on the preset, then eval-task on
    its last checkpoint with HALTING (the learned rule's probe fitted on the training records)
    on the rows that halt, none on those of one depth or a router's."""
    commands = []

    def run(command, log):
        commands.append(command)
        if "eval-task" in command:
            out = Path(command[command.index("--out") + 1])
            out.mkdir(parents=True)
            (out / "eval_task.json").write_text(json.dumps({"accuracy": {}}))
        return 1.0

    bench.run = run
    opts = argparse.Namespace(out=tmp_path, seed=0)
    paths = [tmp_path / name for name in ("vocab", "data", "test.jsonl", "train.jsonl")]
    paths[1].mkdir()
    for split in ("train", "val"):  # record offsets: the longest record (25 tokens) sets seq_len 24
        np.array([0, 20, 45], dtype="<i8").tofile(paths[1] / f"{split}_records.bin")
    for row in ("grt_steps", "unlooped", "mor"):
        commands.clear()
        result = bench.train_and_score(row, 7, opts, *paths)
        train, score = commands
        assert result["steps"] == 7 and "grt_titan.train" in train and str(bench.PRESET) in train
        assert train[train.index("--training.seq_len") + 1] == "24"
        halting = [score[i + 1] for i, arg in enumerate(score) if arg == "--halting"]
        if row == "grt_steps":
            assert halting == bench.HALTING and "learned:0.1" in halting
            assert score[score.index("--probe-data") + 1] == str(tmp_path / "train.jsonl")
        else:
            assert halting == [] and "--probe-data" not in score
