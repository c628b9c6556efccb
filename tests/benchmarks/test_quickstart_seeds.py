"""benchmarks/quickstart_seeds.py: it runs docs/tasks.md's quickstart as printed (the page's
bash blocks before its first `##`), each other seed with its own seed and folder, and its
promise check fails a depth that does not pay. (The commands themselves run at CI scale in
tests/docs.)"""

import pytest

from grt_test_helpers import import_benchmark


@pytest.fixture
def bench(monkeypatch):
    yield from import_benchmark(monkeypatch, "quickstart_seeds")


def test_it_reads_the_quickstart_that_learns_depth(bench):
    commands = bench.quickstart_commands()
    train = [c for c in commands if bench.TRAINER in c]
    assert train == [
        "torchrun --nproc_per_node=2 -m grt_titan.train --job.config_file train_configs/grt_task_loops.toml"
    ]
    assert any("--depth-given loops" in c and "--split test" in c for c in commands)
    assert commands[-1].startswith("grt-titan eval-task outputs/grt_task_loops/checkpoint")


def test_another_seed_gets_its_own_seed_and_folder(bench):
    train, evaluate = [c for c in bench.quickstart_commands() if bench.TRAINER in c or "eval-task" in c]
    toml = bench.preset(train)
    assert toml["debug"]["seed"] == 0  # the preset's own seed runs as printed
    assert bench.for_seed(train, 0, toml) == train
    seeded = bench.for_seed(train, 2, toml)
    assert seeded.endswith("--debug.seed 2 --job.dump_folder outputs/grt_task_loops_s2")
    evaluated = bench.for_seed(evaluate, 2, toml)
    assert "outputs/grt_task_loops/" not in evaluated
    assert bench.eval_folder(evaluated).as_posix() == "outputs/grt_task_loops_s2/eval"


def test_a_page_without_a_training_run_is_refused(bench, tmp_path):
    page = tmp_path / "tasks.md"
    page.write_text("# Tasks\n\n```bash\ngrt-titan task vocab --out v\n```\n\n## Later\n")
    with pytest.raises(SystemExit, match="no training run"):
        bench.quickstart_commands(page)


def test_the_promise_check_fails_a_depth_that_does_not_pay(bench):
    def result(at_loops, at_one):
        return {
            "at_loops": {str(d): a for d, a in enumerate(at_loops, 1)},
            "accuracy": {str(d): {"1": a} for d, a in enumerate(at_one, 1)},
        }

    assert bench.promise_problems(result([1.0, 0.9, 0.8, 0.7, 0.5], [1.0, 0.0, 0.0, 0.1, 0.2])) == []
    # depth 3 is below 4 and not held to it; depth 4 at 0.45 fails, depth 5 only 0.2 above r = 1
    problems = bench.promise_problems(result([1.0, 0.9, 0.1, 0.45, 0.6], [1.0, 0.0, 0.0, 0.0, 0.4]))
    assert [p.split(":")[0] for p in problems] == ["depth 4", "depth 5"]
