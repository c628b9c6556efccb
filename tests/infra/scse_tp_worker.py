"""torchrun worker (2 ranks, TP 2): SCSE's deviation step under `apply_scse_tp`, fed each
rank's sequence shard, against `deviation_step` on the whole sequence in one process. Sequence
0's deviation is zero on rank 1's half only, so a mask summed over the local shard alone would
hold that half still; sequence 1's is zero everywhere and must stay. Rank 0 writes the largest
difference to the JSON path given."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from grt_titan.infra.parallelize import apply_scse_tp
from grt_titan.model.methods.scse import deviation_step

from grt_test_helpers import SCSE_PARTS, build_model


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(**SCSE_PARTS)
    step = model.recurrence.step.deviation
    generator = torch.Generator().manual_seed(0)
    h, proposal = (torch.randn(2, 8, model.model_args.dim, generator=generator) for _ in range(2))
    delta = torch.randn(2, 8, model.model_args.dim, generator=generator)
    delta[0, 4:] = 0  # rank 1's half of sequence 0
    delta[1] = 0
    want = deviation_step(h, delta, proposal, step.step_size, step.mask_eps)
    apply_scse_tp(model.recurrence, init_device_mesh("cpu", (world,)))
    shard = slice(rank * 8 // world, (rank + 1) * 8 // world)
    got = step(h[:, shard], delta[:, shard], proposal[:, shard])
    pieces = [torch.empty_like(got) for _ in range(world)]
    dist.all_gather(pieces, got.contiguous())
    if rank == 0:
        got = torch.cat(pieces, dim=1)
        result = {
            "max_difference": (got - want).abs().max().item(),
            "sequence_0_second_half_moved": not torch.equal(got[0, 4:], h[0, 4:]),
            "sequence_1_still": torch.equal(got[1], h[1]),
            "plain_tensor": type(got) is torch.Tensor,
        }
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
