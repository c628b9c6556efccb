"""benchmarks/depth_pays_bench.py: its problems recomputed by hand (a single cycle, each answer
f^d(x) at its query, step t's target f^min(t, d)(x)), and a few steps of every row through the
model's training forward and loss, scored and summarised."""

import sys

import pytest
import torch

from grt_test_helpers import REPO


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import depth_pays_bench

    yield depth_pays_bench
    sys.modules.pop("depth_pays_bench", None)


def test_problems_are_pointer_chases_over_one_cycle(bench, tmp_path):
    opts = bench.build_parser().parse_args(["--out", str(tmp_path)])
    n, k, r = opts.symbols, opts.queries, opts.recurrences
    batch = bench.problems(opts, 4, torch.Generator().manual_seed(0))
    for row in range(4):
        f = batch["tokens"][row, :n].tolist()
        x, seen = 0, set()
        for _ in range(n):  # one cycle through every symbol
            seen.add(x)
            x = f[x]
        assert seen == set(range(n)) and x == 0
        for q in range(k):
            query = batch["tokens"][row, n + q].item() - n
            start, depth = divmod(query, r)
            depth += 1
            assert depth == batch["depth"][row, q]
            walk = [start]
            for _ in range(r):
                walk.append(f[walk[-1]])
            assert batch["labels"][row, n + q] == walk[depth]
            assert batch["step_labels"][row, n + q].tolist() == [walk[min(t, depth)] for t in range(1, r + 1)]
    assert (batch["labels"][:, :n] == bench.IGNORE).all() and (batch["step_labels"][:, :n] == bench.IGNORE).all()
    shallow = bench.problems(opts, 64, torch.Generator().manual_seed(0), deepest=2)["depth"]  # the curriculum's
    assert set(shallow.flatten().tolist()) == {1, 2}


def test_every_row_trains_scores_and_summarises(bench, tmp_path, capsys):
    args = ["--out", str(tmp_path), "--steps", "4", "--eval-sequences", "2", "--recurrences", "3"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    steps = {}
    for line in out.splitlines():
        if " training FLOPs/token, " in line:
            name, rest = line.split(": ", 1)
            steps[name] = int(rest.rsplit(", ", 1)[1].split()[0])
    assert steps["grt_steps"] == 4 and steps["dense"] < steps["grt"]  # equal FLOPs: 8 dense layers cost more
    summary = (tmp_path / "summary.md").read_text()
    sections = summary.split("## ")[1:]
    assert [s.split(":")[0] for s in sections] == ["grt_steps", "grt", "dense"]
    for recurrent in sections[:2]:  # depth x r = 0..2R, arrival; each halting rule
        assert "| depth | r=0 | r=1 | r=2 | r=3 | r=4 | r=5 | r=6 | mean arrival" in recurrent
        table, halting = recurrent.split("Halting on a uniform mix")
        assert table.count("\n| ") == 4  # the header and depths 1..3
        rules = [line.split(" | ")[0] for line in halting.strip().splitlines()[4:] if line.startswith("| ")]
        assert rules == [f"| {rule} {x:g}" for rule, x in bench.HALTING]
        assert "Fixed depth on the same queries: r = 1: " in halting and "Mean steps of every token" in halting
    assert "| depth | accuracy |" in sections[2] and "Halting" not in sections[2]

    def untrained(*args):
        raise AssertionError("a row with result.json and model.pt is scored again, not trained")

    bench.train = untrained
    assert bench.main(args) == 0
    assert (tmp_path / "summary.md").read_text() == summary  # the same weights, the same scores
