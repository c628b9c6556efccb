"""torchrun worker: one training step, then the next step's gradients, norms in float64.

torchtitan's logged grad_norm is torch's CPU fp32 norm, ~1e-4 off on the 50257 x 128 tensors
(grt_test_helpers.LOGGED_GRAD_NORM_REL says why); this worker measures each parameter's
gradient norm from its full tensor in float64, so layouts can be compared tightly.
Usage: torchrun ... -m tests.infra.grad_norm_worker OUT.json <torchtitan CLI args>
"""

import json
import sys

import torch

from grt_titan.cpu_support import enable_cpu_training

enable_cpu_training()

import torchtitan.distributed.utils as dist_utils  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.tools.logging import init_logger  # noqa: E402
from torchtitan.train import Trainer  # noqa: E402

import grt_titan  # noqa: E402,F401


def main(out_path: str, argv: list[str]) -> None:
    init_logger()
    trainer = Trainer(ConfigManager().parse_args(argv))
    trainer.checkpointer.load(step=-1)
    batches = trainer.batch_generator(trainer.dataloader)
    trainer.step = 1
    trainer.train_step(batches)  # forward, backward, clip, optimizer step
    trainer.optimizers.zero_grad()
    input_dict, labels = next(batches)
    local_tokens = (labels != -100).sum()
    if trainer.parallel_dims.dp_enabled:
        global_tokens = dist_utils.dist_sum(local_tokens, trainer.parallel_dims.get_mesh("batch"))
    else:
        global_tokens = local_tokens.float()
    trainer.forward_backward_step(input_dict=input_dict, labels=labels, global_valid_tokens=global_tokens)
    norms = {}
    for name, param in trainer.model_parts[0].named_parameters():
        grad = param.grad
        grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        norms[name] = grad.double().norm().item()
    if torch.distributed.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(norms, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
