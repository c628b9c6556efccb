"""The distillation loss (grt_titan/components/distill_loss.py) by hand, its alpha limits, and
the vocabulary-sharded KL against the gathered one on 2 gloo ranks."""

import math

import pytest
import torch
import torch.nn.functional as F

from grt_titan.components import distill_loss
from grt_titan.components.distill_loss import IGNORE_INDEX, distillation_loss, kd_loss_sum, kl_per_token
from grt_titan.components.loss import grt_loss

from grt_test_helpers import REPO, worker_result
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
def test_sharded_vocabulary_kl_equals_gathered(tmp_path):
    """TP 2 on gloo: each rank holds half the vocabulary; loss, per-token KL and each rank's
    gradient equal the full-row computation (float64)."""
    for rank in worker_result(__file__, "distill_shard_worker", tmp_path):
        want, got = rank["loss"]
        assert got == pytest.approx(want, rel=1e-12)
        assert rank["kl_diff"] < 1e-12
        assert rank["grad_diff"] < 1e-12 * max(rank["grad_norm"], 1.0)


def _reference_kd(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, t: float):
    """The KD term written the straightforward way, in float64 autograd: T^2 sum over scored
    tokens of sum_v p_v (log_softmax(a)_v - log_softmax(b)_v)."""
    log_p = F.log_softmax(teacher.double() / t, -1)
    log_q = F.log_softmax(student.double() / t, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return t**2 * (kl * (labels != IGNORE_INDEX)).sum(), kl


@pytest.mark.parametrize("block", [None, 14])
def test_kl_function_gradcheck(block, monkeypatch):
    """torch.autograd.gradcheck on the custom Function (float64, full rows, T = 2 and 0.5), in
    one block of rows and in blocks of 2 rows (7 columns, 2 x 7 elements; 5 rows: 2, 2, 1)."""
    if block is not None:
        monkeypatch.setattr(distill_loss, "_CPU_BLOCK_ELEMENTS", block)
    g = torch.Generator().manual_seed(3)
    student = (2 * torch.randn(5, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    teacher = 2 * torch.randn(5, 7, generator=g, dtype=torch.float64)
    for t in (2.0, 0.5):
        assert torch.autograd.gradcheck(lambda s: distill_loss._KLPerToken.apply(s, teacher, t, None), (student,))
    # [B, S, V] too, and an incoming gradient on every token
    s3 = student.detach().view(1, 5, 7).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: kl_per_token(s, teacher.view(1, 5, 7), 2.0), (s3,))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [None, 100])
def test_kd_matches_the_log_softmax_formula(dtype, block, monkeypatch):
    """Loss, per-token KL and the student's gradient against the log_softmax formula through
    float64 autograd on the same (rounded) logits: random logits of scale 4 with a per-row
    offset between student and teacher, a fifth of the labels ignored (their rows get exactly
    zero gradient), in one block of rows and in blocks of 2 (50 columns). The teacher gets no
    gradient even when it asks for one; without grad mode the KL is a plain tensor."""
    if block is not None:
        monkeypatch.setattr(distill_loss, "_CPU_BLOCK_ELEMENTS", block)
    g = torch.Generator().manual_seed(11)
    shape = (3, 7, 50)
    student = (4 * torch.randn(shape, generator=g) + 3 * torch.randn(3, 7, 1, generator=g)).to(dtype)
    teacher = (4 * torch.randn(shape, generator=g)).to(dtype).requires_grad_(True)
    labels = torch.randint(0, 50, shape[:2], generator=g)
    labels[torch.rand(shape[:2], generator=g) < 0.2] = IGNORE_INDEX
    labels[0, 0] = IGNORE_INDEX
    rel = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2e-6}[dtype]
    for t in (1.0, 2.0, 0.7):
        ref_s = student.detach().double().requires_grad_(True)
        want, want_kl = _reference_kd(ref_s, teacher.detach(), labels, t)
        want.backward()
        s = student.clone().requires_grad_(True)
        got = kd_loss_sum(s, teacher, labels, t)
        assert got.dtype == torch.promote_types(dtype, torch.float32)
        assert got.item() == pytest.approx(want.item(), rel=rel)
        got.backward()
        assert s.grad.dtype == dtype and teacher.grad is None
        scale = ref_s.grad.abs().max().item()
        tol = {torch.float64: 1e-13, torch.float32: 1e-6, torch.bfloat16: 8e-3}[dtype] * scale
        assert (s.grad.double() - ref_s.grad).abs().max().item() < tol
        assert torch.all(s.grad[labels == IGNORE_INDEX] == 0)
        with torch.no_grad():
            kl = kl_per_token(student, teacher, t)
        assert not kl.requires_grad
        assert not kl_per_token(student, teacher, t).requires_grad  # only the teacher asks
        assert torch.allclose(kl.double(), want_kl, rtol=rel * 10, atol=rel)


