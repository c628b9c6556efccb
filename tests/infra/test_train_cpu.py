"""The CPU launch: depths agree across gloo ranks, and what grt_titan.train sets up before
torchtitan's trainer (torchrun's defaults, per-rank logging). A 2-rank training run is
tests/components/test_observability_e2e.py; the user's own command, through torchrun's
agent, runs in tests/docs (README.md's CPU run)."""

import json

import pytest


@pytest.mark.slow
def test_depth_is_identical_on_every_rank(run_torchrun, tmp_path):
    out = tmp_path / "draws.json"
    proc = run_torchrun(2, [str(out)], tmp_path, timeout=300, module="tests.infra.depth_sync_worker")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = json.loads(out.read_text())
    assert rank0 == rank1 and len(set(rank0)) == 8


def test_torchruns_nccl_default_is_left_to_torchtitan(monkeypatch):
    """torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING=1 is unset (torchtitan sets 3 without its
    overwrite warning); a value the user chose stays."""
    import os

    from grt_titan.train import quiet_torchrun_defaults

    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    quiet_torchrun_defaults()
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    quiet_torchrun_defaults()
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


@pytest.fixture
def titan_logger(monkeypatch):
    """torchtitan's init_logger as grt_titan.train calls it; the root logger is restored after."""
    import logging

    from torchtitan.tools.logging import init_logger

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)  # init_logger sets it
    monkeypatch.delenv("GRT_LOG_ALL_RANKS", raising=False)
    init_logger()
    (handler,) = root.handlers
    yield root, handler
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(
    "rank, env, level",
    [
        ("0", None, "INFO"),  # rank 0 logs the run
        ("1", None, "WARNING"),  # other ranks: warnings and errors only, not every line twice
        ("1", "1", "INFO"),  # GRT_LOG_ALL_RANKS=1: every rank logs
    ],
)
def test_only_rank_0_logs_info(titan_logger, monkeypatch, rank, env, level):
    import logging

    from grt_titan.train import quiet_other_ranks

    root, handler = titan_logger
    monkeypatch.setenv("RANK", rank)
    if env is not None:
        monkeypatch.setenv("GRT_LOG_ALL_RANKS", env)
    quiet_other_ranks()
    assert root.getEffectiveLevel() == logging.getLevelName(level)
    assert handler.level == logging.getLevelName(level)  # also for child loggers set to INFO
    assert root.isEnabledFor(logging.WARNING)
