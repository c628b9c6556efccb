"""torchrun worker: FSDP collectives of one forward-backward of the GRT at several depths."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from grt_titan.infra.comm_stats import CollectiveCounter
from grt_titan.infra.parallelize import apply_fsdp
from grt_titan.model import grt_flavors
from tests.grt_test_helpers import build_model  # run as tests.infra.collective_worker from the repo root


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    results = {}
    for core_reshard in (False, True):
        args = grt_flavors["debug"].replace(vocab_size=512)
        model = build_model(args, before_init=lambda m: apply_fsdp(
            m, mesh, torch.float32, torch.float32, pp_enabled=False, core_reshard_after_forward=core_reshard))
        tokens = torch.randint(0, 512, (2, 16))
        for depth in (1, args.num_recurrences, 2 * args.num_recurrences):
            with CollectiveCounter() as counter:
                model(tokens, num_recurrences=depth).float().pow(2).mean().backward()
            results[f"{core_reshard}:{depth}"] = {"counts": dict(counter.counts), "bytes": dict(counter.bytes)}
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
