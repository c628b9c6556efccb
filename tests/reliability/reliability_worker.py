"""torchrun worker of the reliability tests: `grt_titan.train` plus test-only controls.

    torchrun ... -m tests.reliability.reliability_worker <the grt_titan.train arguments>

It runs torchtitan's own `main` with a Trainer subclass; the model, spec and plugin code
are untouched. Controls, all from the environment and all optional:

    GRT_TEST_PID_DIR            write DIR/rank{RANK}-attempt{TORCHELASTIC_RESTART_COUNT}.pid
    GRT_TEST_STOP_AFTER=k       end training after step k (a preemption right after the
                                checkpoint of step k; the LR schedule keeps training.steps)
    GRT_TEST_POISON_STEP=k      after gradient clipping at step k, rank GRT_TEST_POISON_RANK
    GRT_TEST_POISON_RANK=r      sets one element of its local gradient shard to NaN (the
                                inf-norm case: only the rank holding the inf sees NaN)
    GRT_TEST_KILL_IN_SAVE_STEP=k  on the first attempt, rank GRT_TEST_KILL_RANK SIGKILLs
    GRT_TEST_KILL_RANK=r          itself in the checkpoint save of step k, after writing its
                                  shard (so the step-k folder is half-written: no .metadata);
                                  it first lists the folder into DIR/kill_in_save.json
    GRT_TEST_RECORD_DIR         every rank appends "step position sequence" per training
                                sample it reads to DIR/rank{RANK}-attempt{...}.txt
    GRT_TEST_SPIKE_STEP=k       on the first attempt, the loss of step k is multiplied by 50
                                (a planted loss spike)
"""

from __future__ import annotations

import json
import os
import signal

from grt_titan.runtime.cpu_support import enable_cpu_training

_STEP = {"value": 0}


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _write_pid() -> None:
    pid_dir = os.environ.get("GRT_TEST_PID_DIR")
    if pid_dir:
        os.makedirs(pid_dir, exist_ok=True)
        with open(os.path.join(pid_dir, f"rank{_rank()}-attempt{_attempt()}.pid"), "w") as f:
            f.write(str(os.getpid()))


def _install_poison() -> None:
    step, rank = _env_int("GRT_TEST_POISON_STEP"), _env_int("GRT_TEST_POISON_RANK")
    if step is None or rank != _rank():
        return
    import torch
    import torchtitan.distributed.utils as dist_utils
    from torch.distributed.tensor import DTensor

    clip = dist_utils.clip_grad_norm_

    def clip_then_poison(parameters, *args, **kwargs):
        parameters = list(parameters)
        norm = clip(parameters, *args, **kwargs)
        if _STEP["value"] == step:
            for p in parameters:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                if g is not None and g.numel():
                    with torch.no_grad():
                        g.view(-1)[0] = float("nan")
                    break
        return norm

    dist_utils.clip_grad_norm_ = clip_then_poison  # train.py calls dist_utils.clip_grad_norm_


def _install_kill_in_save() -> None:
    step, rank = _env_int("GRT_TEST_KILL_IN_SAVE_STEP"), _env_int("GRT_TEST_KILL_RANK")
    if step is None or rank != _rank() or _attempt() != 0:
        return
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    write_data = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):
        future = write_data(self, plan, planner)
        if _STEP["value"] == step:
            future.wait()  # this rank's shard is on disk; the coordinator's .metadata is not
            folder = str(self.path)
            report = {"folder": folder, "files": sorted(os.listdir(folder))}
            with open(os.path.join(os.environ["GRT_TEST_PID_DIR"], "kill_in_save.json"), "w") as f:
                json.dump(report, f)
            os.kill(os.getpid(), signal.SIGKILL)
        return future

    FileSystemWriter.write_data = write_then_die


def _install_record() -> None:
    record_dir = os.environ.get("GRT_TEST_RECORD_DIR")
    if not record_dir:
        return
    from grt_titan.data.loader import TokenSequenceDataset

    os.makedirs(record_dir, exist_ok=True)
    path = os.path.join(record_dir, f"rank{_rank()}-attempt{_attempt()}.txt")
    getitem = TokenSequenceDataset.__getitem__

    def recorded_getitem(self, k):  # the training split only: the runs have no validation
        d = self.position(k) + self.dp_rank
        with open(path, "a") as f:
            f.write(f"{_STEP['value']} {d} {self.sequence_number(d)}\n")
        return getitem(self, k)

    TokenSequenceDataset.__getitem__ = recorded_getitem  # num_workers = 0: the main process reads


def main() -> None:
    enable_cpu_training()
    from grt_titan.components.trainer import GRTTrainer
    from grt_titan.train import main as grt_main

    stop_after = _env_int("GRT_TEST_STOP_AFTER")
    spike_step = _env_int("GRT_TEST_SPIKE_STEP") if _attempt() == 0 else None

    class ReliabilityTrainer(GRTTrainer):
        def should_continue_training(self) -> bool:
            if stop_after is not None and self.step >= stop_after:
                return False
            return super().should_continue_training()

        def __init__(self, job_config):
            super().__init__(job_config)
            loss_fn = self.loss_fn

            def planted_spike(*args, **kwargs):
                loss = loss_fn(*args, **kwargs)
                return loss * 50 if self.step == spike_step else loss

            self.loss_fn = planted_spike

        def train_step(self, data_iterator):
            _STEP["value"] = self.step
            super().train_step(data_iterator)

    _write_pid()
    _install_poison()
    _install_kill_in_save()
    _install_record()
    grt_main(trainer_class=ReliabilityTrainer)


if __name__ == "__main__":
    main()
