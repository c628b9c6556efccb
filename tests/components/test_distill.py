"""The distillation loss (grt_titan/components/distill_loss.py) by hand, its alpha limits, and
the vocabulary-sharded KL against the gathered one on 2 gloo ranks."""

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from grt_titan.components.distill_loss import IGNORE_INDEX, distillation_loss, kd_loss_sum, kl_per_token
from grt_titan.components.loss import grt_loss

from tests.reliability.reliability_helpers import scalars


def _softmax(row: list[float], t: float) -> list[float]:
    z = [math.exp(x / t) for x in row]
    return [x / sum(z) for x in z]


def test_kl_of_three_logits_by_hand():
    """Two tokens of a 3-word vocabulary at T = 2: sum_v p_v log(p_v / q_v) written out."""
    student = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]], dtype=torch.float64)
    teacher = torch.tensor([[2.0, 0.0, -1.0], [3.0, 1.0, 1.0]], dtype=torch.float64)
    t = 2.0
    want = []
    for s_row, t_row in zip(student.tolist(), teacher.tolist()):
        p, q = _softmax(t_row, t), _softmax(s_row, t)
        want.append(sum(pv * math.log(pv / qv) for pv, qv in zip(p, q)))
    got = kl_per_token(student, teacher, t)
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    # torch's own KL on the same distributions agrees too.
    ref = F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), log_target=True, reduction="none")
    assert got.tolist() == pytest.approx(ref.sum(-1).tolist(), rel=1e-12)
    # float32 logits (what training passes) agree to float32 precision.
    assert kl_per_token(student.float(), teacher.float(), t).tolist() == pytest.approx(want, rel=1e-5)
    # The KD term: T^2 KL summed over the scored tokens (the ignored one drops out).
    labels = torch.tensor([1, IGNORE_INDEX])
    assert kd_loss_sum(student, teacher, labels, t).item() == pytest.approx(t**2 * want[0], rel=1e-12)
    # Same distributions: no divergence; the gradient is (q - p) / T per token (T^2 / T = T).
    assert kl_per_token(teacher, teacher, t).abs().max().item() < 1e-12
    s = student.clone().requires_grad_(True)
    kd_loss_sum(s, teacher, torch.tensor([0, 0]), t).backward()
    p, q = torch.softmax(teacher / t, -1), torch.softmax(student / t, -1)
    assert torch.allclose(s.grad, t * (q - p), atol=1e-12)


def test_alpha_limits():
    """alpha = 0 is the CE itself (loss and gradients bit for bit), alpha = 1 the KD term
    itself, and between them the mix."""
    torch.manual_seed(0)
    logits, teacher = torch.randn(2, 4, 9), torch.randn(2, 4, 9)
    labels = torch.randint(0, 9, (2, 4))

    def run(alpha: float):
        x = logits.clone().requires_grad_(True)
        ce = grt_loss(x, labels)
        loss = distillation_loss(ce, kd_loss_sum(x, teacher, labels, 2.0), alpha)
        loss.backward()
        return loss.detach(), x.grad

    x = logits.clone().requires_grad_(True)
    ce = grt_loss(x, labels)
    ce.backward()
    loss0, grad0 = run(0.0)
    assert torch.equal(loss0, ce.detach()) and torch.equal(grad0, x.grad)
    kd = kd_loss_sum(logits, teacher, labels, 2.0)
    assert torch.equal(run(1.0)[0], kd)
    assert run(0.25)[0].item() == pytest.approx(0.75 * ce.item() + 0.25 * kd.item(), rel=1e-6)


