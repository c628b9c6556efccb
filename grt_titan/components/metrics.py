"""Metrics processor of the `grt` spec: r-aware FLOPs and what the recurrence does.

The logic is `GRTMetricsMixin`, host-neutral; `GRTMetricsProcessor` below is torchtitan
0.2.2's processor with it, grt_titan/torchtitan_0_3/metrics.py torchtitan 0.3's, so both
hosts log the same tags and console lines.

torchtitan fixes `num_flops_per_token` at start-up (the expectation over the depth
distribution, `GRTModelArgs.get_nparams_and_flops`); for the GRT it depends on r. Before
each log this processor sets it to the mean training count over the depths sampled since
the last log (so MFU and TFLOPS are right, a depth curriculum's ramp included: the sampler's
history holds the depths drawn), and logs `grt/r_mean` and `grt/r_last`. Its builder prints
the start-up line `Training depth: ...` (`depth_line`): the law, the start-up FLOPs, and the
depth curriculum when it is on.

With `[grt_metrics] enable = true` (the default) it also logs, for the step being logged,
the sampled depth `grt/r` and per recurrence step i (paper appendix E, figure 10):

| tag                          | value                                              |
|------------------------------|----------------------------------------------------|
| `grt_gate_mean/step{i}`      | mean of g over batch, tokens and features          |
| `grt_gate_std/step{i}`       | standard deviation of the same values              |
| `grt_gate_copy_frac/step{i}` | share of g > 0.95 (copy-saturated)                 |
| `grt_gate_write_frac/step{i}`| share of g < 0.05 (write-saturated)                |
| `grt_update_ratio/step{i}`   | rho = ||h_i - h_{i-1}|| / ||o_i - h_{i-1}|| (eq. 6) |

Cost: nothing on steps that are not logged. The processor arms the recurrence's step
observer (`Recurrence.observer`) from a forward pre-hook only for training forwards of a
step that `should_log` will log; the observer reduces each step to a few device scalars
(no host sync); they are all-reduced and read with one `.tolist()` in `log()`. With
`enable = false` no hook is installed at all. See docs/observability.md.

On 0.2.2 its builder also writes the run record `<dump_folder>/grt_run.json` on rank 0
(grt_titan/run_record.py; read by `grt-titan table`).
On CPU there is no peak FLOP rate to compare with (the CPU shim's peak is NaN, where
torchtitan would use an A100's): this processor prints `mfu: n/a (CPU)` and leaves
`mfu(%)` out of TensorBoard; `tflops` and `tps` are measured as on GPU. On torchtitan's fake
backend (a dry run: no collective moves data) MFU is not real either: `mfu: n/a (fake
backend)`, no `mfu(%)`; the builder logs grt_titan/runtime/fake_backend.py's one-line notice.
"""

import logging
import re
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable

import torch
from torch import nn
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools import utils as tt_utils
from torchtitan.tools.logging import logger

from grt_titan.model.args import GRTModelArgs
from grt_titan.model.recurrence import DepthSampler, Recurrence, StepRecord, find_recurrence
from grt_titan.model.step_stats import TRAINING_SUMS, step_row, summarize
from grt_titan.run_record import build_run_record, write_run_record
from grt_titan.runtime.fake_backend import NOTICE as FAKE_BACKEND_NOTICE
from grt_titan.runtime.fake_backend import is_fake_backend
from grt_titan.sections import GRTMetricsConfig


def metrics_config(job_config) -> GRTMetricsConfig:
    cfg = getattr(job_config, "grt_metrics", None)
    return cfg if cfg is not None else GRTMetricsConfig()


def _local(x: torch.Tensor) -> torch.Tensor:
    # Under TP a state may be a DTensor: take this rank's shard (the sums are all-reduced).
    to_local = getattr(x, "to_local", None)
    return (to_local() if to_local is not None else x).detach()


