"""KV caches of the GRT's transformers model, and the attention masks over the keys they hold.

- `GRTCache`: every model's cache across recurrence steps; the one place the strategies
  (`per_step`, `first`, `last`, `average`) live.
- `MoRCache`: Mixture-of-Recursions' recursion-wise cache (`router = "expert_choice"`).
- `attention_masks`: the SDPA masks of one forward over a cache's keys.

Remote code: imports torch and transformers only, and is exported next to modeling_grt.py,
which imports it (transformers copies the files a remote module imports relatively).
The model drives a cache through `check_layout`, `begin`, `update_kv`, `end_recurrence`
and `end_forward`; transformers' generation through the `Cache` interface.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The annotations name transformers' base class, not GRTConfig: configuration_grt.py imports
# the parts, which import this file (an import circle).
from transformers import PretrainedConfig
from transformers.cache_utils import Cache

# KV-cache strategies across recurrence steps (`GRTCache`; `GRTConfig.kv_cache_strategy`).
KV_CACHE_STRATEGIES = ("per_step", "first", "last", "average")


class GRTCache(Cache):
    r"""KV cache of a GRT; the only place the cache strategies are implemented.

    Prelude and coda blocks keep one exact K/V each. Core block j runs r times per token
    (once per recurrence step s) and its K/V differ per step; the strategies choose what
    the core keeps for past tokens:

    | strategy   | kept for core block j                 | exact? |
    |------------|---------------------------------------|--------|
    | `per_step` | one K/V per step s = 1..r             | yes    |
    | `first`    | step 1's K/V                          | no     |
    | `last`     | step r's K/V                          | no     |
    | `average`  | mean over s = 1..r of the K/V         | no     |

    With `first`/`last`/`average`, the tokens of the current call attend to the kept K/V
    of past tokens plus their own K/V of the current step (exact within the call), and
    the kept K/V of the new tokens is written when their recurrence ends. A prefill is
    therefore exact under every strategy; they differ from the next token on (and not at
    all when r = 1). For the same reason assisted decoding (prompt lookup, an assistant
    model: a draft checked in one forward, the rejected tokens cropped) gives greedy
    decoding's tokens with `per_step` only, and is refused with the others
    (`check_assisted_decoding`).

    Memory, B sequences of T tokens, KV heads H_kv of size d_h, s bytes per element:

        per_step:               2 B T H_kv d_h s (p + n r + c)
        first / last / average: 2 B T H_kv d_h s (p + n + c)

    A dense model (n = 0) keeps 2 B T H_kv d_h s L. `nbytes()` measures it. Transient
    per-call buffers (the running K/V of the new tokens, fp32 for `average`) are not
    part of it.

    Ouro's per-token exit (`config.per_step_readout`: objective "exit_distribution",
    exit_threshold < 1) runs the coda on every step's state, and step s's coda attends to
    the earlier tokens' coda K/V of step s: the coda keeps one K/V per step as well,
    2 B T H_kv d_h s (p + n r + c r), and only `per_step` is allowed (a compressed core
    cache would feed the readouts inexact states; refused by name). Per-token halting by a
    readout rule (`halting="kl" | "entropy" | "argmax"`, halting_grt.py) reads every step out
    too: its cache keeps one coda K/V per step under every strategy (an empty cache takes the
    layout of the first call that fills it), and its depth stays fixed while generating.

    Args:
        config: The model's `GRTConfig`.
        strategy: One of `KV_CACHE_STRATEGIES`; None = `config.kv_cache_strategy`.
        max_cache_len: None: tensors grow by concatenation (eager use, `generate`).
            An int: static, preallocated `[B, H_kv, max_cache_len, d_h]` buffers written
            at `cache_slots` (compressed core blocks: one extra scratch column); shapes
            never change, so a decode step compiles to one graph (CUDA graphs on GPU).
    """

    def __init__(self, config: PretrainedConfig, strategy: str | None = None, max_cache_len: int | None = None):
        super().__init__(layers=[])
        strategy = strategy or config.kv_cache_strategy
        if strategy not in KV_CACHE_STRATEGIES:
            raise ValueError(f"kv_cache_strategy = {strategy!r}; allowed: {KV_CACHE_STRATEGIES}")
        for part in config.active_parts:  # the strategies its parts cannot run exactly
            part.check_cache_strategy(config, strategy)
        # A part (Ouro's per-token exit) or a call's halting rule reads every step out: one coda
        # slot per (step, coda block); `check_layout` sets it for a halting call on an empty cache.
        self.per_step_readout = config.per_step_readout
        self.strategy = strategy
        self.num_prelude = config.num_prelude_layers
        self.num_core = config.num_core_layers
        self.num_coda = config.num_coda_layers
        self._static_len = max_cache_len
        self.depth: int | None = None  # depth r of the calls so far (their `num_recurrences`)
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self._pending: dict[int, list] = {}  # core block -> [k, v] of the new tokens
        self._pending_dtype = torch.get_default_dtype()
        # Tokens cached so far; a tensor when static, so compiled steps do not guard on it.
        self._length = 0 if max_cache_len is None else torch.zeros((), dtype=torch.long)

    # ---- layout --------------------------------------------------------------------

    @property
    def compressed(self) -> bool:
        """One K/V for the core (first/last/average) instead of one per step."""
        return self.strategy != "per_step"

    @property
    def max_cache_len(self) -> int | None:
        """Static buffers' length, None when growing. Our own property: transformers 5.0 to
        5.17's `Cache.max_cache_len` is a read-only deprecated one that assignment cannot set."""
        return self._static_len

    @property
    def is_static(self) -> bool:
        return self._static_len is not None

    def _slot(self, kind: str, index: int, step: int) -> int:
        """Prelude blocks, coda blocks (per step s = 0..r-1 with a per-step readout, r
        fixed by `begin`), then core blocks (per step unless compressed)."""
        if kind == "prelude":
            return index
        coda_steps = max(self.depth or 0, 1) if self.per_step_readout else 1
        if kind == "coda":
            return self.num_prelude + (step * self.num_coda if self.per_step_readout else 0) + index
        core = index if self.compressed else step * self.num_core + index
        return self.num_prelude + coda_steps * self.num_coda + core

    # ---- used by the model ------------------------------------------------------------

    def check_layout(self, config: PretrainedConfig, halting_reads_out: bool = False) -> None:
        """ValueError unless the call reads out as this cache was laid out for (one coda per
        step with Ouro's per-token exit or a readout halting rule, else one), which an empty
        cache takes from the call; `exit_threshold` may be set after loading."""
        wanted = config.per_step_readout or halting_reads_out
        if self.depth is None:  # nothing cached yet
            self.per_step_readout = wanted
        if self.per_step_readout != wanted:
            made = "a per-step readout" if self.per_step_readout else "one readout after the recurrence"
            raise ValueError(
                f"this cache was made for {made} but this call (exit_threshold = {config.exit_threshold!r}, "
                f"a readout halting rule: {halting_reads_out}) reads out otherwise; keep exit_threshold and "
                "the halting rule's kind (kl / entropy / argmax read every step out) fixed while generating "
                "with a cache"
            )

    def begin(self, depth: int) -> None:
        """Check that this call's depth r can use the cache (called before any update)."""
        previous = self.depth  # None until a call has filled the cache
        if previous is not None:
            if (not self.compressed or self.per_step_readout) and depth != previous:
                kind = "per_step" if not self.compressed else "per-step readout"
                raise ValueError(
                    f"num_recurrences = {depth}, but this {kind} cache holds "
                    f"{previous} steps; keep r fixed while generating with it"
                )
            if (depth > 0) != (previous > 0):
                raise ValueError(
                    f"num_recurrences changed between 0 and {max(depth, previous)} "
                    "during generation; the core cache would miss tokens"
                )
        self.depth = depth

    def update_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        kind: str,
        index: int,
        step: int = 0,
        cache_slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (or stage) the new tokens' K/V `[B, H_kv, T, d_h]`; return the K/V to attend to.

        Dynamic cache: keys are past tokens then new tokens, `[B, H_kv, P + T, d_h]`, for
        every block and strategy. Static cache: the whole buffer `[..., max_cache_len, ..]`;
        for a compressed core block, the buffer and its scratch column, which holds the
        token when T = 1 and is followed by the T new tokens otherwise.
        """
        slot = self._slot(kind, index, step)
        staged = kind == "core" and self.compressed
        if staged:
            self._stage(index, step, key, value)
        while len(self.keys) <= slot:
            self.keys.append(None)
            self.values.append(None)
        past_k, past_v = self.keys[slot], self.values[slot]
        if self.is_static:
            if past_k is None:
                # A compressed core slot has one scratch column after the buffer.
                past_k, past_v = self._allocate(key, staged), self._allocate(value, staged)
                self.keys[slot], self.values[slot] = past_k, past_v
                if self._length.device != key.device:  # keep the step on one device (CUDA graphs)
                    self._length = self._length.to(key.device)
            if staged:
                if key.shape[2] == 1:  # decoding: the token's step K/V go to the scratch column
                    past_k[:, :, -1:].copy_(key)
                    past_v[:, :, -1:].copy_(value)
                    return past_k, past_v
                return torch.cat([past_k, key], dim=2), torch.cat([past_v, value], dim=2)
            past_k.index_copy_(2, cache_slots, key)
            past_v.index_copy_(2, cache_slots, value)
            return past_k, past_v
        if past_k is not None:
            key, value = torch.cat([past_k, key], dim=2), torch.cat([past_v, value], dim=2)
        if not staged:
            self.keys[slot], self.values[slot] = key, value
        return key, value

    def _stage(self, index: int, step: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Keep the K/V of the new tokens that the strategy will cache for core block `index`."""
        self._pending_dtype = key.dtype
        if self.strategy == "first":
            if step == 0:
                self._pending[index] = [key, value]
        elif self.strategy == "last":
            self._pending[index] = [key, value]
        elif step == 0:  # average: fp32 running sum, divided by r when the recurrence ends
            self._pending[index] = [key.float(), value.float()]
        else:
            acc = self._pending[index]
            acc[0] = acc[0] + key.float()
            acc[1] = acc[1] + value.float()

    def end_recurrence(self, num_steps: int, cache_slots: torch.Tensor | None = None) -> None:
        """Write the staged core K/V of the new tokens (compressed strategies)."""
        for index, (key, value) in self._pending.items():
            if self.strategy == "average":
                key, value = key / num_steps, value / num_steps
            key, value = key.to(self._pending_dtype), value.to(self._pending_dtype)
            slot = self._slot("core", index, 0)
            past_k, past_v = self.keys[slot], self.values[slot]
            if self.is_static:
                past_k.index_copy_(2, cache_slots, key)
                past_v.index_copy_(2, cache_slots, value)
            elif past_k is None:
                self.keys[slot], self.values[slot] = key, value
            else:
                self.keys[slot] = torch.cat([past_k, key], dim=2)
                self.values[slot] = torch.cat([past_v, value], dim=2)
        self._pending.clear()

    def end_forward(self, num_new_tokens: int) -> None:
        if self.is_static:
            self._length.add_(num_new_tokens)
        else:
            self._length += num_new_tokens

    def _allocate(self, like: torch.Tensor, scratch: bool = False) -> torch.Tensor:
        shape = (like.shape[0], like.shape[1], self.max_cache_len + int(scratch), like.shape[3])
        buf = torch.zeros(shape, dtype=like.dtype, device=like.device)
        if hasattr(torch, "_dynamo"):
            torch._dynamo.mark_static_address(buf)  # lets CUDA graphs keep it in place
        return buf

    # ---- transformers' Cache interface ------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self._length)

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1 if self.max_cache_len is None else self.max_cache_len

    def nbytes(self) -> int:
        """Bytes held by the cached K/V (static: the whole preallocated buffers, scratch
        columns included)."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)

    def _apply(self, fn) -> None:
        for tensors in (self.keys, self.values):
            for i, t in enumerate(tensors):
                if t is not None:
                    tensors[i] = fn(t)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._apply(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._apply(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._apply(lambda t: t[indices, ...])

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` tokens (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if tokens_to_remove == 0:
            return
        if self.is_static:
            self._length.add_(tokens_to_remove)  # the buffers keep stale entries; masked
            return
        self._apply(lambda t: t[..., :tokens_to_remove, :])
        self._length += tokens_to_remove

    def reset(self) -> None:
        """Forget every token. A static cache keeps (and zeroes) its buffers in place, so
        compiled steps and CUDA graphs recorded on them stay valid."""
        self._pending.clear()
        self.depth = None
        if self.is_static:
            self._apply(lambda t: t.zero_())
            self._length.zero_()
        else:
            self.keys, self.values = [], []
            self._length = 0

    @property
    def is_compileable(self) -> bool:
        # False even when static: generate() would otherwise build transformers' 4D masks
        # and auto-compile; compile a decode step yourself (benchmarks/generate_bench.py).
        return False

    @property
    def is_croppable(self) -> bool:
        return True

    def check_assisted_decoding(self) -> None:
        """ValueError for a compressed cache: assisted decoding checks a draft of several tokens in
        one forward, where they attend to each other's K/V of the current step, not to the kept
        K/V decoding them one by one gives, so its tokens would not be greedy decoding's."""
        if self.compressed:
            raise ValueError(
                f"prompt-lookup / assisted decoding is not supported with kv_cache_strategy = {self.strategy!r}: "
                "a draft checked in one forward sees exact core K/V where one-by-one decoding sees the compressed "
                "ones, so the tokens would differ from greedy decoding's; allowed: kv_cache_strategy = 'per_step'"
            )

    def __repr__(self) -> str:
        return (
            f"GRTCache(strategy={self.strategy!r}, tokens={self.get_seq_length()}, "
            f"static={self.is_static}, bytes={self.nbytes()})"
        )


