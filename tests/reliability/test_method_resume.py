"""Exact resume of every baseline (docs/reliability.md, "Exact resume"): heavy-tail Poisson, RRT,
Ouro, MoR with either router (expert choice, token choice) and SCSE, each trained from its parts
(docs/architecture.md, "Methods as parts"). A run resumed from the checkpoint of step 3
reproduces steps 4..6 of the uninterrupted run bit for bit: every logged scalar that is a
function of the training state (loss, grad norm, LR, depth, the per-step recurrence
statistics) and the final model tensors.

Two runs per method: the uninterrupted run writes the step-3 checkpoint and is the
reference; a fresh dump folder holding only that checkpoint is resumed to step 6. One rank
(torchtitan's gloo process group of world size 1), two methods at a time through the tests'
launcher (tests/launcher.py). The methods' parallel behaviour is tested in
tests/infra/test_method_parity.py and tests/infra/test_ouro_parallel.py, and the GRT's
2-rank resume in test_resume.py.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from grt_test_helpers import (
    MOR_PARTS,
    OURO_PARTS,
    POISSON_PARTS,
    RRT_PARTS,
    SCSE_PARTS,
    build_model,
    parts_overrides,
    torchrun,
)
from reliability_helpers import COMMON, STEPS, WORKER, checkpoint_state, model_tensors, scalars

STOP = 3
# Poisson with truncated backprop as in its paper config (there k = 8 of a mean depth of 32;
# here k = 2 of a mean of 2.5, so long draws run steps without autograd).
METHODS = {
    "poisson": {**POISSON_PARTS, "backprop_recurrences": 2},
    "rrt": RRT_PARTS,
    "ouro": OURO_PARTS,
    "mor": MOR_PARTS,
    "mor_token_choice": {**MOR_PARTS, "router": "token_choice"},
    "scse": SCSE_PARTS,
}
# Scalars that depend on timing or the allocator, not on the training state.
UNTIMED = ("memory/", "time_metrics/", "tflops", "throughput")


def method_runs_of(method: str, root: Path) -> dict:
    """The uninterrupted run (checkpoints at steps 3 and 6), then a run resumed from a copy of
    its step-3 checkpoint in a fresh dump folder."""
    args = [*COMMON, *parts_overrides(METHODS[method]), "--checkpoint.interval", str(STOP)]
    reference, resumed = root / f"{method}-uninterrupted", root / f"{method}-resumed"
    outputs = []
    for run in (reference, resumed):
        if run is resumed:
            checkpoint = f"checkpoint/step-{STOP}"
            shutil.copytree(reference / checkpoint, resumed / checkpoint)
        proc = torchrun(1, [*args, "--job.dump_folder", str(run)], root, module=WORKER, log_name=f"{run.name}.log")
        outputs.append(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            return {"failed": f"{run.name}: exit code {proc.returncode}\n{outputs[-1][-3000:]}"}
    return {"reference": reference, "resumed": resumed, "output": outputs[1], "failed": None}


@pytest.fixture(scope="module")
def method_runs(module_tmp) -> dict[str, dict]:
    """Every method's two runs, two methods at a time."""
    root = module_tmp("method_resume")
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(METHODS, pool.map(lambda method: method_runs_of(method, root), METHODS)))


def saved_tensors(folder: Path, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries `like` names of a DCP checkpoint, read alone (not its optimizer state)."""
    import torch.distributed.checkpoint as dcp

    state = {key: torch.empty_like(value) for key, value in like.items()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=True)
    return state


def exact_scalars(run: Path) -> dict[str, dict[int, float]]:
    return {tag: values for tag, values in scalars(run).items() if not tag.startswith(UNTIMED)}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_resumes_exactly(method, method_runs, tmp_path):
    runs = method_runs[method]
    assert runs["failed"] is None, runs["failed"]
    assert f"Training starts at step {STOP + 1}" in runs["output"]
    expected, got = exact_scalars(runs["reference"]), exact_scalars(runs["resumed"])
    resumed_steps = list(range(STOP + 1, STEPS + 1))
    assert sorted(expected["loss_metrics/global_avg_loss"]) == list(range(1, STEPS + 1))
    core = ["grt/r_last", "lr", "loss_metrics/global_avg_loss", "grad_norm"]
    for tag in [*core, *sorted(expected.keys() - set(core))]:  # the depth first: it explains the rest
        after_stop = {step: value for step, value in expected[tag].items() if step > STOP}
        # A sampled depth (SCSE's uniform law) logs a recurrence step's statistics only on the
        # training steps that reach it: a tag of the first steps alone is not resumed.
        assert got.get(tag, {}) == after_stop, tag  # bitwise: every resumed step's float32 value
    assert got.keys() == {tag for tag, values in expected.items() if max(values) > STOP}
    assert sorted(got["loss_metrics/global_avg_loss"]) == resumed_steps
    # The model moves between the resumed steps: a lost update would show in their losses.
    assert len(set(got["loss_metrics/global_avg_loss"].values())) == len(resumed_steps)
    if method == "poisson":
        assert len(set(expected["grt/r_last"].values())) > 1  # the depth really varies
        assert len(set(got["grt/r_last"].values())) > 1

    final = f"checkpoint/step-{STEPS}"
    ref = model_tensors(checkpoint_state(runs["reference"] / final, tmp_path))
    res = model_tensors(checkpoint_state(runs["resumed"] / final, tmp_path))
    assert ref.keys() == res.keys()
    # The depth counter that seeds the depth and random-state draws, restored and advanced.
    assert int(ref["recurrence.depth_sampler.draws"]) == STEPS
    for key in ref:
        assert torch.equal(ref[key], res[key]), key
    # The method's own state (W_proj, the adapters, the exit gate, the routers, SCSE's anchor) is among the
    # compared tensors and is trained by the resumed steps: a restore that lost it would show.
    own = {
        "poisson": "recurrence.step.proj.",
        "rrt": "recurrence.step.adapters.",
        "ouro": "exit_gate.",
        "mor": "recurrence.router.steps.",
        "mor_token_choice": "recurrence.router.depth.",
        "scse": "recurrence.anchor.",
    }[method]
    own_keys = [key for key in ref if key.startswith(own)]
    assert own_keys, sorted(ref)
    at_stop = saved_tensors(runs["reference"] / f"checkpoint/step-{STOP}", {key: ref[key] for key in own_keys})
    for key in own_keys:
        assert not torch.equal(at_stop[key], ref[key]), key


def test_poisson_initial_state_is_random_and_a_function_of_the_forward_index():
    """The random initial state of training forward t is drawn from (depth_seed, t, rank),
    not from the global RNG: it changes from forward to forward (so a resume that lost the
    forward counter would draw other states) and a resumed process, whose global RNG is not
    the uninterrupted one's, draws the same state for the same t."""
    model = build_model(**METHODS["poisson"])
    recurrence = model.recurrence
    recurrence.noise_rank = 0  # as parallelize_grt sets it in every training run
    h_pre = torch.zeros(2, 8, model.model_args.dim)

    def state_of_forward(index: int, global_seed: int) -> torch.Tensor:
        recurrence.depth_sampler.reset()
        for _ in range(index + 1):  # forwards 0..index, as training draws them
            recurrence.depth_sampler.sample()
        torch.manual_seed(global_seed)
        return recurrence.start(h_pre, recurrence._noise_generator(h_pre))[0]

    first = state_of_forward(3, global_seed=0)
    assert first.std() > 0.01  # random, not the prelude output (zeros here)
    assert torch.equal(first, state_of_forward(3, global_seed=1))
    assert not torch.equal(first, state_of_forward(4, global_seed=0))