class RecurrenceStats:
    """Per-step sums of one training step, kept on the device until `summary()`.

    Row i-1 of `sums` holds the `TRAINING_SUMS` of recurrence step i
    (grt_titan/model/step_stats.py), summed over every armed forward (gradient-accumulation
    microbatches) and, after `all_reduce`, over ranks.
    """

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None
        self.depths: list[int] = []  # r of each observed forward

    def reset(self) -> None:
        self.sums = None
        self.depths = []

    @torch.no_grad()
    def observe(self, record: StepRecord) -> None:
        local = replace(
            record,
            state=_local(record.state),
            new_state=_local(record.new_state),
            gate=None if record.gate is None else _local(record.gate),
            proposal=_local(record.proposal),
        )
        row = step_row(local, full=False)  # on the device: no host sync
        if self.sums is None:
            self.sums = row.new_zeros(record.depth, len(TRAINING_SUMS))
        elif self.sums.shape[0] < record.depth:  # a deeper forward in the same step
            pad = self.sums.new_zeros(record.depth - self.sums.shape[0], len(TRAINING_SUMS))
            self.sums = torch.cat([self.sums, pad])
        self.sums[record.index - 1] += row
        if record.index == 1:
            self.depths.append(record.depth)

    def all_reduce(self, meshes) -> None:
        """Sum over the given device meshes (data-parallel `loss` mesh, `tp` mesh).

        Every rank runs the same depths (the depth sampler is rank-synchronous), so the
        tensors have the same shape on every rank.
        """
        if self.sums is None:
            return
        import torch.distributed._functional_collectives as funcol

        for mesh in meshes:
            if mesh is not None:
                self.sums = funcol.all_reduce(self.sums, reduceOp="sum", group=mesh)

    def summary(self) -> list[dict[str, float]]:
        """Per step i = 1.. : the `TRAINING_STATISTICS` (gate_mean, gate_std, gate_copy_frac,
        gate_write_frac, update_ratio)."""
        return summarize(self.sums) if self.sums is not None else []


