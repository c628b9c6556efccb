"""Greedy decoding with an exported model's KV cache (grt_titan/hf/remote/cache_grt.py), timed:
the loop of benchmarks/generate_bench.py and halting_bench.py, and of `grt-titan eval-task
--wall-clock` (docs/tasks.md)."""

from __future__ import annotations

import time

import torch

from grt_titan.hf.remote.halting_grt import never_halts
from grt_titan.hf.remote.modeling_grt import GRTCache


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Generator:
    """Greedy decoding with a GRTCache; eager (growing cache) or compiled (static cache).

    `halting` (eager only): per-token halting's forward arguments (`halting`,
    `halting_threshold`, `min_recurrences`, ...; docs/generation.md) of the positions that
    predict a token: the prompt's last and each decoded one. The context before them is
    prefilled under the same rule at its never-halting threshold, every step deep, because the
    tokens that halt read it (a context that halts early costs them the answer:
    docs/results/halting_readers.md). A token's exit is a host-side decision after each step, which
    one compiled decode step cannot take; `depths` then holds the recurrence_depths of each
    call that halts. `num_recurrences`: every call's depth (None: the config's eval depth)."""

    def __init__(
        self,
        model,
        strategy: str,
        compiled: bool,
        batch: int,
        prompt: int,
        new_tokens: int,
        device: str,
        backend: str = "inductor",
        halting: dict | None = None,
        num_recurrences: int | None = None,
    ):
        if compiled and halting:
            raise ValueError(f"Generator: halting={halting} decodes eagerly; pass compiled=False")
        self.model, self.device = model, device
        self.halting = dict(halting or {})
        self.call = self.halting | ({} if num_recurrences is None else {"num_recurrences": num_recurrences})
        self.depths: list[torch.Tensor] = []  # each call's recurrence_depths, with halting
        self.prompt, self.new_tokens = prompt, new_tokens
        total = prompt + new_tokens
        self.compiled = compiled
        self.cache = GRTCache(model.config, strategy, max_cache_len=total if compiled else None)
        self.strategy = strategy
        self.slots = [torch.tensor([t], device=device) for t in range(total)]
        self.positions = [torch.tensor([[t]], device=device) for t in range(total)]
        self.step = model
        if compiled:
            mode = "reduce-overhead" if device.startswith("cuda") and backend == "inductor" else None
            self.step = torch.compile(model, backend=backend, mode=mode, dynamic=False, fullgraph=True)

    @torch.no_grad()
    def run(self, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
        if self.compiled:
            self.cache.reset()
        else:
            self.cache = GRTCache(self.model.config, self.strategy)
        sync(self.device)
        start = time.perf_counter()
        out = self.prefill(ids)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens = [token]
        self.depths = [out.recurrence_depths] if self.halting else []
        for i in range(self.new_tokens - 1):
            t = self.prompt + i
            out = self.step(
                token,
                past_key_values=self.cache,
                cache_slots=self.slots[t],
                position_ids=self.positions[t],
                **self.call,
            )
            if self.halting:
                self.depths.append(out.recurrence_depths)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            if self.compiled:
                token = token.clone()  # CUDA graphs reuse their output buffers
            tokens.append(token)
        sync(self.device)
        return torch.cat(tokens, 1), time.perf_counter() - start

    def prefill(self, ids: torch.Tensor):
        """The prompt's forward into the cache; with halting, its context first at full depth."""
        start = 0
        if self.halting and self.prompt > 1:
            start = self.prompt - 1
            context = self.call | {"halting_threshold": never_halts(self.halting["halting"])}
            slots = torch.arange(start, device=self.device)
            self.model(ids[:, :start], past_key_values=self.cache, cache_slots=slots, logits_to_keep=1, **context)
        return self.model(
            ids[:, start:],
            past_key_values=self.cache,
            cache_slots=torch.arange(start, self.prompt, device=self.device),
            logits_to_keep=1,
            **self.call,
        )
