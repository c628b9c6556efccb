"""benchmarks/depth_task_bench.py's summary of eval-task results (no training here: the rows
train through torchrun for minutes): accuracy at r = 1 / R / 2R per depth, arrival, and each
halting row's table as eval-task prints it."""

import sys

import pytest

from grt_titan.analysis.task_eval import halting_summary, halting_table

from grt_test_helpers import REPO


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import depth_task_bench

    yield depth_task_bench
    sys.modules.pop("depth_task_bench", None)


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
