"""A replica group of a fault-tolerant job (grt_titan.train's main, GRTFaultTolerantTrainer)
that prints, after every step, what the tests compare across groups:

    FT step=<trainer step> committed=<torchft's committed steps> live=<groups in the quorum>
       weights=<sha256 of every parameter's bytes> sent=<bytes this group all-reduced in the step>

and, once per heal, `FT healed bytes=<tensor bytes of the state received from a live group>`
(benchmarks/ft_bench.py reports both).

`FT_STEP_SLEEP` (seconds, default 0) paces the steps so a test can kill and restart groups
mid-run; `FT_SPIKE_STEP=k` multiplies the loss of step k by 50 (a planted loss spike). Usage: python -m tests.reliability.ft_worker <torchtitan CLI args>
"""

import hashlib
import os
import sys
import time

from grt_titan.train import main as train_main


def weights_digest(model_parts) -> str:
    digest = hashlib.sha256()
    for part in model_parts:
        for name, param in sorted(part.named_parameters()):
            digest.update(name.encode())
            local = param.to_local() if hasattr(param, "to_local") else param  # FSDP: this rank's shard
            digest.update(local.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def tensor_bytes(state) -> int:
    import torch
    from torch.utils._pytree import tree_leaves

    return sum(x.numel() * x.element_size() for x in tree_leaves(state) if isinstance(x, torch.Tensor))


def reporting_trainer() -> type:
    from grt_titan.components.fault_tolerance import GRTFaultTolerantTrainer

    pause = float(os.environ.get("FT_STEP_SLEEP", "0"))
    spike_step = int(os.environ.get("FT_SPIKE_STEP", "0"))

    class ReportingTrainer(GRTFaultTolerantTrainer):
        def __init__(self, job_config):
            super().__init__(job_config)
            self.sent = 0
            manager = self.ft_manager.manager
            allreduce, receive = manager.allreduce, manager._checkpoint_transport.recv_checkpoint

            def counted_allreduce(tensor, *args, **kwargs):
                self.sent += tensor.numel() * tensor.element_size()
                return allreduce(tensor, *args, **kwargs)

            def counted_receive(*args, **kwargs):
                state = receive(*args, **kwargs)
                print(f"FT healed bytes={tensor_bytes(state)}", flush=True)
                return state

            manager.allreduce, manager._checkpoint_transport.recv_checkpoint = counted_allreduce, counted_receive
            loss_fn = self.loss_fn

            def planted_spike(*args, **kwargs):
                loss = loss_fn(*args, **kwargs)
                return loss * 50 if self.step == spike_step else loss

            self.loss_fn = planted_spike

        def train_step(self, data_iterator):
            result = super().train_step(data_iterator)
            manager = self.ft_manager.manager
            print(
                f"FT step={self.step} committed={manager.current_step()} live={manager.num_participants()} "
                f"weights={weights_digest(self.model_parts)} sent={self.sent}",
                flush=True,
            )
            self.sent = 0
            time.sleep(pause)
            return result

    return ReportingTrainer


if __name__ == "__main__":
    train_main(sys.argv[1:], trainer_class=reporting_trainer())
