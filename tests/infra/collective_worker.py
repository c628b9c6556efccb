"""torchrun worker: FSDP collectives of one forward-backward of each method at several depths."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from grt_titan.infra.comm_stats import CollectiveCounter
from grt_titan.infra.parallelize import apply_fsdp
from grt_titan.model import grt_flavors
from grt_titan.model.part import TrainingOutput

# run as tests.infra.collective_worker from the repo root
from tests.grt_test_helpers import MOR_PARTS, OURO_PARTS, POISSON_PARTS, RRT_PARTS, build_model

# Each method's parts, and whether it runs above R (RRT has adapters and MoR routers up to R).
METHODS = {
    "grt": ({}, True),
    "poisson": (POISSON_PARTS, True),
    "rrt": (RRT_PARTS, False),
    "ouro": (OURO_PARTS, True),
    "mor": (MOR_PARTS, False),
    "mor_token_choice": ({**MOR_PARTS, "router": "token_choice"}, False),
}


def scalar_loss(out) -> torch.Tensor:
    """A loss that reaches every parameter the method trains (step weights: Ouro's exit gate)."""
    if not isinstance(out, TrainingOutput):
        return out.float().pow(2).mean()
    loss = (out.logits if out.step_logits is None else out.step_logits).float().pow(2).mean()
    if out.step_weights is not None:
        loss = loss + out.step_weights.float().pow(2).mean()
    return loss if out.aux_loss_sum is None else loss + out.aux_loss_sum


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    results = {}
    for method, (parts, above_r) in METHODS.items():
        for core_reshard in (False, True) if method == "grt" else (True,):
            args = grt_flavors["debug"].replace(vocab_size=512, **parts)
            model = build_model(
                args,
                before_init=lambda m: apply_fsdp(
                    m, mesh, torch.float32, torch.float32, pp_enabled=False, core_reshard_after_forward=core_reshard
                ),
            )
            tokens = torch.randint(0, 512, (2, 16))
            depths = (1, args.num_recurrences, 2 * args.num_recurrences) if above_r else (1, args.num_recurrences)
            for depth in depths:
                with CollectiveCounter() as counter:
                    scalar_loss(model(tokens, num_recurrences=depth)).backward()
                results[f"{method}:{core_reshard}:{depth}"] = {
                    "counts": dict(counter.counts),
                    "bytes": dict(counter.bytes),
                }
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