def test_backward_twice_with_retain_graph():
    """The saved gradient is not consumed: a second backward through a retained graph gives
    the same gradient again."""
    g = torch.Generator().manual_seed(5)
    s = torch.randn(2, 3, 9, generator=g).requires_grad_(True)
    teacher = torch.randn(2, 3, 9, generator=g)
    loss = kd_loss_sum(s, teacher, torch.zeros(2, 3, dtype=torch.long), 2.0)
    loss.backward(retain_graph=True)
    first = s.grad.clone()
    loss.backward()
    assert torch.equal(s.grad, 2 * first)


def test_uneven_shards_in_blocks_equal_full_rows(monkeypatch):
    """Three ranks as threads over uneven column blocks (6, 5 and 2 of 13 columns) with a
    stand-in all-reduce, rows in blocks of 12 elements: every rank cuts the rows by the widest
    rank's width (2 rows a block, one all-reduce each; the 2-column rank alone would take 6
    rows and the collectives would not pair up), and loss, per-token KL and each rank's
    gradient equal the full rows' (float64)."""
    import threading

    import torch.distributed as dist

    world, widths = 3, (6, 5, 2)
    barrier = threading.Barrier(world, timeout=60)
    slots: list = [None] * world
    rank_of = threading.local()

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None):
        slots[rank_of.rank] = tensor.clone()
        barrier.wait()
        stacked = torch.stack(slots)  # shapes differ (and this raises) if the blocks do
        result = stacked.amax(0) if op == dist.ReduceOp.MAX else stacked.sum(0)
        barrier.wait()
        tensor.copy_(result)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(distill_loss, "_CPU_BLOCK_ELEMENTS", 12)
    g = torch.Generator().manual_seed(2)
    student = 3 * torch.randn(2, 5, 13, generator=g, dtype=torch.float64)
    teacher = 3 * torch.randn(2, 5, 13, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 13, (2, 5), generator=g)
    labels[1, 3] = IGNORE_INDEX
    full = student.clone().requires_grad_(True)
    want = kd_loss_sum(full, teacher, labels, temperature=2.0)
    want.backward()
    want_kl = kl_per_token(student, teacher, 2.0)
    starts = [sum(widths[:r]) for r in range(world)]
    results: list = [None] * world

    def rank(r: int) -> None:
        rank_of.rank = r
        try:
            cols = slice(starts[r], starts[r] + widths[r])
            shard = student[..., cols].clone().requires_grad_(True)
            loss = kd_loss_sum(shard, teacher[..., cols], labels, temperature=2.0, group="tp")
            loss.backward()
            kl = kl_per_token(student[..., cols], teacher[..., cols], 2.0, group="tp")
            results[r] = (loss.detach(), kl, shard.grad, full.grad[..., cols])
        except BaseException as e:  # noqa: BLE001 - reported below, the others released
            results[r] = e
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors = [r for r in results if isinstance(r, BaseException)]
    errors.sort(key=lambda e: isinstance(e, threading.BrokenBarrierError))  # the cause first
    assert not errors, repr(errors[0])
    for result in results:
        loss, kl, grad, want_grad = result
        assert loss.item() == pytest.approx(want.item(), rel=1e-12)
        assert (kl - want_kl).abs().max().item() < 1e-12
        assert (grad - want_grad).abs().max().item() < 1e-12 * max(want_grad.abs().max().item(), 1.0)


