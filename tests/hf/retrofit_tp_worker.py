"""torchrun worker: a retrofitted GRT under tensor parallelism (2 gloo ranks) computes the
logits of the single-device model; run as tests.hf.retrofit_tp_worker SRC OUT_JSON."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from grt_titan.hf.retrofit import plan_layers, retrofit_model
from grt_titan.infra.parallelize import apply_tp


def main(src: str, out_path: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    model, _, _ = retrofit_model(src, plan_layers(4, 1, (1, 3), 1), num_recurrences=3)
    model.eval()
    with torch.no_grad():  # a random open-ish gate, so loops 2..3 use every gate weight too
        model.recurrence.step.gate.w_out.weight.normal_(0, 0.02)
        model.recurrence.step.gate.w_out.bias.zero_()
    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = {r: model(tokens, num_recurrences=r) for r in (1, 3)}
    apply_tp(model, mesh, loss_parallel=False, enable_float8_tensorwise_tp=False)
    sharded = [name for name, p in model.named_parameters() if "Shard" in str(getattr(p, "placements", ""))]
    with torch.no_grad():
        diffs = {str(r): (model(tokens, num_recurrences=r) - reference[r]).abs().max().item() for r in (1, 3)}
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({"diffs": diffs, "sharded": sharded}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