@pytest.mark.slow
def test_sharded_vocabulary_kl_equals_gathered(run_torchrun, tmp_path):
    """TP 2 on gloo: each rank holds half the vocabulary; loss, per-token KL and each rank's
    gradient equal the full-row computation (float64)."""
    out = tmp_path / "kd.json"
    here = os.path.dirname(__file__)
    env = {"PYTHONPATH": os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])}
    proc = run_torchrun(2, [str(out)], tmp_path, timeout=300, module="distill_shard_worker", env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for rank in json.loads(out.read_text()):
        want, got = rank["loss"]
        assert got == pytest.approx(want, rel=1e-12)
        assert rank["kl_diff"] < 1e-12
        assert rank["grad_diff"] < 1e-12 * max(rank["grad_norm"], 1.0)


# ---- one training job with a teacher, and its resume ----------------------------------------

STEPS, STOP = 4, 2
EXACT_TAGS = ("loss_metrics/global_avg_loss", "grad_norm", "distill/kd_loss", "distill/ce_loss")


def _distill_run(dump, teacher) -> list[str]:
    from grt_test_helpers import SHORT_DEBUG_RUN

    return [
        *SHORT_DEBUG_RUN[:-1],  # with validation: its KD term is logged too
        "--training.seq_len",
        "32",
        "--training.local_batch_size",
        "2",
        "--training.steps",
        str(STEPS),
        "--lr_scheduler.warmup_steps",
        "2",
        "--validation.freq",
        str(STEPS),
        "--validation.steps",
        "1",
        "--validation.seq_len",
        "32",
        "--validation.local_batch_size",
        "2",
        "--grt_metrics.no_validation_depths",
        "--checkpoint.enable",
        "--checkpoint.interval",
        str(STOP),
        "--debug.seed",
        "7",
        "--debug.deterministic",
        "--job.dump_folder",
        str(dump),
        "--distill.teacher",
        str(teacher),
        "--distill.teacher_config",
        "train_configs/dense_debug.toml",
        "--distill.alpha",
        "0.5",
        "--distill.temperature",
        "2",
    ]


@pytest.mark.slow
def test_distillation_trains_logs_and_resumes_exactly(run_torchrun, tmp_path):
    """2 gloo ranks (FSDP) distil a dense_debug teacher (a torchtitan checkpoint and its TOML,
    given on the command line) into grt_debug: the KD term, the student's CE and the teacher's
    time share are logged in training and validation; the checkpoint holds the student only;
    a run resumed at step 2 repeats steps 3-4 of the uninterrupted run bit for bit (the
    teacher read again from its source)."""
    import shutil

    from torch.distributed.checkpoint import FileSystemReader

    from grt_titan.checkpoint_io import RESUME_STATES, save_checkpoint
    from grt_titan.model import grt_flavors
    from grt_titan.model.model import build_meta_model

    from grt_test_helpers import build_model

    teacher = tmp_path / "teacher" / "step-0"
    save_checkpoint(teacher, build_model("dense_debug", seed=3).state_dict())
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    proc = run_torchrun(2, _distill_run(full, teacher.parent), tmp_path, log_name="full.log")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Distillation teacher:" in out and "distill  kd:" in out

    expected = scalars(full)
    for tag in (*EXACT_TAGS, "distill/teacher_time(%)"):
        assert sorted(expected[tag]) == list(range(1, STEPS + 1)), tag
    assert 0 < expected["distill/teacher_time(%)"][STEPS] < 100
    assert sorted(expected["validation_metrics/distill_kd_loss"]) == [1, STEPS]  # torchtitan validates step 1 too
    assert expected["validation_metrics/loss"][STEPS] > 0  # the student's CE, as without a teacher
    # The total is the mix of the two logged terms.
    for step in range(1, STEPS + 1):
        mix = 0.5 * expected["distill/ce_loss"][step] + 0.5 * expected["distill/kd_loss"][step]
        assert expected["loss_metrics/global_avg_loss"][step] == pytest.approx(mix, rel=1e-5)

    # The checkpoint holds the student and the training state, nothing of the teacher.
    saved = FileSystemReader(str(full / "checkpoint" / f"step-{STOP}")).read_metadata().state_dict_metadata
    model_keys = {k for k in saved if not k.startswith(tuple(f"{s}." for s in RESUME_STATES))}
    student = grt_flavors["debug"].replace(num_recurrences=4, min_recurrences=1)
    assert model_keys == set(build_meta_model(student).state_dict())

    shutil.copytree(full / "checkpoint" / f"step-{STOP}", resumed / "checkpoint" / f"step-{STOP}")
    proc = run_torchrun(2, _distill_run(resumed, teacher.parent), tmp_path, log_name="resumed.log")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"Training starts at step {STOP + 1}" in out
    got = scalars(resumed)
    for tag in (*EXACT_TAGS, "validation_metrics/distill_kd_loss", "validation_metrics/loss"):
        for step in expected[tag]:
            if step > STOP:
                assert got[tag][step] == expected[tag][step], (tag, step)


@pytest.mark.parametrize("method", ["grt", "ladder", "poisson", "rrt", "mor", "ouro"])
def test_every_method_trains_with_a_teacher(method):
    """The KD term on each method's training output (MoR's auxiliary loss, Ouro's per-step
    readout): the student gets gradients, the teacher none and stays bitwise unchanged;
    alpha = 0 trains on the student's own loss itself."""
    from grt_titan.components.distill import Distiller
    from grt_titan.job_config import DistillConfig

    from grt_test_helpers import (
        LADDER_PARTS,
        MOR_PARTS,
        OURO_PARTS,
        POISSON_PARTS,
        RRT_PARTS,
        build_model,
        one_rank_dims,
    )

    parts = {"grt": {}, "ladder": LADDER_PARTS, "poisson": POISSON_PARTS, "rrt": RRT_PARTS, "mor": MOR_PARTS}
    parts["ouro"] = OURO_PARTS
    student = build_model("debug", seed=1, vocab_size=96, **parts[method])
    teacher = build_model("dense_debug", seed=2, vocab_size=96, n_prelude_layers=2).eval().requires_grad_(False)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.roll(tokens, -1, 1)
    for alpha in (0.0, 0.5):
        distiller = Distiller(teacher, DistillConfig(teacher="x", alpha=alpha, temperature=2.0), one_rank_dims(), "cpu")
        distiller.begin_step()
        student.zero_grad()
        pred = student(tokens)
        own = grt_loss(pred, labels)
        total = distiller.loss(pred, distiller.teacher_logits(tokens), labels, own, torch.tensor(32.0))
        if alpha == 0:
            assert total is own
        total.backward()
        assert all(p.grad is not None for p in student.parameters() if p.requires_grad)
        metrics = distiller.metrics()
        assert metrics["distill/kd_loss"] > 0 and metrics["distill/ce_loss"] == pytest.approx(own.item() / 32)
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
