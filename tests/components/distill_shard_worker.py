"""torchrun worker: vocabulary-sharded KD (each rank its half of the columns, the sharded
log-sum-exp over the group) against the same loss on full rows, and each rank's gradient
against its columns of the full gradient. Rank 0 writes the comparison to the JSON path given."""

import json
import sys

import torch
import torch.distributed as dist

from grt_titan.components.distill_loss import IGNORE_INDEX, kd_loss_sum, kl_per_token


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)  # the same full logits on every rank
    student = 3 * torch.randn(2, 5, 12, generator=g, dtype=torch.float64)
    teacher = 3 * torch.randn(2, 5, 12, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 12, (2, 5), generator=g)
    labels[0, 1] = IGNORE_INDEX
    cols = slice(rank * 12 // world, (rank + 1) * 12 // world)

    full = student.clone().requires_grad_(True)
    want = kd_loss_sum(full, teacher, labels, temperature=2.0)
    want.backward()
    shard = student[..., cols].clone().requires_grad_(True)
    got = kd_loss_sum(shard, teacher[..., cols], labels, temperature=2.0, group=dist.group.WORLD)
    got.backward()  # every rank backprops the same replicated loss, as under loss parallel
    kl_full = kl_per_token(student, teacher, 2.0)
    kl_shard = kl_per_token(student[..., cols], teacher[..., cols], 2.0, group=dist.group.WORLD)
    result = {
        "loss": [want.item(), got.item()],
        "kl_diff": (kl_full - kl_shard).abs().max().item(),
        "grad_diff": (full.grad[..., cols] - shard.grad).abs().max().item(),
        "grad_norm": full.grad.abs().max().item(),
    }
    results = [None] * world
    dist.all_gather_object(results, result)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
