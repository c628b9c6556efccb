"""grt_titan's validator: depth-wise validation on grt_titan's validation split.

Evaluation runs in eval mode, so the model uses its eval depth (default R) and no noise;
that loss is torchtitan's `validation_metrics/loss`, as for any model.

With `[grt_metrics] validation_depths = true` (the default) each validation also scores
the same batches at every depth r in {0..R} and at R + 2 (`model(tokens,
num_recurrences=r)`): the early-exit / compute-quality curve of paper figure 3. It logs
`validation_metrics/loss_r{r}` and `validation_metrics/flops_per_token_r{r}` (eq. 1 at
depth r, forward, validation seq_len) and, on rank 0 with TensorBoard, the image
`validation_metrics/depth_curve`. Dense flavors log no per-r values.

With a distillation teacher (`[distill]`, set by GRTTrainer as `distiller`) the teacher scores
the same batches and `validation_metrics/distill_kd_loss` (T^2 KL per token at the eval
depth) is logged beside the student's `validation_metrics/loss`, which stays its CE.

`DepthwiseValidation` is the host-neutral part (the loop, its reduction, the metrics and the
console lines), shared with the torchtitan 0.3 host (grt_titan/torchtitan_0_3/validate.py);
`GRTValidator` and `build_grt_validator` are torchtitan 0.2.2's, built by its train spec.
Everything imported here exists on both hosts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.components.validate import BaseValidator, Validator
from torchtitan.distributed import utils as dist_utils
from torchtitan.tools import utils as tt_utils
from torchtitan.tools.logging import logger

from grt_titan.components.metrics import metrics_config
from grt_titan.data.loader import build_validation_dataloader
from grt_titan.model.recurrence import find_recurrence


def validation_depths(num_recurrences: int) -> list[int]:
    """{0..R} and R + 2 (extrapolation), in increasing order."""
    return list(range(num_recurrences + 1)) + [num_recurrences + 2]


def _plain(x: torch.Tensor) -> torch.Tensor:
    # With loss parallel (TP) the loss is a replicated DTensor.
    full_tensor = getattr(x, "full_tensor", None)
    return (full_tensor() if full_tensor is not None else x).detach()


def tensorboard_writers(metrics_processor) -> list[Any]:
    """SummaryWriters of torchtitan's TensorBoard loggers (only on the logging rank)."""
    from torchtitan.components.metrics import TensorBoardLogger

    root = getattr(metrics_processor, "logger", None)
    loggers = getattr(root, "_loggers", [root])  # LoggerContainer keeps them in `_loggers`
    return [(lg.writer, lg.tag) for lg in loggers if isinstance(lg, TensorBoardLogger)]