class _RecordFilter(logging.Filter):
    def __init__(self, rewrite: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__()
        self.rewrite = rewrite

    def filter(self, record: logging.LogRecord) -> bool:
        return self.rewrite(record)


@contextmanager
def rewriting_log(rewrite: Callable[[logging.LogRecord], bool] | None):
    """While active, torchtitan's log records pass through `rewrite` (False drops one)."""
    if rewrite is None:
        yield
        return
    record_filter = _RecordFilter(rewrite)
    logger.addFilter(record_filter)
    try:
        yield
    finally:
        logger.removeFilter(record_filter)


_MFU_TEXT = re.compile(r"mfu: [^%\x1b]*%")
MFU_NOT_APPLICABLE = "mfu: n/a (CPU)"
MFU_FAKE_BACKEND = "mfu: n/a (fake backend)"


def _mfu_replaced_by(text: str) -> Callable[[logging.LogRecord], bool]:
    """A log rewrite that prints `text` in place of torchtitan's `mfu: X%`."""

    def rewrite(record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "mfu: " in record.msg:
            record.msg = _MFU_TEXT.sub(text, record.msg)
        return True

    return rewrite


class _WithoutKeys:
    """A torchtitan metric logger (TensorBoard, W&B) that leaves some keys out."""

    def __init__(self, inner, keys: tuple[str, ...]) -> None:
        self.inner = inner
        self.keys = keys

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.inner.log({k: v for k, v in metrics.items() if k not in self.keys}, step)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class GRTMetricsMixin:
    """The GRT's part of a metrics processor, shared by both hosts: depth-aware FLOPs,
    recurrence statistics, the console line, MFU on CPU.

    It sits before torchtitan's MetricsProcessor in a host's subclass (this module's for
    0.2.2, grt_titan/torchtitan_0_3/metrics.py for 0.3), whose constructors differ; the two
    share `log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)`,
    `should_log`, `parallel_dims`, `logger`, `num_flops_per_token` and the Trainer's
    assignments of `model_parts` and `optimizers`, which is all this class uses. The
    subclass calls `init_grt` before torchtitan's `__init__` (which assigns those two) and
    `hide_mfu_if_meaningless` after it (which builds `logger`).
    """

    def init_grt(
        self, model_args: GRTModelArgs | None, grt_metrics: GRTMetricsConfig, seq_len: int, fake_backend: bool
    ) -> None:
        """The GRT's state; `model_args` and `seq_len` price the sampled depths in `log`."""
        self._model_parts: list[nn.Module] | None = None
        self._optimizers = None
        self._recurrence: Recurrence | None = None
        self._hooks: list[Any] = []
        self.on_cpu = tt_utils.device_type == "cpu"
        self.fake_backend = fake_backend
        # What the console prints instead of MFU, if MFU means nothing here (None: it does).
        self.mfu_text = MFU_FAKE_BACKEND if fake_backend else MFU_NOT_APPLICABLE if self.on_cpu else None
        self.model_args = model_args
        self.seq_len = seq_len
        self.grt_metrics = grt_metrics
        self._sampler: DepthSampler | None = None
        self.stats = RecurrenceStats()
        # Step bookkeeping: which training step the next forward belongs to.
        self._last_logged_step: int | None = None  # None until the first log (resume)
        self._steps_since_log = 0
        self._optimizer_steps = 0
        self._stats_step = -1  # value of _optimizer_steps while `stats` was filled
        # More metrics on log steps: objects with `metrics() -> dict` (collective, every rank)
        # and `console_line(metrics) -> str` (the distillation's, grt_titan/components/distill.py).
        self.metric_sources: list[Any] = []

    def hide_mfu_if_meaningless(self) -> None:
        """Leave `mfu(%)` out of TensorBoard / W&B where `mfu_text` replaces it on the console."""
        if self.mfu_text is not None:
            self.logger = _WithoutKeys(self.logger, ("mfu(%)",))

    # ---- wiring (the Trainer sets these two attributes) --------------------------------

    @property
    def model_parts(self) -> list[nn.Module] | None:
        return self._model_parts

    @model_parts.setter
    def model_parts(self, parts: list[nn.Module] | None) -> None:
        self._model_parts = parts
        self._sampler = None
        if parts and self.grt_metrics.enable:
            self._install_observer(find_recurrence(parts))

    @property
    def optimizers(self):
        return self._optimizers

    @optimizers.setter
    def optimizers(self, optimizers) -> None:
        self._optimizers = optimizers
        if optimizers is not None and self.grt_metrics.enable:
            self._hooks.append(optimizers.register_step_post_hook(self._after_optimizer_step))

    def _install_observer(self, recurrence: Recurrence | None) -> None:
        self._recurrence = recurrence
        if recurrence is not None:
            self._hooks.append(recurrence.register_forward_pre_hook(self._before_recurrence))

    def remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._recurrence is not None and self._recurrence.observer == self.stats.observe:
            self._recurrence.observer = None

    def _after_optimizer_step(self, *args, **kwargs) -> None:
        self._optimizer_steps += 1
        self._steps_since_log += 1

    def upcoming_step(self) -> int | None:
        """The training step the next forward belongs to; None before the first log."""
        if self._last_logged_step is None:
            return None
        return self._last_logged_step + self._steps_since_log + 1

    def _before_recurrence(self, module: Recurrence, args) -> None:
        step = self.upcoming_step()
        # Before the first log of this process the step is unknown (a resumed run starts
        # at its checkpoint's step): observe every step until then, at most log_freq.
        armed = module.training and (step is None or self.should_log(step))
        if armed:
            if self._stats_step != self._optimizer_steps:  # first forward of a new step
                self.stats.reset()
                self._stats_step = self._optimizer_steps
            module.observer = self.stats.observe
        elif module.observer == self.stats.observe:
            module.observer = None

    # ---- logging -----------------------------------------------------------------------

    def depth_sampler(self) -> DepthSampler | None:
        if self._sampler is None:
            recurrence = find_recurrence(self.model_parts)
            self._sampler = recurrence.depth_sampler if recurrence is not None else None
        return self._sampler

    def recurrence_metrics(self) -> dict[str, float]:
        """Scalars of the step that just ran (empty if it was not observed); collective."""
        fresh = self._stats_step == self._optimizer_steps - 1 and self.stats.sums is not None
        if not fresh:
            self.stats.reset()
            return {}
        pd = self.parallel_dims
        self.stats.all_reduce(
            [
                pd.get_optional_mesh("loss") if pd.dp_cp_enabled else None,
                pd.get_optional_mesh("tp") if pd.tp_enabled else None,
            ]
        )
        metrics: dict[str, float] = {}
        if self.stats.depths:
            metrics["grt/r"] = sum(self.stats.depths) / len(self.stats.depths)
        for i, row in enumerate(self.stats.summary(), start=1):
            for name, value in row.items():
                metrics[f"grt_{name}/step{i}"] = value
        self.stats.reset()
        return metrics

    def depth_metrics(self) -> dict[str, float]:
        """`grt/r_mean` and `grt/r_last` of the depths sampled since the last log; sets
        `num_flops_per_token` to the mean training count over them (not the count at their
        mean: truncated backprop is not linear in r)."""
        sampler = self.depth_sampler()
        if sampler is None or not sampler.history:
            return {}
        history = sampler.history
        metrics = {"grt/r_mean": sum(history) / len(history), "grt/r_last": history[-1]}
        flops = sum(self.model_args.train_flops_per_token(self.seq_len, r) for r in history)
        self.num_flops_per_token = int(flops / len(history))
        history.clear()
        return metrics

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        extra_metrics = dict(extra_metrics or {})
        extra_metrics.update(self.depth_metrics())
        grt = self.recurrence_metrics() if self.grt_metrics.enable and self._recurrence is not None else {}
        extra_metrics.update(grt)
        sourced = [(source, source.metrics()) for source in self.metric_sources]
        for _, metrics in sourced:
            extra_metrics.update(metrics)
        with rewriting_log(_mfu_replaced_by(self.mfu_text) if self.mfu_text is not None else None):
            super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)
        if grt:
            logger.info(console_line(grt))
        for source, metrics in sourced:
            if metrics:
                logger.info(source.console_line(metrics))
        self._last_logged_step = step
        self._steps_since_log = 0

    def close(self):
        self.remove_hooks()
        super().close()


class GRTMetricsProcessor(GRTMetricsMixin, MetricsProcessor):
    """torchtitan 0.2.2's MetricsProcessor plus the GRT's depth-aware FLOPs and recurrence
    stats (GRTMetricsMixin).

    Hooks are installed when the Trainer assigns `model_parts` and `optimizers` (plain
    attribute assignments in torchtitan's Trainer.__init__), so no trainer code changes.
    """

    def __init__(self, job_config, parallel_dims, model_args: GRTModelArgs, tag: str | None = None):
        self.init_grt(model_args, metrics_config(job_config), job_config.training.seq_len, is_fake_backend(job_config))
        super().__init__(job_config, parallel_dims, tag)
        self.hide_mfu_if_meaningless()


def console_line(metrics: dict[str, float]) -> str:
    """`grt  r: 3  gate: .97 .95 .94  copy: .80 .71 .69  rho: .04 .06 .07` (one number per step)."""

    def row(name: str) -> str:
        values, i = [], 1
        while f"grt_{name}/step{i}" in metrics:
            values.append(f"{metrics[f'grt_{name}/step{i}']:.3f}".lstrip("0") or "0")
            i += 1
        return " ".join(values)

    r = metrics.get("grt/r")
    r_text = f"{r:g}" if r is not None else "?"
    return f"grt  r: {r_text}  gate: {row('gate_mean')}  copy: {row('gate_copy_frac')}  rho: {row('update_ratio')}"


def depth_line(args: GRTModelArgs, seq_len: int) -> str:
    """The start-up line on the training depth: its law, the start-up FLOPs per token (the
    expectation over the law), that the logged ones follow the sampled depths, and the depth
    curriculum when it is on (its first steps run shallower than the start-up value says)."""
    law = args.part("depth_sampling")
    if law.choice == "fixed":
        depth = f"r = {args.num_recurrences}"
    elif law.choice == "uniform":
        depth = f"r ~ Uniform{{{args.min_recurrences}..{args.num_recurrences}}}"
    else:
        depth = f"r ~ Poisson(tau) + 1, E[r] = {args.expected_recurrences:g}"
    flops = args.expected_train_flops_per_token(seq_len)
    line = (
        f"Training depth: {depth}; {flops:.4g} training FLOPs per token at start-up (over that law), "
        "the logged TFLOPS and MFU follow the depths sampled"
    )
    steps = args.depth_curriculum_steps
    if steps:
        end = (
            f"E[r] = {args.expected_recurrences:g}" if law.choice == "poisson_lognormal" else f"{args.num_recurrences}"
        )
        line += (
            f"; depth curriculum on: {law.ramps} ramps {args.min_recurrences} -> {end} ({args.depth_curriculum_shape}) "
            f"over the first {steps} optimizer steps ({steps * args.forwards_per_step} forwards, "
            f"{args.forwards_per_step} per step), which cost less than the start-up value"
        )
    if args.step_supervision and args.step_supervision_steps:
        line += (
            f"; per-step supervision for the first {args.step_supervision_steps} optimizer steps, then the final "
            "answer alone (outcome-only annealing; those steps skip the per-step readouts the start-up FLOPs count)"
        )
    return line


def build_grt_metrics_processor(job_config, parallel_dims, model_args=None, tag=None) -> GRTMetricsProcessor:
    """The spec's processor; rank 0 also writes the run record (grt_titan/run_record.py).

    torchtitan's Trainer calls this right after `model_args.update_from_config`: the first
    hook that sees the args with the `[grt]` overrides applied, on every start of a job.
    """
    if is_fake_backend(job_config):  # once per start, before any number is logged
        logger.info(FAKE_BACKEND_NOTICE)
    if model_args is not None and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
        batch_degree = parallel_dims.dp_replicate * parallel_dims.dp_shard
        record = build_run_record(job_config, model_args, parallel_dims.world_size, batch_degree)
        path = write_run_record(job_config.job.dump_folder, record)
        logger.info(f"Run record: {path}")
        if model_args.is_recurrent:
            logger.info(depth_line(model_args, job_config.training.seq_len))
    return GRTMetricsProcessor(job_config, parallel_dims, model_args, tag)
