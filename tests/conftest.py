"""Fixtures shared by every test folder (helpers live in grt_test_helpers.py)."""

import os
import shutil
import sys
from pathlib import Path

# Under pytest-xdist (`-n 2`, as CI runs) each worker shares the cores with the other worker
# and with the jobs both start: one intra-op thread per worker, as every job already has
# (tests/launcher.py). Two threads per process oversubscribe the cores, and a parallel region
# then waits for its descheduled thread (a dense_debug step ran up to 3x slower so). Set
# before torch is imported; the commands tests start inherit it. A single pytest process
# keeps torch's default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from grt_test_helpers import REPO, torchrun  # noqa: E402

# `tests.launcher`, `tests.cases` and the job modules (`tests.<folder>.<worker>`) import from here.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TESTS = Path(__file__).resolve().parent

# The modules that take longest, with roughly what each takes in a full run on CI's 2 cores
# (its shared fixture's setup included; `--durations=0` of such a run gives them, and
# `python tests/budget.py LOG` sums them by area: tests/README.md, "Budget"). CI runs
# `-n 2 --dist loadscope --no-loadscope-reorder`: each worker takes the next whole module in
# collection order whenever it is nearly done with its own, so collection puts these first,
# longest first, and every other module after them in its usual order. The run then ends on
# short modules on both workers instead of one training module on one worker while the other
# idles. (xdist's default reorder puts the modules with the most tests first, which left the
# one-test training modules for the end.) The seconds only order; tests/test_schedule.py
# checks that each module exists.
LONGEST_FIRST = {
    "infra/test_parallel_parity.py": 70,
    "docs/test_docs.py": 140,
    "reliability/test_fault_tolerance.py": 125,
    "infra/test_presets.py": 95,
    "reliability/test_rank_failure.py": 45,
    "infra/test_method_parity.py": 75,
    "infra/test_tp_compile_ac.py": 65,
    "reliability/test_startup_errors.py": 15,
    "analysis/test_task_eval.py": 25,
    "test_config_checks.py": 60,
    "hf/test_hf_export.py": 45,
    "infra/test_ouro_parallel.py": 46,
    "infra/test_float8.py": 46,
    "infra/test_golden_losses.py": 42,
    "infra/test_torch_workarounds.py": 38,
    "reliability/test_spike_and_corruption.py": 25,
    "reliability/test_method_resume.py": 35,
    "components/test_observability_e2e.py": 33,
    "reliability/test_resume.py": 30,
    "reliability/test_frozen_training.py": 30,
    "infra/test_paper_configs.py": 29,
    "hf/test_hf_torchtitan_checkpoint.py": 28,
    "reliability/test_layouts.py": 24,
    "test_teacher.py": 24,
    "test_launcher.py": 22,
    "components/test_distill.py": 20,
    "hf/test_hf_parts.py": 18,
    "reliability/test_nonfinite.py": 17,
    "reliability/test_initial_load.py": 17,
    "infra/test_compile.py": 17,
    "hf/test_retrofit.py": 15,
}


def module_of(item: pytest.Item) -> str:
    """The test's module, relative to tests/ (`infra/test_presets.py`)."""
    try:
        return item.path.resolve().relative_to(TESTS).as_posix()
    except ValueError:  # a module outside tests/ (pytester's)
        return ""


def suite_part(items: list[pytest.Item], part: str) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(kept, dropped): `part` "training" keeps the modules that hold a slow test, "unit" the others."""
    training = {module_of(item) for item in items if item.get_closest_marker("slow")}
    keep = [(module_of(item) in training) == (part == "training") for item in items]
    return [i for i, k in zip(items, keep) if k], [i for i, k in zip(items, keep) if not k]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-part",
        choices=("training", "unit"),
        default=None,
        help="training: only the modules that hold a slow test; unit: only the others. CI runs "
        "the two one after the other on a small disk, installing torch 2.11 beside the unit part "
        "alone (.ci/run; tests/README.md, 'Budget')",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--suite-part`'s modules alone (whole modules, so that a module's shared fixture runs
    once); then LONGEST_FIRST's modules first, longest first: a stable sort keeps every
    module's tests together and in their order, and the other modules in collection order."""
    if part := config.getoption("--suite-part"):
        keep, dropped = suite_part(items, part)
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    items.sort(key=lambda item: -LONGEST_FIRST.get(module_of(item), 0))


@pytest.fixture
def run_torchrun():
    return torchrun


@pytest.fixture(scope="module")
def module_tmp(request, tmp_path_factory):
    """`module_tmp(name)`: a new folder, as `tmp_path_factory.mktemp(name)`, for runs that a
    module's tests share; removed once the module is done unless one of its tests failed.
    Why: the suite's checkpoints add up to ~8 GB and CI's disk is shared; pyproject's
    `tmp_path_retention_policy = "failed"` does the same for each test's `tmp_path`."""
    made: list[Path] = []
    failed_before = request.session.testsfailed

    def make(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield make
    if request.session.testsfailed == failed_before:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