class DepthwiseValidation:
    """The host-neutral part of grt_titan's validator: each batch scored at every depth (or
    at the eval depth alone), reduced as torchtitan 0.2.2 reduces validation (the mean over
    batches of each batch's loss per valid token), logged under the same tags on both hosts.

    A host's Validator subclass supplies `validation_dataloader` (restarted at each pass),
    `validation_steps`, `validation_seq_len`, `model_inputs` and `summed_loss`; torchtitan's
    Validator the rest (`parallel_dims`, `loss_fn`, `validation_context`, `metrics_processor`).
    """

    distiller = None  # a Distiller (grt_titan/components/distill.py) with a teacher
    maybe_enable_amp: contextlib.AbstractContextManager = contextlib.nullcontext()  # 0.2.2's autocast
    _warned_no_plot = False

    def model_inputs(
        self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor, model_parts: list[nn.Module]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """(inputs, labels, the model's other keyword inputs): the host's post-processing."""
        raise NotImplementedError

    def summed_loss(self, pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss summed over the batch's valid tokens (the host's loss_fn)."""
        return self.loss_fn(pred, labels)

    def validation_batches(self, model_parts: list[nn.Module]) -> Iterator[tuple[torch.Tensor, ...]]:
        """This pass's batches on the device, at most `validation_steps` of them: (inputs,
        labels, other inputs, the batch's valid tokens over the data-parallel ranks)."""
        device = tt_utils.device_type
        for num_steps, (input_dict, labels) in enumerate(self.validation_dataloader):
            if self.validation_steps != -1 and num_steps >= self.validation_steps:
                break
            self.metrics_processor.ntokens_since_last_log += labels.numel()
            input_dict = {k: v.to(device) for k, v in input_dict.items()}
            inputs, labels, kwargs = self.model_inputs(input_dict, labels.to(device), model_parts)
            local_valid_tokens = (labels != IGNORE_INDEX).sum()
            if self.parallel_dims.dp_enabled:
                global_valid_tokens = dist_utils.dist_sum(local_valid_tokens, self.parallel_dims.get_mesh("batch"))
            else:
                global_valid_tokens = local_valid_tokens.float()
            yield inputs, labels, kwargs, global_valid_tokens

    def mean_losses(
        self, model: nn.Module, runs: list[int | None], eval_run: int | None, model_parts: list[nn.Module]
    ) -> list[float]:
        """Per run (a depth, None: the eval depth), the mean over batches of each batch's loss
        per valid token, summed over the loss mesh; with a teacher, its KD term last."""
        teacher = self.distiller
        totals = torch.zeros(len(runs) + (teacher is not None), dtype=torch.float64, device=tt_utils.device_type)
        num_steps = 0
        for inputs, labels, kwargs, global_valid_tokens in self.validation_batches(model_parts):
            losses = []
            with self.validation_context(), self.maybe_enable_amp:
                teacher_logits = teacher.teacher_logits(inputs, timed=False) if teacher is not None else None
                kd = None
                for r in runs:
                    pred = model(inputs, **kwargs, num_recurrences=r)
                    losses.append(_plain(self.summed_loss(pred, labels)).double() / global_valid_tokens)
                    if teacher is not None and r == eval_run:
                        kd = teacher.kd_sum(pred, teacher_logits, labels).double() / global_valid_tokens
                    del pred
                if teacher is not None:
                    losses.append(kd)
                del teacher_logits
            totals += torch.stack(losses)
            num_steps += 1
        totals /= max(num_steps, 1)
        if self.parallel_dims.dp_cp_enabled:
            import torch.distributed._functional_collectives as funcol

            totals = funcol.all_reduce(totals, reduceOp="sum", group=self.parallel_dims.get_optional_mesh("loss"))
        return totals.tolist()

    @torch.no_grad()
    def validate_depthwise(
        self, model_parts: list[nn.Module], step: int, eval_depth: int | None, depthwise: bool = True
    ) -> dict[int, float]:
        """One validation pass scoring each batch at every depth (`depthwise`; else at the
        eval depth only), and with a teacher its KD term; returns {r: loss}."""
        assert len(model_parts) == 1, "the GRT has no pipeline stages"
        model = model_parts[0]
        args = model.model_args
        depths = validation_depths(args.num_recurrences) if depthwise else []
        if depthwise and not args.extrapolates:  # one router (MoR) or adapter (RRT) per step: nothing past R
            depths = depths[:-1]
        # The eval-depth loss is one of the depths unless eval_recurrences is set elsewhere.
        runs: list[int | None] = depths + ([] if eval_depth in depths else [None])
        eval_run = eval_depth if eval_depth in depths else None
        model.eval()
        values = self.mean_losses(model, runs, eval_run, model_parts)
        by_run = dict(zip(runs, values))
        loss_at = {r: by_run[r] for r in depths}
        kd = values[-1] if self.distiller is not None else None
        self.log_depthwise(step, args, loss_at, by_run[eval_run], kd)
        model.train()
        return loss_at

    def log_depthwise(self, step: int, args, loss_at: dict[int, float], eval_loss: float, kd: float | None) -> None:
        """torchtitan's validation metrics and console line, plus the per-depth tags, the
        `validate step N  loss by depth r: ...` line and the depth-curve image."""
        depths = list(loss_at)
        flops = {r: args.forward_flops_per_token(self.validation_seq_len, r) for r in depths}
        extra = {}
        for r in depths:
            extra[f"validation_metrics/loss_r{r}"] = loss_at[r]
            extra[f"validation_metrics/flops_per_token_r{r}"] = flops[r]
        if kd is not None:
            extra["validation_metrics/distill_kd_loss"] = kd
        self.metrics_processor.log_validation(loss=eval_loss, step=step, extra_metrics=extra)
        if depths:
            logger.info(
                f"validate step {step:2}  loss by depth r: " + "  ".join(f"{r}: {loss_at[r]:.4f}" for r in depths)
            )
            self._log_depth_curve(step, args, depths, loss_at, flops)
        if kd is not None:
            logger.info(f"validate step {step:2}  distill kd: {kd:.4f} (the student's CE: {eval_loss:.4f})")

    def _log_depth_curve(self, step, args, depths, loss_at, flops) -> None:
        writers = tensorboard_writers(self.metrics_processor)
        if not writers:
            return
        try:
            from grt_titan.plots import early_exit_figure
        except ImportError as e:  # matplotlib missing: scalars are still logged
            if not self._warned_no_plot:
                logger.warning(f"no depth-curve image in TensorBoard ({e}); pip install matplotlib")
                self._warned_no_plot = True
            return
        fig = early_exit_figure(
            depths=depths,
            loss=[loss_at[r] for r in depths],
            flops=[flops[r] for r in depths],
            layers=[args.n_prelude_layers + r * args.n_core_layers + args.n_coda_layers for r in depths],
            trained_depth=args.num_recurrences,
            title=f"validation, step {step}",
        )
        for writer, tag in writers:
            name = "validation_metrics/depth_curve"
            writer.add_figure(name if tag is None else f"{tag}/{name}", fig, step, close=False)
        import matplotlib.pyplot as plt

        plt.close(fig)


class GRTValidator(DepthwiseValidation, Validator):
    """torchtitan 0.2.2's Validator on grt_titan's validation loader, scoring by depth
    (`DepthwiseValidation`) when `[grt_metrics] validation_depths` is on or a teacher is set."""

    def __init__(
        self,
        job_config,
        dp_world_size: int,
        dp_rank: int,
        tokenizer,
        parallel_dims,
        loss_fn,
        validation_context,
        maybe_enable_amp,
        metrics_processor,
        pp_schedule=None,
        pp_has_first_stage=None,
        pp_has_last_stage=None,
    ):
        # Validator.__init__ would build torchtitan's HF-datasets loader; set the same
        # fields around our own loader instead.
        BaseValidator.__init__(self, job_config)
        self.tokenizer = tokenizer
        self.parallel_dims = parallel_dims
        self.loss_fn = loss_fn
        self.validation_dataloader = build_validation_dataloader(
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            tokenizer=tokenizer,
            job_config=job_config,
            infinite=job_config.validation.steps != -1,
        )
        self.validation_context = validation_context
        self.maybe_enable_amp = maybe_enable_amp
        self.metrics_processor = metrics_processor
        self.pp_schedule = pp_schedule
        self.pp_has_first_stage = pp_has_first_stage
        self.pp_has_last_stage = pp_has_last_stage
        self.depthwise = metrics_config(job_config).validation_depths
        if job_config.validation.steps == -1:
            logger.warning("validation.steps = -1 may hang if ranks hold unequal sample counts")

    @property
    def validation_steps(self) -> int:
        return self.job_config.validation.steps

    @property
    def validation_seq_len(self) -> int:
        return self.job_config.validation.seq_len

    def model_inputs(
        self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor, model_parts: list[nn.Module]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        inputs, labels, extra_inputs, extra_kwargs = self.post_dataloading_process(input_dict, labels, model_parts)
        return inputs, labels, {**extra_inputs, **extra_kwargs}

    def validate(self, model_parts: list[nn.Module], step: int) -> None:
        recurrence = find_recurrence(model_parts)
        depthwise = self.depthwise and recurrence is not None
        if (not depthwise and self.distiller is None) or self.parallel_dims.pp_enabled:
            return super().validate(model_parts, step)
        eval_depth = recurrence.eval_recurrences if recurrence is not None else None
        return self.validate_depthwise(model_parts, step, eval_depth, depthwise)


def build_grt_validator(
    job_config,
    dp_world_size,
    dp_rank,
    tokenizer,
    parallel_dims,
    loss_fn,
    validation_context,
    maybe_enable_amp,
    metrics_processor=None,
    pp_schedule=None,
    pp_has_first_stage=None,
    pp_has_last_stage=None,
) -> GRTValidator:
    return GRTValidator(
        job_config,
        dp_world_size,
        dp_rank,
        tokenizer,
        parallel_dims,
        loss_fn,
        validation_context,
        maybe_enable_amp,
        metrics_processor,
        pp_schedule,
        pp_has_first_stage,
        pp_has_last_stage,
    )
