"""Fault-tolerant training through torchft (docs/fault_tolerance.md).

torchtitan 0.2.2 joins torchft's quorum only in `torchtitan.experiments.ft.train.FTTrainer`;
its plain `Trainer`, which `GRTTrainer` extends, ignores `[fault_tolerance]`. Here the two are
composed: `GRTFaultTolerantTrainer` is GRTTrainer's reliability pieces (checksummed
checkpoints, the spike rewind, distillation) over FTTrainer's quorum, managed replicate
group, data split across groups and semi-synchronous training (DiLoCo / local SGD). What
grt_titan adds:
- a start-up check that stops in one line when torchft is missing or no lighthouse answers,
  so a run never trains unprotected while its config says it is protected;
- the cross-group gradient average for layouts without FSDP (FTTrainer averages through
  FSDP's all-reduce hook only: with one rank per group it would not average at all);
- the current learning rate for a healing group (FTTrainer serves the first step's), the
  mean loss over groups on the console (FTTrainer logs their sum), one checkpoint folder per
  group, the live-group count as a metric and a line for each heal and uncommitted step.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import socket
import time
from urllib.parse import urlparse

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.distributed_c10d import ReduceOp
from torch.distributed.tensor import DTensor
from torchtitan.experiments.ft.train import FTTrainer
from torchtitan.tools.logging import logger

from grt_titan.components.checkpoint import checkpoint_subfolder
from grt_titan.components.metrics import rewriting_log
from grt_titan.components.trainer import GRTTrainer

FT_INSTALL_HINT = 'pip install -e ".[ft]"'
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own variable for the lighthouse address
QUORUM_RETRIES_ENV = "TORCHFT_QUORUM_RETRIES"  # torchft's: how often a quorum request is retried
STRUCTURED_LOGGERS = ("torchft_commits", "torchft_quorums")
LIGHTHOUSE_COMMAND = "torchft_lighthouse --min_replicas 1 --bind [::]:29510"
SEMI_SYNC_METHODS = ("diloco", "local_sgd")
# The key torchtitan's CheckpointManager registers its state-dict functions under in torchft
# (`Manager.set_state_dict_fns`).
TORCHTITAN_STATE_KEY = "set_state_dict_fns"
# Gradients are averaged across groups in flat buckets of at most this many elements.
BUCKET_ELEMENTS = 1 << 24


class FaultToleranceError(RuntimeError):
    """`[fault_tolerance] enable = true` cannot be honoured: the run stops before training."""


def config_problems(job_config) -> list[str]:
    """What `[fault_tolerance]` cannot run with, each naming the key and what is allowed."""
    ft = job_config.fault_tolerance
    problems = []
    if ft.group_size < 1:
        problems.append(f"[fault_tolerance] group_size = {ft.group_size}: set the number of replica groups (>= 1)")
    elif not 0 <= ft.replica_id < ft.group_size:
        problems.append(
            f"[fault_tolerance] replica_id = {ft.replica_id}: allowed 0..{ft.group_size - 1} (group_size - 1)"
        )
    if ft.quorum_retries < 0:
        problems.append(f"[fault_tolerance] quorum_retries = {ft.quorum_retries}: allowed >= 0")
    if ft.min_replica_size < 1:
        problems.append(f"[fault_tolerance] min_replica_size = {ft.min_replica_size}: allowed >= 1")
    if ft.semi_sync_method is not None and ft.semi_sync_method.lower() not in SEMI_SYNC_METHODS:
        problems.append(
            f"[fault_tolerance] semi_sync_method = {ft.semi_sync_method!r}: allowed {', '.join(SEMI_SYNC_METHODS)} "
            "or unset (synchronous)"
        )
    if ft.num_fragments != 1 or ft.module_fqns_per_model_fragment:
        problems.append(
            f"[fault_tolerance] num_fragments = {ft.num_fragments} / module_fqns_per_model_fragment: allowed 1 / "
            "empty (Streaming DiLoCo's fragments need a fragment function the GRT spec does not define; "
            "torchtitan would sync the whole model as one)"
        )
    if job_config.parallelism.data_parallel_replicate_degree != 1:
        problems.append(
            f"[parallelism] data_parallel_replicate_degree = {job_config.parallelism.data_parallel_replicate_degree} "
            "with [fault_tolerance]: allowed 1 (the replica groups are the replicate dimension)"
        )
    if ft.process_group not in ("gloo", "nccl"):
        problems.append(f"[fault_tolerance] process_group = {ft.process_group!r}: allowed gloo, nccl")
    return problems


def lighthouse_address(job_config) -> str:
    return job_config.fault_tolerance.lighthouse or os.environ.get(LIGHTHOUSE_ENV, "")


def wait_for_lighthouse(address: str, timeout_s: float) -> None:
    """Return once a TCP connection to the lighthouse opens; raise after `timeout_s`."""
    parsed = urlparse(address if "://" in address else f"http://{address}")
    host, port = parsed.hostname, parsed.port or 29510
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(timeout_s, 0.1))):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise FaultToleranceError(
                    f"[fault_tolerance] enable = true, but no torchft lighthouse answered at {address} within "
                    f"{timeout_s:g} s ([fault_tolerance] lighthouse_timeout_seconds); start one "
                    f"(`{LIGHTHOUSE_COMMAND}`) or point [fault_tolerance] lighthouse / {LIGHTHOUSE_ENV} at it"
                ) from None
            time.sleep(0.2)


def check_can_run(job_config) -> None:
    """Stop before anything is built unless torchft and a lighthouse are there."""
    problems = config_problems(job_config)
    if problems:
        raise ValueError("invalid job config: " + "; ".join(problems))
    if importlib.util.find_spec("torchft") is None:
        raise FaultToleranceError(
            f"[fault_tolerance] enable = true, but torchft is not installed; install the extra: {FT_INSTALL_HINT}"
        )
    address = lighthouse_address(job_config)
    if not address:
        raise FaultToleranceError(
            f"[fault_tolerance] enable = true, but no lighthouse is named: set [fault_tolerance] lighthouse "
            f"(http://host:29510) or {LIGHTHOUSE_ENV}; start one with `{LIGHTHOUSE_COMMAND}`"
        )
    wait_for_lighthouse(address, job_config.fault_tolerance.lighthouse_timeout_seconds)
    os.environ[LIGHTHOUSE_ENV] = address  # torchft's Manager reads the address from here
    os.environ.setdefault(QUORUM_RETRIES_ENV, str(job_config.fault_tolerance.quorum_retries))
    for name in STRUCTURED_LOGGERS:  # records for torchft's OpenTelemetry export: blank on a console
        logging.getLogger(name).setLevel(logging.WARNING)


def local_gradients(parameters) -> list[torch.Tensor]:
    """Each parameter's gradient as this rank holds it (a TP shard's local part)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    return [g.to_local() if isinstance(g, DTensor) else g for g in grads]


