"""One process, one torch defect of grt_titan/infra/torch_workarounds.py, with or without its workaround.

    python -m tests.infra.torch_workarounds_worker rng_order  {fix|nofix} OUT.json
    python -m tests.infra.torch_workarounds_worker uneven_cache {fix|nofix} OUT.json RANK
    python -m tests.infra.torch_workarounds_worker embedding_view {fix|nofix} OUT.json

Writes {"ok": true, ...} or {"ok": false, "error": "..."} to OUT.json.
"""

import json
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from grt_titan.infra import torch_workarounds


class Attention(nn.Module):
    """A TP-sharded projection feeding SDPA (CPU SDPA is tagged nondeterministic_seeded)."""

    def __init__(self, dropout: float):
        super().__init__()
        self.wq = nn.Linear(16, 16)
        self.dropout = dropout

    def forward(self, x):
        q = self.wq(x).view(2, 8, 4, 4).transpose(1, 2)
        return F.dropout(F.scaled_dot_product_attention(q, q, q, is_causal=True), self.dropout)


def rng_order(fix: bool) -> dict:
    """AC recomputes an RNG-tagged op in a compiled region whose DTensor params save a mesh."""
    if fix:
        torch_workarounds.install_rng_state_order_fix()
    mesh = init_device_mesh("cpu", (1,))
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    grads = {}
    for name, dropout, checkpointed in (("sdpa", 0.0, True), ("dropout_ac", 0.3, True), ("dropout", 0.3, False)):
        torch.manual_seed(0)
        module = Attention(dropout)
        parallelize_module(module, mesh, {"wq": ColwiseParallel()})
        region = checkpoint_wrapper(module) if checkpointed else module
        torch.manual_seed(1)
        compiled = torch.compile(region, backend="aot_eager", fullgraph=True)
        compiled(x).square().sum().backward()
        grads[name] = module.wq.weight.grad.full_tensor()
        if name == "sdpa":
            torch.manual_seed(0)
            eager = Attention(0.0)
            eager(x).square().sum().backward()
            grads["eager"] = eager.wq.weight.grad
    return {
        # Deterministic region: compiled + AC equals eager.
        "sdpa_vs_eager": (grads["sdpa"] - grads["eager"]).abs().max().item(),
        # Dropout: the recomputed mask must be the forward's (same seed, with and without AC).
        "dropout_ac_vs_no_ac": (grads["dropout_ac"] - grads["dropout"]).abs().max().item(),
        "dropout_grad_norm": grads["dropout"].norm().item(),
    }


def uneven_cache(fix: bool, rank: int) -> dict:
    """A 5-row weight over 2 ranks (3 + 2 rows), compiled with inductor, one cache for both."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=2, store=FakeStore())
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    head = nn.Linear(16, 5, bias=False)
    parallelize_module(
        head, mesh, ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False)
    )
    if fix:
        assert torch_workarounds.disable_autograd_cache_for_uneven_shards(head) == ["weight"]
    from torch.distributed.tensor.parallel import loss_parallel

    x = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([[0, 4, 2], [1, 3, 0]])
    # As torchtitan compiles its loss: vocabulary-sharded logits, loss parallel.
    loss_fn = torch.compile(lambda logits, targets: F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1)))
    with loss_parallel():
        loss_fn(head(x), labels).backward()
    return {"local_rows": head.weight.to_local().shape[0]}


def embedding_view(fix: bool) -> dict:
    """A compiled block whose input is the to_local() output of a TP embedding."""
    dist.destroy_process_group()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    embedding, block = nn.Embedding(32, 16), nn.Linear(16, 16)
    parallelize_module(embedding, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)))
    if fix:
        torch_workarounds.clone_embedding_output(embedding)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    compiled(embedding(tokens)).square().sum().backward()
    return {"embedding_grad_norm": embedding.weight.grad.full_tensor().norm().item()}


def main() -> None:
    case, mode, out = sys.argv[1:4]
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())  # no port needed
    fix = mode == "fix"
    try:
        if case == "rng_order":
            result = rng_order(fix)
        elif case == "uneven_cache":
            result = uneven_cache(fix, int(sys.argv[4]))
        else:
            result = embedding_view(fix)
        result["ok"] = True
    except Exception as error:  # the defect's error is the result
        result = {"ok": False, "error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-3000:]}
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
