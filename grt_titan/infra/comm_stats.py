"""Count collectives and their bytes, by kind, for tests and the traffic benchmark.

torch's CommDebugMode trips over FSDP2's module hooks in 2.13, so this is a plain
TorchDispatchMode over the c10d and functional-collective ops. Bytes are the size of the
full (gathered / pre-scatter / reduced) tensor, i.e. what one rank's collective moves up
to the ring factor (n - 1) / n.

Keys: `all_gather`, `reduce_scatter`, `all_reduce`, ... for c10d collectives issued
directly (FSDP2, DDP, torchtitan's loss and norm reductions); `tp.all_gather`, ... for
functional collectives, which DTensor (tensor parallelism) issues.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# op name fragment -> kind
_KINDS = (
    ("reduce_scatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("alltoall", "all_to_all"),
    ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"),
)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)


class CollectiveCounter(TorchDispatchMode):
    """`with CollectiveCounter() as c: ...` then `c.counts["all_gather"]`, `c.bytes[...]`."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    @staticmethod
    def kind_of(func) -> str | None:
        namespace = func.namespace
        if namespace not in ("c10d", "_c10d_functional", "c10d_functional"):
            return None
        name = func._opname
        for fragment, kind in _KINDS:
            if fragment in name:
                return kind
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self.kind_of(func)
        if kind is not None:
            key = kind if func.namespace == "c10d" else f"tp.{kind}"
            self.counts[key] += 1
            sizes = [t.numel() * t.element_size() for t in _tensors((args, kwargs))]
            if kind in ("all_gather", "reduce_scatter"):
                # gathered output / scattered input: the larger side
                self.bytes[key] += max(sizes, default=0)
            else:
                self.bytes[key] += sum(sizes)
        return func(*args, **kwargs)