# ---- one training job with a teacher, and its resume ----------------------------------------

STEPS, STOP = 4, 2
EXACT_TAGS = ("loss_metrics/global_avg_loss", "grad_norm", "distill/kd_loss", "distill/ce_loss")


def documented_distill_command() -> list[str]:
    """The arguments of docs/distillation.md's distillation command (the second line of its
    block), after `-m grt_titan.train`: this test runs it, so the docs test only checks it."""
    from tests.docs.docs_helpers import commands, extract_blocks, logical_lines

    blocks, _ = extract_blocks(REPO / "docs" / "distillation.md")
    (block,) = [b for b in blocks if b.lang == "bash" and "--distill.teacher" in b.text]
    (line,) = [line for line in logical_lines(block.text) if "--distill.teacher" in line]
    (command,) = commands(line)
    return command[command.index("grt_titan.train") + 1 :]


def _distill_run(dump, teacher) -> list[str]:
    """The documented command with this test's teacher and folder, at CPU scale (appended
    arguments win, as the docs test's cpu-scale ones do)."""
    documented = documented_distill_command()
    replaced = {"--job.dump_folder": str(dump), "--distill.teacher": str(teacher)}
    for key, value in replaced.items():
        documented[documented.index(key) + 1] = value
    return [
        *documented,
        "--training.seq_len",
        "32",
        "--training.local_batch_size",
        "2",
        "--metrics.log_freq",
        "1",
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
        # The student trains its recurrence alone over a frozen prelude and coda (docs/training.md,
        # "Training a subset"): the KD gradient reaches it through the frozen coda.
        "--training.trainable",
        "recurrent",
    ]


def test_the_documented_command_is_the_one_run():
    """docs/distillation.md's command is grt_debug distilled from dense_debug at alpha 0.5, T 2;
    the run below is it (its folder and teacher replaced, CPU scale appended)."""
    documented = documented_distill_command()
    pairs = dict(zip(documented[::2], documented[1::2]))
    assert pairs["--job.config_file"] == "train_configs/grt_debug.toml"
    assert pairs["--distill.teacher_config"] == "train_configs/dense_debug.toml"
    assert (pairs["--distill.alpha"], pairs["--distill.temperature"]) == ("0.5", "2")
    run = _distill_run("DUMP", "TEACHER")
    assert run[: len(documented)] == [
        {"outputs/grt_debug_distilled": "DUMP", "outputs/dense_debug/checkpoint": "TEACHER"}.get(a, a)
        for a in documented
    ]


@pytest.mark.slow
def test_distillation_trains_logs_and_resumes_exactly(run_torchrun, tmp_path):
    """2 gloo ranks (FSDP) distil a dense_debug teacher (a torchtitan checkpoint and its TOML,
    given on the command line) into grt_debug: the KD term, the student's CE and the teacher's
    time share are logged in training and validation; the checkpoint holds the student only;
    a run resumed at step 2 repeats steps 3-4 of the uninterrupted run bit for bit (the
    teacher read again from its source). The student trains only its recurrence
    (`[training] trainable = ["recurrent"]`), so freezing composes with distillation too."""
    import shutil

    from torch.distributed.checkpoint import FileSystemReader

    from grt_titan.checkpoints.folders import RESUME_STATES
    from grt_titan.checkpoints.load import save_checkpoint
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
    assert "[training] trainable = ['recurrent']:" in out

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
