"""Counts float8 weight casts of one forward-backward at several depths (fake process group).

FSDP's float8 all-gather casts a weight when it gathers it; a Float8Linear whose weight
arrives already in float8 does not cast it again. The recurrence is one FSDP unit gathered
once per forward-backward, so its weights must be cast once per step whatever r is.
Usage: python -m tests.infra.float8_cast_worker OUT.json
"""

import json
import sys
from collections import Counter

import torch
import torch.distributed as dist
import torchao.float8.float8_linear as float8_linear
import torchao.float8.fsdp_utils as fsdp_utils
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchao.float8 import Float8LinearConfig, convert_to_float8_training

from grt_titan.infra.parallelize import apply_fsdp

from tests.grt_test_helpers import build_model  # run as tests.infra.float8_cast_worker from the repo root

CASTS: Counter = Counter()


def counting(original, where):
    def wrapper(tensor, *args, **kwargs):
        role = kwargs.get("gemm_input_role")
        CASTS[(where, getattr(role, "name", str(role)))] += 1
        return original(tensor, *args, **kwargs)

    return wrapper


def main(out_path: str) -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))
    float8_linear.hp_tensor_to_float8_dynamic = counting(float8_linear.hp_tensor_to_float8_dynamic, "linear")
    fsdp_utils.hp_tensor_to_float8_dynamic = counting(fsdp_utils.hp_tensor_to_float8_dynamic, "all_gather")

    def float8_and_fsdp(model):
        # Only the recurrence's linears are converted, so every weight cast counted is the core's.
        convert_to_float8_training(
            model,
            config=Float8LinearConfig(enable_fsdp_float8_all_gather=True, emulate=True),
            module_filter_fn=lambda module, fqn: fqn.startswith("recurrence."),
        )
        apply_fsdp(model, mesh, torch.float32, torch.float32, pp_enabled=False)

    model = build_model("debug", vocab_size=512, before_init=float8_and_fsdp)
    results = {}
    for depth in (1, 4):
        CASTS.clear()
        model(torch.randint(0, 512, (2, 16)), num_recurrences=depth).float().mean().backward()
        results[str(depth)] = {f"{where}:{role}": n for (where, role), n in CASTS.items()}
    with open(out_path, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