class MoRCache(GRTCache):
    r"""KV cache of a Mixture-of-Recursions model (`router = "expert_choice"`): MoR's
    recursion-wise caching, exact.

    Prelude and coda blocks are cached as by `GRTCache`. Core block j at step s keeps, per
    sequence of the batch, the K/V of exactly the tokens that were active at step s, in
    causal order: a new token routed through step s attends to the past tokens step s
    updated, as the full forward's attention among the step's active tokens does. Sequences
    keep different numbers of tokens per step, so the core K/V are per-row tensors
    `[1, H_kv, n, d_h]`, with the cache slots of those tokens (for `crop`).

    Only `per_step` (the exact strategy) and a growing cache: MoR's recursive KV sharing is
    not GRTCache's `first` (docs/mor.md), and a static buffer cannot hold ragged rows.
    """

    def __init__(self, config: PretrainedConfig, strategy: str | None = None, max_cache_len: int | None = None):
        strategy = strategy or config.kv_cache_strategy
        if strategy != "per_step":
            raise ValueError(
                f"kv_cache_strategy = {strategy!r} is not supported with router = 'expert_choice' "
                "(Mixture-of-Recursions); allowed: 'per_step' (recursion-wise caching, exact)"
            )
        if max_cache_len is not None:
            raise ValueError(
                f"max_cache_len = {max_cache_len} is not supported with router = 'expert_choice': each "
                "sequence keeps its own number of tokens per step; allowed: None (a growing cache)"
            )
        super().__init__(config, strategy)
        # (step, core block) -> per row K/V [1, H_kv, n, d_h]; step -> per row cache slots [n].
        self.row_keys: dict[tuple[int, int], list[torch.Tensor | None]] = {}
        self.row_values: dict[tuple[int, int], list[torch.Tensor | None]] = {}
        self.row_slots: dict[int, list[torch.Tensor | None]] = {}

    def routed_length(self, step: int, row: int) -> int:
        """Tokens of sequence `row` cached at step `step` (those it routed through it)."""
        slots = self.row_slots.get(step)
        return 0 if slots is None or slots[row] is None else slots[row].numel()

    def add_routed(self, step: int, row: int, batch: int, slots: torch.Tensor) -> None:
        """Record the cache slots of the tokens of `row` routed through `step` in this call."""
        rows = self.row_slots.setdefault(step, [None] * batch)
        rows[row] = slots if rows[row] is None else torch.cat([rows[row], slots])

    def update_routed_kv(
        self, key: torch.Tensor, value: torch.Tensor, step: int, index: int, row: int, batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the K/V `[1, H_kv, n, d_h]` of the routed tokens of `row`; return all of the row's."""
        keys = self.row_keys.setdefault((step, index), [None] * batch)
        values = self.row_values.setdefault((step, index), [None] * batch)
        if keys[row] is not None:
            key, value = torch.cat([keys[row], key], dim=2), torch.cat([values[row], value], dim=2)
        keys[row], values[row] = key, value
        return key, value

    def _stores(self):
        return (self.row_keys, self.row_values, self.row_slots)

    def _select_rows(self, order: list[int]) -> None:
        for store in self._stores():
            for name, rows in store.items():
                store[name] = [rows[i] for i in order]

    def nbytes(self) -> int:
        routed = sum(
            t.numel() * t.element_size()
            for store in (self.row_keys, self.row_values)
            for rows in store.values()
            for t in rows
            if t is not None
        )
        return super().nbytes() + routed

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._select_rows(beam_idx.tolist())

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        for store in self._stores():
            for name, rows in store.items():
                store[name] = [t for t in rows for _ in range(repeats)]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        order = torch.arange(self._batch())[indices].tolist() if self._batch() else []
        self._select_rows(order)

    def _batch(self) -> int:
        return next((len(rows) for store in self._stores() for rows in store.values()), 0)

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        length = self.get_seq_length()
        for step, rows in self.row_slots.items():
            for row, slots in enumerate(rows):
                if slots is None:
                    continue
                keep = int((slots < length).sum())
                rows[row] = slots[:keep]
                for (s, index), keys in self.row_keys.items():
                    if s == step and keys[row] is not None:
                        keys[row] = keys[row][:, :, :keep]
                        values = self.row_values[(s, index)]
                        values[row] = values[row][:, :, :keep]

    def reset(self) -> None:
        super().reset()
        for store in self._stores():
            store.clear()

    def __repr__(self) -> str:
        return f"MoRCache(tokens={self.get_seq_length()}, bytes={self.nbytes()})"


def attention_masks(attention_mask, cache, cache_slots, past, seqlen, batch, device):
    """Boolean SDPA masks `[B, 1, T, K]` (True = attend) of one forward, or None for plain causal.

    `main`: keys are the cached tokens then the new ones (dynamic cache) or the static
    buffer; `staged`: a static compressed core's buffer followed by the new tokens.
    """
    static = cache is not None and cache.is_static
    if attention_mask is None and not static and (past == 0 or seqlen == 1):
        return None, None
    if static:
        total = cache.max_cache_len
    else:
        total = past + seqlen
    if attention_mask is None:
        keep = torch.ones(batch, total, dtype=torch.bool, device=device)
    else:
        keep = attention_mask.to(device=device, dtype=torch.bool)
        if static and keep.shape[1] < total:  # the buffer is longer than the mask so far
            keep = F.pad(keep, (0, total - keep.shape[1]), value=False)
        if keep.shape[1] != total:
            raise ValueError(
                f"attention_mask covers {keep.shape[1]} tokens; expected "
                + (f"<= {total} (static cache)" if static else f"{total} ({past} cached + {seqlen} new)")
            )
    key_pos = torch.arange(total, device=device)
    query_pos = cache_slots[:, None]  # [T, 1]
    main = (key_pos[None, :] <= query_pos)[None] & keep[:, None, :]  # [B, T, total]
    staged = None
    if static and cache.compressed:
        # Keys: the buffer (tokens before this call), its scratch column, then (T > 1)
        # the new tokens; one new token sits in the scratch column instead.
        past_part = ((key_pos < cache_slots[0])[None, None, :] & keep[:, None, :]).expand(-1, seqlen, -1)
        scratch = torch.full((batch, seqlen, 1), seqlen == 1, dtype=torch.bool, device=device)
        parts = [past_part, scratch]
        if seqlen > 1:
            new_keep = keep.index_select(1, cache_slots)  # [B, T]
            causal = torch.ones(seqlen, seqlen, dtype=torch.bool, device=device).tril()
            parts.append(causal[None] & new_keep[:, None, :])
        staged = torch.cat(parts, dim=-1)
        staged = staged | ~staged.any(-1, keepdim=True)
        staged = staged[:, None]
    # A query whose every key is padding (left padding) attends to all: finite garbage
    # in a padded row, never read by real tokens, instead of NaN.
    main = main | ~main.any(-1, keepdim=True)
    return main[:, None], staged
