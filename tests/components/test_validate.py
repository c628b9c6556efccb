"""Depth-wise validation: each logged loss is the loss of an independent forward at that r."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from grt_titan.components.validate import GRTValidator, validation_depths
from grt_titan.data.loader import build_validation_dataloader

from components_helpers import ByteTokenizer, job_config, make_dataset, tiny_args, tiny_model
from grt_test_helpers import MOR_PARTS, RRT_PARTS, build_model, one_rank_dims


class RecordingMetrics:
    """The part of torchtitan's MetricsProcessor a validator uses."""

    def __init__(self, logger=None):
        from torchtitan.components.metrics import BaseLogger

        self.ntokens_since_last_log = 0
        self.logger = logger or BaseLogger()
        self.calls = []

    def log_validation(self, loss, step, extra_metrics=None):
        self.calls.append({"loss": loss, "step": step, **(extra_metrics or {})})


def _validator(tmp_path, metrics, **cfg):
    from torchtitan.components.loss import build_cross_entropy_loss

    from grt_titan.runtime.cpu_support import enable_cpu_training

    enable_cpu_training()
    data = make_dataset(tmp_path / "data")
    jc = job_config(str(data), **cfg)
    validator = GRTValidator(
        jc,
        1,
        0,
        ByteTokenizer(),
        one_rank_dims(),
        build_cross_entropy_loss(jc),
        contextlib.nullcontext,
        contextlib.nullcontext(),
        metrics,
    )
    return validator, jc


def _independent_loss(jc, model, r):
    """Mean next-token loss over the same validation batches, one plain forward at depth r."""
    loader = build_validation_dataloader(1, 0, ByteTokenizer(), jc, infinite=True)
    total, tokens = 0.0, 0
    model.eval()
    with torch.no_grad():
        for k, (x, y) in enumerate(loader):
            if k == jc.validation.steps:
                break
            logits = model(x["input"], num_recurrences=r)
            total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            tokens += y.numel()
    return total / tokens


def test_depthwise_losses_equal_independent_forwards_and_flops_eq1(tmp_path):
    metrics = RecordingMetrics()
    validator, jc = _validator(tmp_path, metrics)
    model = tiny_model().train()
    validator.validate([model], step=7)
    assert model.training  # restored
    (call,) = metrics.calls
    R = model.model_args.num_recurrences
    assert validation_depths(R) == [0, 1, 2, 3, 5]
    args = model.model_args
    d, S, V = args.dim, jc.validation.seq_len, args.vocab_size
    for r in validation_depths(R):
        # Each batch's loss is divided by its token count and averaged, as torchtitan does;
        # batches are equal-sized, so that is the token mean. Float32 sums: 1e-6 relative.
        assert call[f"validation_metrics/loss_r{r}"] == pytest.approx(_independent_loss(jc, model, r), rel=1e-6)
        # Eq. 1 with p = n = c = 1: (2 + r)(24 d^2 + 4 S d) + r 10 d^2, plus the LM head 2 d V.
        eq1 = (2 + r) * (24 * d * d + 4 * S * d) + r * 10 * d * d + 2 * d * V
        assert call[f"validation_metrics/flops_per_token_r{r}"] == eq1
    assert call["loss"] == call[f"validation_metrics/loss_r{R}"]  # the eval depth (R)
    assert call["step"] == 7 and metrics.ntokens_since_last_log == 3 * 2 * 32
    losses = [call[f"validation_metrics/loss_r{r}"] for r in validation_depths(R)]
    assert len(set(losses)) == len(losses)  # the depths really differ


@pytest.mark.parametrize(
    "parts", [MOR_PARTS, dict(MOR_PARTS, router="token_choice"), RRT_PARTS], ids=["mor", "mor_token_choice", "rrt"]
)
def test_methods_with_per_step_modules_are_scored_up_to_R(parts, tmp_path):
    """MoR (a router per step) and RRT (an adapter per step): depths 0..R, no extrapolation;
    FLOPs from their own formula."""
    metrics = RecordingMetrics()
    validator, jc = _validator(tmp_path, metrics)
    model = build_model(tiny_args(**parts))
    validator.validate([model], step=3)
    (call,) = metrics.calls
    args = model.model_args
    R = args.num_recurrences
    assert sorted(k for k in call if k.startswith("validation_metrics/loss_r")) == [
        f"validation_metrics/loss_r{r}" for r in range(R + 1)
    ]
    for r in range(R + 1):
        assert call[f"validation_metrics/loss_r{r}"] == pytest.approx(_independent_loss(jc, model, r), rel=1e-6)
        flops = args.forward_flops_per_token(jc.validation.seq_len, r)
        assert call[f"validation_metrics/flops_per_token_r{r}"] == flops
    assert call["loss"] == call[f"validation_metrics/loss_r{R}"]


def test_eval_depth_outside_the_set_is_scored_separately(tmp_path):
    metrics = RecordingMetrics()
    validator, jc = _validator(tmp_path, metrics)
    model = tiny_model(eval_recurrences=4)
    validator.validate([model], step=1)
    (call,) = metrics.calls
    assert call["loss"] == pytest.approx(_independent_loss(jc, model, 4), rel=1e-6)
    assert "validation_metrics/loss_r4" not in call


@pytest.mark.parametrize("case", ["dense", "switched_off"])
def test_plain_validation_without_per_depth_values(tmp_path, case):
    metrics = RecordingMetrics()
    validator, jc = _validator(tmp_path, metrics, validation_depths=(case == "dense"))
    model = tiny_model(n_core_layers=0) if case == "dense" else tiny_model()
    validator.validate([model], step=1)
    (call,) = metrics.calls
    assert not any("_r" in k for k in call)
    depth = None if case == "dense" else model.model_args.num_recurrences
    assert call["loss"] == pytest.approx(_independent_loss(jc, model, depth), rel=1e-6)


def test_depth_curve_image_in_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torchtitan.components.metrics import LoggerContainer, TensorBoardLogger

    container = LoggerContainer()
    tb = TensorBoardLogger(str(tmp_path / "tb"))
    container.add_logger(tb)
    metrics = RecordingMetrics(container)
    validator, _ = _validator(tmp_path, metrics)
    validator.validate([tiny_model()], step=3)
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    acc.Reload()
    (image,) = acc.Images("validation_metrics/depth_curve")
    assert image.step == 3 and image.width > 400 and image.height > 200