def average_gradients(manager, grads: list[torch.Tensor], bucket_elements: int = BUCKET_ELEMENTS) -> None:
    """Average `grads` in place across the quorum's participating groups (torchft's
    `Manager.allreduce`: a healing group contributes zeros, the sum is divided by the
    participants), in flat buckets per dtype, all in flight before the first wait."""
    pending = []
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for group in by_dtype.values():
        start = 0
        while start < len(group):
            bucket, size = [], 0
            while start < len(group) and (not bucket or size + group[start].numel() <= bucket_elements):
                bucket.append(group[start])
                size += group[start].numel()
                start += 1
            flat = _flatten_dense_tensors(bucket)
            pending.append((manager.allreduce(flat), flat, bucket))
    for work, flat, bucket in pending:
        work.wait()
        for grad, averaged in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            grad.copy_(averaged)


def _not_the_dataloader_warning(record: logging.LogRecord) -> bool:
    """torchtitan warns that groups may retrain data when per-step data checkpoints are off;
    here each group's full checkpoint holds its data position (docs/fault_tolerance.md)."""
    return "enable_ft_dataloader_checkpoints is False" not in record.getMessage()


class LiveGroups:
    """A metrics source (GRTMetricsProcessor.metric_sources): the quorum's groups at log steps."""

    def __init__(self, manager, group_size: int):
        self.manager = manager
        self.group_size = group_size
        self.uncommitted = 0  # steps a failed group kept from committing, so far

    def metrics(self) -> dict[str, float]:
        return {
            "fault_tolerance/live_groups": float(self.manager.num_participants()),
            "fault_tolerance/uncommitted_steps": float(self.uncommitted),
        }

    def console_line(self, metrics: dict[str, float]) -> str:
        live = int(metrics["fault_tolerance/live_groups"])
        return f"fault tolerance: {live}/{self.group_size} replica groups live, {self.uncommitted} steps not committed"


