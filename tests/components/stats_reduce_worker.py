"""torchrun worker: each rank observes its own batch; the all-reduced stats must equal the
hand statistics of both batches pooled. Rank 0 writes both to the JSON path given."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from grt_titan.components.metrics import RecurrenceStats

from components_helpers import hand_step_stats, replay_steps, tiny_model


def batch(rank: int) -> torch.Tensor:
    return torch.randint(0, 255, (2, 16), generator=torch.Generator().manual_seed(100 + rank))


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = tiny_model().eval()  # eval: no noise, so rank 0 can replay every rank's forward
    stats = RecurrenceStats()
    model.recurrence.observer = stats.observe
    with torch.no_grad():
        model(batch(rank), num_recurrences=3)
    stats.all_reduce([mesh, None])
    got = stats.summary()
    if rank == 0:
        model.eval()
        per_rank = [replay_steps(model, batch(k), 3, seed=0) for k in range(world)]
        want = []
        for i in range(3):
            h, h_new, g, o = (torch.cat([steps[i][j] for steps in per_rank]) for j in range(4))
            want.append(hand_step_stats(h, h_new, g, o))
        with open(out_path, "w") as f:
            json.dump({"got": got, "want": want}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
