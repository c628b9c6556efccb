"""torchrun worker: every rank draws depths with a different global RNG state; rank 0 checks equality."""

import json
import os
import sys

import torch
import torch.distributed as dist

from grt_titan.model import DepthSampler, grt_flavors


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1000 + rank)  # rank-local RNG differs on purpose
    sampler = DepthSampler(grt_flavors["debug"].replace(num_recurrences=8, depth_seed=11))
    draws = [sampler.sample() for _ in range(300)]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, draws)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ["OUT"])