class GRTFaultTolerantTrainer(GRTTrainer, FTTrainer):
    """GRTTrainer over torchtitan's FTTrainer (MRO: GRT pieces, then FT's init and loop)."""

    def __init__(self, job_config):
        check_can_run(job_config)
        super().__init__(job_config)
        manager = self.ft_manager.manager
        # FTTrainer averages across groups through FSDP's all-reduce hook; without FSDP
        # (one rank per group, TP alone) the gradients are averaged here, before clipping.
        self.averages_gradients = self.ft_manager.use_async_quorum and not self.parallel_dims.fsdp_enabled
        self._microbatches_left = 0
        if self.ft_manager.loss_sync_pg is not None and self.parallel_dims.dp_cp_enabled:
            self._log_the_mean_loss_over_groups()
        self.live_groups = LiveGroups(manager, job_config.fault_tolerance.group_size)
        self.metrics_processor.metric_sources.append(self.live_groups)
        ft = job_config.fault_tolerance
        logger.info(
            f"Fault tolerance: replica group {ft.replica_id} of {ft.group_size}, lighthouse "
            f"{os.environ[LIGHTHOUSE_ENV]}, "
            + (f"{ft.semi_sync_method} every {ft.sync_steps} steps" if ft.semi_sync_method else "synchronous")
        )

    def _log_the_mean_loss_over_groups(self) -> None:
        """FTTrainer sums each group's mean loss over the groups (a SUM on torchft's managed
        group): the console would show 2x the loss with 2 groups. The logged loss is divided
        by the groups whose loss is in the sum, counted by the same collective (torchft adds
        0 for a group that is healing, as at the first step's initial sync)."""
        log, manager = self.metrics_processor.log, self.ft_manager.manager

        def log_mean_over_groups(step, global_avg_loss, *args, **kwargs):
            contributed = torch.ones((), device=self.device)
            manager.allreduce(contributed, reduce_op=ReduceOp.SUM).wait()
            return log(step, global_avg_loss / max(contributed.item(), 1.0), *args, **kwargs)

        self.metrics_processor.log = log_mean_over_groups

    def build_checkpointer(self, checkpoint_config, sd_adapter, ft_manager=None):
        """Every group checkpoints everything (its data position too) in its own folder,
        `<checkpoint.folder>/replica_<id>`: a whole-job restart needs no shared file system,
        and each group's last checkpoint exports. (torchtitan saves the model from the
        quorum's first group only, and each group's data position every step.)"""
        config = dataclasses.replace(
            checkpoint_config,
            folder=checkpoint_subfolder(self.job_config),
            enable_ft_dataloader_checkpoints=False,
        )
        # torchtitan's CheckpointManager, built by FTTrainer and replaced by ours, gave torchft
        # its state-dict functions; torchft takes one registration per key and has no call
        # that removes one. Ours registers the same states (model, optimizer, schedule, step).
        manager = self.ft_manager.manager
        manager._load_state_dict_fns.pop(TORCHTITAN_STATE_KEY, None)
        manager._user_state_dicts.pop(TORCHTITAN_STATE_KEY, None)
        with rewriting_log(_not_the_dataloader_warning):
            return super().build_checkpointer(config, sd_adapter, ft_manager=self.ft_manager)

    def train_step(self, data_iterator):
        self._microbatches_left = self.gradient_accumulation_steps
        manager = self.ft_manager.manager
        committed_before, step = manager.current_step(), self.step
        result = super().train_step(data_iterator)
        if self.step != step:  # torchft loaded a live group's train state (and weights) in the step
            logger.warning(
                f"Fault tolerance: healed from a live replica group (weights, optimizer, schedule and "
                f"step): continuing at step {self.step}, not {step}; this group's batch of the step is not trained on"
            )
        # torchtitan's FT optimizer serves healing groups a state dict cached at start-up:
        # its tensors are live, but its param_groups (the learning rate) are the first
        # step's. Refreshed after each step, a healed group steps with the current rate.
        self.optimizers.init_cache_state_dict()
        if self.ft_manager.use_async_quorum and manager.current_step() == committed_before:
            self.live_groups.uncommitted += 1
            logger.warning(
                f"Fault tolerance: step {self.step} was not committed (a replica group failed or the "
                f"quorum has fewer than min_replica_size groups); its "
                f"{self.gradient_accumulation_steps * self.job_config.training.local_batch_size} sequences "
                "per rank are not trained on"
            )
        return result

    def forward_backward_step(self, *args, **kwargs):
        loss = super().forward_backward_step(*args, **kwargs)
        self._microbatches_left -= 1
        if self.averages_gradients and self._microbatches_left == 0:
            params = [p for part in self.model_parts for p in part.parameters()]
            average_gradients(self.ft_manager.manager, local_gradients(params))
        return loss
