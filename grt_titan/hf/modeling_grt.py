"""Hugging Face model of the Gated Recurrent Transformer (GRT, arXiv 2608.15062).

Self-contained (imports torch and transformers only): `grt-titan export-hf` copies this
file next to the weights, and `AutoModelForCausalLM.from_pretrained(dir,
trust_remote_code=True)` loads it. The math equals grt_titan's torchtitan model:

    h     = embed(x) (+ learned positions, gpt2 style)
    h_pre = prelude(h);  h = h_pre
    for step in 1..r:                                    r = num_recurrences
        o = core(W_proj [h ; h_pre])                     the same n blocks every step
        g = sigmoid(f_g([LN(h) ; LN(h_pre)]) / tau)      no noise at inference
        h = g * h + (1 - g) * o
    logits = lm_head(norm(coda(h)))

That is GRT; the config's recurrence parts give the paper's other recurrent models:

    injection = "none"        o = core(h)                        (no W_proj)
    update = "overwrite"      h = o                              (no gate)
    initial_state = "random"  h_0 = row t of a fixed TruncNormal table for position t
    step_adapter = "lora"     core at step s = core + step s's LoRA (RRT, r <= R)
    objective = "exit_distribution"   Ouro: with exit_threshold q < 1, every step's state is
                              read out, hidden_t = norm(coda(h_t)), an exit gate gives
                              lambda_t = sigmoid(exit_gate(hidden_t)), and each token's
                              logits are lm_head(hidden_t) at its Q-exit step t (the first
                              with 1 - prod_{j<=t} (1 - lambda_j) >= q, else r). As Ouro's
                              released code, all r steps run and the chosen one is gathered
                              (no compute saved). q = 1 is the last step: the plain forward.
    router = "expert_choice"  step s updates only the tokens its router routes (MoR, r <= R;
                              `MoRRouter` and its recursion-wise cache `MoRCache` below)

Inference depth: `num_recurrences` in the config, or per call in `forward` / `generate`
(0 = prelude + coda only, r < R early exit, r > R extrapolation).

KV cache across recurrences: `GRTCache` below, the one place the strategies live
(`per_step`, `first`, `last`, `average`).

RoPE (llama style) rotates interleaved pairs (x[2i], x[2i+1]) exactly like torchtitan's
complex `apply_rotary_emb`, so the exported q/k weights are torchtitan's, unpermuted.

Analysis outputs (`output_recurrence=True`): the states h_0 (= h_pre, or the random initial
state), h_1..h_r, the core proposals o_1..o_r and the gates g_1..g_r (None without a
gate); `output_step_logits=True` adds the logits of exiting after every step s = 0..r
(coda + head on h_s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_grt import EXIT_KV_CACHE_STRATEGIES, KV_CACHE_STRATEGIES, ROUTER_INFERENCE, GRTConfig

# ======================================================================================
# KV cache across recurrence steps
# ======================================================================================


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
    all when r = 1).

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
    cache would feed the readouts inexact states; refused by name).

    Args:
        config: The model's `GRTConfig`.
        strategy: One of `KV_CACHE_STRATEGIES`; None = `config.kv_cache_strategy`.
        max_cache_len: None: tensors grow by concatenation (eager use, `generate`).
            An int: static, preallocated `[B, H_kv, max_cache_len, d_h]` buffers written
            at `cache_slots` (compressed core blocks: one extra scratch column); shapes
            never change, so a decode step compiles to one graph (CUDA graphs on GPU).
    """

    def __init__(self, config: GRTConfig, strategy: str | None = None, max_cache_len: int | None = None):
        super().__init__(layers=[])
        strategy = strategy or config.kv_cache_strategy
        if strategy not in KV_CACHE_STRATEGIES:
            raise ValueError(f"kv_cache_strategy = {strategy!r}; allowed: {KV_CACHE_STRATEGIES}")
        # Ouro's per-token exit: one coda slot per (step, coda block).
        self.per_step_readout = bool(getattr(config, "per_step_readout", False))
        if self.per_step_readout and strategy not in EXIT_KV_CACHE_STRATEGIES:
            raise ValueError(
                f"kv_cache_strategy = {strategy!r} cannot be used with objective = 'exit_distribution' "
                f"and exit_threshold = {config.exit_threshold!r} < 1; allowed: {EXIT_KV_CACHE_STRATEGIES}"
            )
        self.strategy = strategy
        self.num_prelude = config.num_prelude_layers
        self.num_core = config.num_core_layers
        self.num_coda = config.num_coda_layers
        self.max_cache_len = max_cache_len
        self.num_recurrences: int | None = None  # depth of the calls so far
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
    def is_static(self) -> bool:
        return self.max_cache_len is not None

    def _slot(self, kind: str, index: int, step: int) -> int:
        """Prelude blocks, coda blocks (per step s = 0..r-1 with a per-step readout, r
        fixed by `begin`), then core blocks (per step unless compressed)."""
        if kind == "prelude":
            return index
        coda_steps = max(self.num_recurrences or 0, 1) if self.per_step_readout else 1
        if kind == "coda":
            return self.num_prelude + (step * self.num_coda if self.per_step_readout else 0) + index
        core = index if self.compressed else step * self.num_core + index
        return self.num_prelude + coda_steps * self.num_coda + core

    # ---- used by the model ------------------------------------------------------------

    def begin(self, num_recurrences: int) -> None:
        """Check that this call's depth can use the cache (called before any update)."""
        previous = self.num_recurrences  # None until a call has filled the cache
        if previous is not None:
            if not self.compressed and num_recurrences != previous:
                raise ValueError(
                    f"num_recurrences = {num_recurrences}, but this per_step cache holds "
                    f"{previous} steps; keep r fixed while generating with it"
                )
            if (num_recurrences > 0) != (previous > 0):
                raise ValueError(
                    f"num_recurrences changed between 0 and {max(num_recurrences, previous)} "
                    "during generation; the core cache would miss tokens"
                )
        self.num_recurrences = num_recurrences

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
        self.num_recurrences = None
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

    def __repr__(self) -> str:
        return (
            f"GRTCache(strategy={self.strategy!r}, tokens={self.get_seq_length()}, "
            f"static={self.is_static}, bytes={self.nbytes()})"
        )


# ======================================================================================
# Blocks
# ======================================================================================


def rope_inverse_frequencies(config: GRTConfig, device=None) -> torch.Tensor:
    """torchtitan's `precompute_freqs_cis` frequencies, llama3 scaling included (fp32)."""
    dim, theta = config.head_dim, config.rope_theta
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device)[: dim // 2].float() / dim))
    scaling = config.rope_llama3_scaling
    if scaling:
        factor = scaling["scaling_factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        original = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / freqs
        freqs = torch.where(wavelen > original / low, freqs / factor, freqs)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * freqs / factor + smooth * freqs
        is_medium = ~(wavelen < original / high) * ~(wavelen > original / low)
        freqs = torch.where(is_medium, smoothed, freqs)
    return freqs


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of `x` [B, T, H, d_h] in fp32 (torchtitan's)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class GRTAttention(nn.Module):
    """Causal self-attention (SDPA); GQA and RoPE for llama style, biases for gpt2 style."""

    def __init__(self, config: GRTConfig):
        super().__init__()
        bias = config.block_style == "gpt2"
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=bias)

    def forward(self, x, rope, mask, kv_update, lora=None):
        bsz, seqlen, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if lora is not None:  # RRT: the step's LoRA on GPT-2's fused q/k/v projection
            dq, dk, dv = lora("qkv", x).chunk(3, dim=-1)
            q, k, v = q + dq, k + dk, v + dv
        q = q.view(bsz, seqlen, self.num_heads, self.head_dim)
        k = k.view(bsz, seqlen, self.num_kv_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.num_kv_heads, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if kv_update is not None:
            k, v = kv_update(k, v)
        # No mask: plain causal attention over this call's tokens (or one query, all keys).
        is_causal = mask is None and seqlen > 1
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        out = out.transpose(1, 2).reshape(bsz, seqlen, -1)
        if lora is None:
            return self.o_proj(out)
        return self.o_proj(out) + lora("attention_out", out)


class GRTMLP(nn.Module):
    """gpt2: down(gelu_tanh(up(x))); llama: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: GRTConfig):
        super().__init__()
        d, hidden = config.hidden_size, config.intermediate_size
        self.swiglu = config.block_style == "llama"
        bias = not self.swiglu
        if self.swiglu:
            self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d, bias=bias)

    def forward(self, x, lora=None):
        if self.swiglu:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        if lora is None:
            return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))
        hidden = F.gelu(self.up_proj(x) + lora("mlp_in", x), approximate="tanh")
        return self.down_proj(hidden) + lora("mlp_out", hidden)


def make_norm(config: GRTConfig) -> nn.Module:
    if config.block_style == "gpt2":
        return nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
    return nn.RMSNorm(config.hidden_size, eps=config.norm_eps)


class GRTBlock(nn.Module):
    """Pre-norm transformer block: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, config: GRTConfig):
        super().__init__()
        self.input_layernorm = make_norm(config)
        self.self_attn = GRTAttention(config)
        self.post_attention_layernorm = make_norm(config)
        self.mlp = GRTMLP(config)

    def forward(self, x, rope, mask, kv_update=None, lora=None):
        """`lora`: RRT's adapter of this block at this step, `lora(linear_name, input)` ->
        the delta added to that linear's output; None for a plain block."""
        h = x + self.self_attn(self.input_layernorm(x), rope, mask, kv_update, lora)
        return h + self.mlp(self.post_attention_layernorm(h), lora)


class GRTGate(nn.Module):
    """g = sigmoid(w_out(silu(w_in([LN(h); LN(h_pre)]))) / tau), or a constant (override)."""

    def __init__(self, config: GRTConfig):
        super().__init__()
        d, hidden = config.hidden_size, config.gate_hidden_size
        self.state_norm = nn.LayerNorm(d, eps=config.norm_eps)
        self.anchor_norm = nn.LayerNorm(d, eps=config.norm_eps)
        self.w_in = nn.Linear(2 * d, hidden)
        self.w_out = nn.Linear(hidden, d)
        self.temperature = config.gate_temperature
        self.override = config.gate_override

    def forward(self, h, h_pre):
        if self.override is not None:
            return torch.full_like(h, self.override)
        features = torch.cat([self.state_norm(h), self.anchor_norm(h_pre)], dim=-1)
        return torch.sigmoid(self.w_out(F.silu(self.w_in(features))) / self.temperature)


class GRTStepAdapters(nn.Module):
    """RRT's per-step LoRA (Bae et al. 2024): one adapter per (recurrence step, core block)
    on the gpt2 block's fused q/k/v, attention output, MLP input and output.

    Factors are stored step-major, `a[name]` `[R, n, rank, in]` and `b[name]`
    `[R, n, out, rank]`; the delta of a linear is scale * (x A^T) B^T, as grt_titan trains it.
    """

    def __init__(self, config: GRTConfig):
        super().__init__()
        d, hidden = config.hidden_size, config.intermediate_size
        steps, blocks, rank = config.train_recurrences, config.num_core_layers, config.lora_rank
        linears = {"qkv": (d, 3 * d), "attention_out": (d, d), "mlp_in": (d, hidden), "mlp_out": (hidden, d)}
        self.scale = config.lora_scale
        self.a = nn.ParameterDict(
            {n: nn.Parameter(torch.empty(steps, blocks, rank, i)) for n, (i, _) in linears.items()}
        )
        self.b = nn.ParameterDict(
            {n: nn.Parameter(torch.empty(steps, blocks, o, rank)) for n, (_, o) in linears.items()}
        )

    def block_lora(self, step: int, block: int):
        """`lora(name, x)` of core block `block` at step `step` (0-based), for `GRTBlock`."""

        def lora(name: str, x: torch.Tensor) -> torch.Tensor:
            a, b = self.a[name][step, block], self.b[name][step, block]
            return (x @ a.t().to(x.dtype)) @ (b.t().to(x.dtype) * self.scale)

        return lora


def eval_initial_state(seed: int, max_seq_len: int, dim: int, std: float) -> torch.Tensor:
    """The random initial state `[max_seq_len, dim]` (float32) of `initial_state = "random"`:
    row t is position t's h_0. grt_titan's eval-mode table, bit for bit: one CPU draw
    seeded by `seed`, always of the full length (a draw's prefix depends on its length)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    state = torch.empty(max_seq_len, dim, dtype=torch.float32)
    return nn.init.trunc_normal_(state, std=std, a=-3 * std, b=3 * std, generator=generator)


def q_exit_steps(gate_logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """Ouro's Q-exit: the 0-based exit step per token of gate logits z `[r, ...]` (float32),
    the first t with CDF(t) = 1 - prod_{j<=t} (1 - sigmoid(z_j)) >= threshold, else the last
    step. grt_titan's `q_exit_steps`, computed the same way (log space) for threshold < 1."""
    survive = torch.cumsum(F.logsigmoid(-gate_logits), dim=0).exp()  # 1 - CDF(t)
    stop = survive <= 1.0 - threshold
    stop[-1] = True  # the last step takes the remaining mass: CDF(r) = 1
    return stop.to(torch.int8).argmax(dim=0)  # the first step that stops


# ======================================================================================
# Mixture-of-Recursions: routed steps and their recursion-wise KV cache
# ======================================================================================


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
    not GRTCache's `first` (docs/hf_export.md), and a static buffer cannot hold ragged rows.
    """

    def __init__(self, config: GRTConfig, strategy: str | None = None, max_cache_len: int | None = None):
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


class MoRRouter(nn.ModuleList):
    r"""Mixture-of-Recursions' routers (one bias-free Linear(d, 1) per step, `model.router.{i}`)
    and the routed recurrence, as grt_titan trains it (grt_titan docs/architecture.md):

        for step i:  logit = w_i . h;  active = the tokens step i routes (rule below)
                     o = core(h[active])            causal attention among the row's active tokens
                     h[active] += g (o - h[active]),  g = router_scale x sigmoid(logit)   (router_update "delta")
                     h[active] += g o                 the released MoR code's update            ("block")

    Rules (`router_inference`): "threshold", a token goes on to step i while it was active at
    step i-1 and logit_i > 0 (sigmoid > 0.5), causal, what generation with a `MoRCache`
    computes; "top_k", the top-k_i of step i-1's tokens by logit, k_i = max(1, int(c_i T)),
    training's rule, which ranks the whole sequence: full forwards without cache only.
    Each sequence runs on its own (its active tokens are its own); padding never enters the core.
    """

    def __init__(self, config: GRTConfig):
        super().__init__(nn.Linear(config.hidden_size, 1, bias=False) for _ in range(config.train_recurrences))
        self.scale = config.router_scale
        steps = config.train_recurrences
        self.capacities = config.router_capacity or [(steps - i) / steps for i in range(steps)]
        self.default_rule = config.router_inference
        self.add_block = config.router_update == "block"  # as trained (config.json; "delta" if absent)

    def forward(self, h, depth, core, rule=None, cache=None, cache_slots=None, keep=None):
        """(h after `depth` routed steps, the states h_1..h_r, the proposals o_1..o_r: on routed
        tokens the o of h <- (1 - g) h + g o, the core output (delta) or h + it (block); h
        elsewhere). `keep` [B, T]: False for padding tokens."""
        rule = rule or self.default_rule
        if rule not in ROUTER_INFERENCE:
            raise ValueError(f"router_inference = {rule!r} is invalid; allowed: {ROUTER_INFERENCE}")
        batch, seqlen, _ = h.shape
        active = torch.ones(batch, seqlen, dtype=torch.bool, device=h.device) if keep is None else keep.bool()
        if rule == "top_k" and (cache is not None or not bool(active.all())):
            raise ValueError(
                "router_inference = 'top_k' ranks the whole sequence (not causal): it needs one call on "
                "unpadded sequences without cache (use_cache=False); generate with 'threshold'"
            )
        states, proposals = [], []
        for step in range(depth):
            logits = self[step](h).squeeze(-1)  # [B, T]; only the active tokens' are read
            if rule == "threshold":
                active = active & (logits > 0)
            else:
                k = max(1, int(self.capacities[step] * seqlen))
                chosen = logits.masked_fill(~active, float("-inf")).topk(k, dim=1).indices
                active = torch.zeros_like(active).scatter_(1, chosen, True)
            weight = (torch.sigmoid(logits) * self.scale).unsqueeze(-1)
            new_h, proposal = h.clone(), h.clone()
            for row in range(batch):
                positions = active[row].nonzero().squeeze(-1)  # causal order
                past = 0
                if cache is not None:
                    past = cache.routed_length(step, row)
                    cache.add_routed(step, row, batch, cache_slots[positions])
                if positions.numel() == 0:
                    continue
                x = h[row, positions][None]
                o = self._core(core, x, step, row, batch, past, cache)
                if self.add_block:
                    new_h[row, positions] = (x + weight[row, positions][None] * o)[0]
                    o = x + o  # the proposal in the convention h <- (1 - g) h + g o
                else:
                    new_h[row, positions] = (x + weight[row, positions][None] * (o - x))[0]
                proposal[row, positions] = o[0]
            h = new_h
            states.append(h)
            proposals.append(proposal)
        return h, states, proposals

    @staticmethod
    def _core(core, x, step, row, batch, past, cache):
        """The shared core on one sequence's routed tokens x [1, n, d], after the `past`
        tokens it routed through this step in earlier calls (their K/V in `cache`)."""
        n = x.shape[1]
        mask = None  # no past, or one query: plain causal attention
        if past and n > 1:
            query = past + torch.arange(n, device=x.device)
            mask = (torch.arange(past + n, device=x.device)[None, :] <= query[:, None])[None, None]
        o = x
        for index, block in enumerate(core):
            kv = None if cache is None else _routed_kv(cache, step, index, row, batch)
            o = block(o, None, mask, kv)
        return o


def _routed_kv(cache: MoRCache, step: int, index: int, row: int, batch: int):
    """The `kv_update` of core block `index` at `step` for sequence `row` (GRTAttention)."""
    return lambda key, value: cache.update_routed_kv(key, value, step, index, row, batch)


# ======================================================================================
# Models
# ======================================================================================


# transformers >= 5.24 names the cache `cache` (in outputs and forward kwargs), earlier
# releases `past_key_values`: accept both, return under the release's own name.
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


@dataclass
class GRTBaseModelOutputWithPast(BaseModelOutputWithPast):
    """Output of `GRTModel`: BaseModelOutputWithPast plus the recurrence, on request.

    last_hidden_state: `[B, T, d]` after the coda and the final norm (the LM head's input).
    The cache field (`cache`, or `past_key_values` before transformers 5.24): the
        `GRTCache`, when `use_cache`.
    hidden_states (`output_hidden_states=True`): the embeddings, then the output of every
        prelude block, every recurrence step h_1..h_r and every coda block (before the
        final norm).
    attentions: always None (SDPA computes no attention weights).
    recurrence_states, proposals, gate_values (`output_recurrence=True`): as in
        `GRTModelOutput`.
    step_exits (`output_step_exits=True`): r + 1 states `[B, T, d]`, coda and final norm
        applied to h_s for s = 0..r (the last is `last_hidden_state`, except with Ouro's
        per-token exit).
    exit_steps: Ouro's per-token exit (objective "exit_distribution", exit_threshold < 1,
        r >= 1): the step t = 1..r `[B, T]` whose readout each token's `last_hidden_state`
        is; None otherwise (every token reads the last step).
    With a per-token exit, `last_hidden_state` and the coda entries of `hidden_states` are
    those of each token's exit step.
    """

    recurrence_states: tuple[torch.Tensor, ...] | None = None
    proposals: tuple[torch.Tensor, ...] | None = None
    gate_values: tuple[torch.Tensor, ...] | None = None
    step_exits: tuple[torch.Tensor, ...] | None = None
    exit_steps: torch.Tensor | None = None


@dataclass
class GRTModelOutput(CausalLMOutputWithPast):
    """CausalLMOutputWithPast plus the recurrence, on request (`output_recurrence=True`).

    recurrence_states: r + 1 states `[B, T, d]`: h_0 (the prelude output h_pre, or the
        random initial state), h_1..h_r.
    proposals: r core outputs o_s `[B, T, d]` (before the gate).
    gate_values: r gates g_s `[B, T, d]` (1 keeps the state, 0 takes the proposal); None
        for update = "overwrite" (no gate: h_s = o_s).
    step_logits: r + 1 logits `[B, T, V]` of exiting after s = 0..r steps
        (`output_step_logits=True`; the last equals `logits`, except with Ouro's per-token
        exit, where `logits` are each token's exit step's).
    exit_steps: Ouro's per-token exit (exit_threshold < 1): each token's exit step t = 1..r
        `[B, T]`, the step its logits are read at; None otherwise.
    """

    recurrence_states: tuple[torch.Tensor, ...] | None = None
    proposals: tuple[torch.Tensor, ...] | None = None
    gate_values: tuple[torch.Tensor, ...] | None = None
    step_logits: tuple[torch.Tensor, ...] | None = None
    exit_steps: torch.Tensor | None = None


class GRTPreTrainedModel(PreTrainedModel):
    config_class = GRTConfig
    base_model_prefix = "model"
    _no_split_modules = ["GRTBlock"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_sdpa = True
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        # Only runs for weights missing from a checkpoint (or a model built from a config).
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            if module.weight is not None:
                nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        if isinstance(module, GRTGate):
            # Paper: the gate's last bias starts at +4, g ~ 0.98 (near-identity recurrence).
            nn.init.constant_(module.w_out.bias, 4.0)
        if isinstance(module, GRTStepAdapters):
            # PEFT's from-scratch LoRA: A Kaiming-uniform, B = 0 (each adapter a no-op).
            for a in module.a.values():
                bound = 1 / math.sqrt(a.shape[-1])
                nn.init.uniform_(a, -bound, bound)
            for b in module.b.values():
                nn.init.zeros_(b)


class GRTModel(GRTPreTrainedModel):
    """Embeddings, prelude, recurrence (proj, shared core, gate, step adapters: those the
    config's parts use), coda, final norm."""

    def __init__(self, config: GRTConfig):
        super().__init__(config)
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        if config.block_style == "gpt2":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, d)
        self.prelude = nn.ModuleList(GRTBlock(config) for _ in range(config.num_prelude_layers))
        # Parts a model does not use are None: no weights stored, none expected.
        recurrent = config.num_core_layers > 0
        self.proj = nn.Linear(2 * d, d, bias=False) if recurrent and config.injection == "proj" else None
        if recurrent:
            self.core = nn.ModuleList(GRTBlock(config) for _ in range(config.num_core_layers))
        self.gate = GRTGate(config) if recurrent and config.update == "gate" else None
        self.adapters = GRTStepAdapters(config) if recurrent and config.step_adapter == "lora" else None
        # Ouro: lambda_t = sigmoid(exit_gate(norm(coda(h_t)))), Linear(d, 1) with bias.
        exits = recurrent and getattr(config, "objective", "final") == "exit_distribution"
        self.exit_gate = nn.Linear(d, 1) if exits else None
        # Mixture-of-Recursions: a router per step picks the tokens it updates (MoRRouter).
        self.router = MoRRouter(config) if recurrent and config.router == "expert_choice" else None
        self._initial_state_table: torch.Tensor | None = None  # eval_initial_state, model dtype
        self.coda = nn.ModuleList(GRTBlock(config) for _ in range(config.num_coda_layers))
        self.norm = make_norm(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def resolve_depth(self, num_recurrences) -> int:
        if num_recurrences is None:
            return self.config.num_recurrences
        if isinstance(num_recurrences, bool) or not isinstance(num_recurrences, int):
            raise TypeError(f"num_recurrences must be an int, got {num_recurrences!r}")
        if num_recurrences < 0:
            raise ValueError(f"num_recurrences = {num_recurrences}; use r >= 0")
        if num_recurrences and not self.config.num_core_layers:
            raise ValueError(f"num_recurrences = {num_recurrences} given to a model without core layers")
        if self.router is not None and num_recurrences > self.config.train_recurrences:
            raise ValueError(
                f"num_recurrences = {num_recurrences} is invalid with router = 'expert_choice': there is "
                f"one router per step up to train_recurrences = {self.config.train_recurrences}"
            )
        if self.adapters is not None and num_recurrences > self.config.train_recurrences:
            raise ValueError(
                f"num_recurrences = {num_recurrences} is invalid with step_adapter = 'lora': there is "
                f"one adapter per step up to train_recurrences = {self.config.train_recurrences}"
            )
        return num_recurrences

    def initial_state(self, h_pre: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """h_0: the prelude output, or (initial_state = "random") the table row of each
        token's position, so a cached decode step sees what a full forward gives it."""
        config = self.config
        if config.initial_state == "prelude":
            return h_pre
        table = self._initial_state_table
        if table is None or table.device != h_pre.device or table.dtype != h_pre.dtype:
            table = eval_initial_state(
                config.initial_state_seed, config.max_position_embeddings, config.hidden_size, config.initial_state_std
            )
            self._initial_state_table = table = table.to(device=h_pre.device, dtype=h_pre.dtype)
        if not torch.compiler.is_compiling() and int(position_ids.max()) >= table.shape[0]:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond the random initial state's table "
                f"(max_position_embeddings = {table.shape[0]})"
            )
        return table[position_ids].expand_as(h_pre)

    def _rope(self, position_ids, device):
        if self.config.block_style != "llama":
            return None
        inv_freq = rope_inverse_frequencies(self.config, device=device)
        angles = position_ids.float()[..., None] * inv_freq  # [B or 1, T, d_h / 2]
        return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]

    @staticmethod
    def _masks(attention_mask, cache, cache_slots, past, seqlen, batch, device):
        """Boolean SDPA masks `[B, 1, T, K]` (True = attend), or None for plain causal.

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

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        cache=None,
        use_cache=None,
        num_recurrences=None,
        kv_cache_strategy=None,
        cache_slots=None,
        output_hidden_states=None,
        output_recurrence=False,
        output_step_exits=False,
        return_dict=None,
        router_inference=None,
        **kwargs,
    ):
        """A `GRTBaseModelOutputWithPast`; its `to_tuple()` (None fields left out) when
        `return_dict` is False (None: `config.return_dict`)."""
        config = self.config
        if output_hidden_states is None:
            output_hidden_states = config.output_hidden_states
        if return_dict is None:
            return_dict = getattr(config, "return_dict", True)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        batch, seqlen = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        depth = self.resolve_depth(num_recurrences)
        if use_cache is None and self.router is not None and (router_inference or config.router_inference) == "top_k":
            use_cache = False  # MoR's top_k ranks the whole sequence: nothing a later call could reuse
        use_cache = config.use_cache if use_cache is None else use_cache
        config.check_exit_settings()  # the attributes may have been set after loading
        # Ouro with q < 1: every step read out, each token's exit step gathered (r = 0 has
        # no step to exit at: the plain readout of h_0).
        readout = self.exit_gate is not None and config.exit_threshold < 1.0 and depth > 0

        cache = past_key_values if past_key_values is not None else cache
        if cache is not None and not isinstance(cache, GRTCache):
            raise TypeError(
                f"past_key_values must be a GRTCache (got {type(cache).__name__}); "
                "a GRT needs its own cache across recurrence steps"
            )
        if self.router is not None and cache is not None and not isinstance(cache, MoRCache):
            raise TypeError("a Mixture-of-Recursions model (router = 'expert_choice') needs a MoRCache, got a GRTCache")
        if cache is None and use_cache:
            cache = (GRTCache if self.router is None else MoRCache)(config, strategy=kv_cache_strategy)
        elif cache is not None and kv_cache_strategy not in (None, cache.strategy):
            raise ValueError(f"kv_cache_strategy = {kv_cache_strategy!r} but the given cache uses {cache.strategy!r}")
        past = cache.get_seq_length() if cache is not None and not cache.is_static else 0
        if cache_slots is None:
            start = cache.get_seq_length() if cache is not None else 0
            cache_slots = torch.arange(start, start + seqlen, device=device)
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
                position_ids = position_ids[:, -seqlen:]
            else:
                position_ids = cache_slots[None]
        if cache is not None:
            if cache.per_step_readout != config.per_step_readout:
                raise ValueError(
                    f"this cache was made for exit_threshold {'< 1' if cache.per_step_readout else '= 1'} "
                    f"but the config's is {config.exit_threshold!r}; keep exit_threshold fixed while "
                    "generating with a cache"
                )
            cache.begin(depth)

        h = inputs_embeds
        if config.block_style == "gpt2":
            if not torch.compiler.is_compiling() and int(position_ids.max()) >= config.max_position_embeddings:
                raise ValueError(
                    f"position {int(position_ids.max())} is beyond the learned positions "
                    f"(max_position_embeddings = {config.max_position_embeddings})"
                )
            h = h + self.embed_positions(position_ids)
        rope = self._rope(position_ids, device)
        mask, staged_mask = self._masks(attention_mask, cache, cache_slots, past, seqlen, batch, device)
        hidden_states = [h] if output_hidden_states else None

        def kv(kind, index, step=0):
            if cache is None:
                return None
            return lambda k, v: cache.update_kv(k, v, kind, index, step, cache_slots)

        for i, block in enumerate(self.prelude):
            h = block(h, rope, mask, kv("prelude", i))
            if hidden_states is not None:
                hidden_states.append(h)

        h_pre = h
        if config.num_core_layers:  # depth 0 too: r = 0 reads out h_0
            h = self.initial_state(h_pre, position_ids)
        states, proposals, gates = [h], [], []
        core_mask = staged_mask if staged_mask is not None else mask
        if self.router is not None:  # Mixture-of-Recursions: the routed steps replace the loop below
            keep = None if attention_mask is None else attention_mask[:, -seqlen:]
            h, routed_states, routed_proposals = self.router(
                h, depth, self.core, router_inference, cache, cache_slots, keep
            )
            if output_recurrence or output_step_exits:
                states.extend(routed_states)
            if output_recurrence:
                proposals.extend(routed_proposals)
            if hidden_states is not None:
                hidden_states.extend(routed_states)
        for step in range(depth if self.router is None else 0):
            o = h if self.proj is None else self.proj(torch.cat([h, h_pre], dim=-1))
            for j, block in enumerate(self.core):
                lora = None if self.adapters is None else self.adapters.block_lora(step, j)
                o = block(o, rope, core_mask, kv("core", j, step), lora)
            if self.gate is None:
                g, h = None, o
            else:
                g = self.gate(h, h_pre)
                h = g * h + (1 - g) * o
            if output_recurrence or output_step_exits or readout:
                states.append(h)
                if output_recurrence:
                    proposals.append(o)
                    gates.append(g)
            if hidden_states is not None:
                hidden_states.append(h)
        if cache is not None:
            cache.end_recurrence(depth, cache_slots)

        exits = None
        if output_step_exits:
            if past > 0:
                raise ValueError(
                    "output_step_logits needs the whole sequence in one call (no past cache): "
                    "an early exit's coda has no cached K/V for earlier tokens"
                )
            # A per-token exit reads every step out below; only h_0's exit is extra.
            exits = [self._exit(s, rope, mask) for s in (states[:1] if readout else states[:-1])]

        exit_steps = None
        if readout:
            h, exit_steps, readouts, coda_outputs = self._exit_readout(
                states[1:], rope, mask, kv, keep_coda=hidden_states is not None
            )
            if hidden_states is not None:
                hidden_states.extend(coda_outputs)
            if exits is not None:
                exits.extend(readouts)
        else:
            for i, block in enumerate(self.coda):
                h = block(h, rope, mask, kv("coda", i))
                if hidden_states is not None:
                    hidden_states.append(h)
            h = self.norm(h)
            if exits is not None:
                exits.append(h)
        if cache is not None:
            cache.end_forward(seqlen)

        out = GRTBaseModelOutputWithPast(
            last_hidden_state=h,
            **{CACHE_FIELD: cache if use_cache else None},
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            recurrence_states=tuple(states) if output_recurrence else None,
            proposals=tuple(proposals) if output_recurrence else None,
            gate_values=tuple(gates) if output_recurrence and self.gate is not None else None,
            step_exits=tuple(exits) if exits is not None else None,
            exit_steps=exit_steps,
        )
        return out if return_dict else out.to_tuple()

    def _exit(self, h, rope, mask):
        """Coda and final norm on an intermediate state, without cache (analysis only)."""
        for block in self.coda:
            h = block(h, rope, mask, None)
        return self.norm(h)

    def _exit_readout(self, states, rope, mask, kv, keep_coda=False):
        """Ouro's Q-exit over the states h_1..h_r: every step's coda (with its own step's
        cache slots) and final norm, the exit gate, and each token's exit step gathered.

        Returns the gathered hidden `[B, T, d]`, the exit step per token `[B, T]` (1-based),
        the r normed readouts, and (`keep_coda`) each coda block's output at the exit steps.
        All r steps run (as in Ouro's released code): no compute is saved, only the choice
        is per token.
        """
        readouts, coda_outputs = [], []
        for step, h in enumerate(states):
            per_block = []
            for i, block in enumerate(self.coda):
                h = block(h, rope, mask, kv("coda", i, step))
                if keep_coda:
                    per_block.append(h)
            readouts.append(self.norm(h))
            coda_outputs.append(per_block)
        hidden = torch.stack(readouts)  # [r, B, T, d]
        exit_index = q_exit_steps(self.exit_gate(hidden).squeeze(-1).float(), self.config.exit_threshold)

        def gather(per_step: torch.Tensor) -> torch.Tensor:
            index = exit_index[None, :, :, None].expand(1, *per_step.shape[1:])
            return per_step.gather(0, index).squeeze(0)

        gathered_coda = [gather(torch.stack(blocks)) for blocks in zip(*coda_outputs)]  # [] unless keep_coda
        return gather(hidden), exit_index + 1, readouts, gathered_coda


class GRTForCausalLM(GRTPreTrainedModel, GenerationMixin):
    """GRT language model. `forward`/`generate` take `num_recurrences` and `kv_cache_strategy`."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: GRTConfig):
        super().__init__(config)
        self.model = GRTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate() must not build a DynamicCache: forward creates a GRTCache.
        return False

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        cache=None,
        labels=None,
        use_cache=None,
        num_recurrences=None,
        kv_cache_strategy=None,
        cache_slots=None,
        output_hidden_states=None,
        output_recurrence=False,
        output_step_logits=False,
        logits_to_keep=0,
        return_dict=None,
        router_inference=None,
        **kwargs,
    ):
        r"""Logits `[B, T, V]` for `input_ids` `[B, T]`.

        Args:
            num_recurrences: depth r of this call (None: `config.num_recurrences`).
            kv_cache_strategy: strategy of the cache this call creates (None: the config's);
                ignored-but-checked when `past_key_values` is given.
            cache_slots: cache slots of the new tokens (static caches); default: the
                next T slots.
            output_recurrence: also return `recurrence_states`, `proposals`, `gate_values`.
            output_step_logits: also return `step_logits` for every exit s = 0..r.
            logits_to_keep: compute logits for the last k positions only (0 = all).
            router_inference: Mixture-of-Recursions' routing rule of this call, "threshold"
                (causal, generation) or "top_k" (training's, use_cache=False); None: the config's.
        """
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values if past_key_values is not None else cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            num_recurrences=num_recurrences,
            kv_cache_strategy=kv_cache_strategy,
            cache_slots=cache_slots,
            output_hidden_states=output_hidden_states,
            output_recurrence=output_recurrence,
            output_step_exits=output_step_logits,
            return_dict=True,
            router_inference=router_inference,
        )
        h = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = self.lm_head(h[:, -logits_to_keep:])
        elif isinstance(logits_to_keep, torch.Tensor):
            logits = self.lm_head(h[:, logits_to_keep])
        else:
            logits = self.lm_head(h)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        step_logits = None
        if outputs.step_exits is not None:
            step_logits = tuple(self.lm_head(e) for e in outputs.step_exits)
        out = GRTModelOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            hidden_states=outputs.hidden_states,
            recurrence_states=outputs.recurrence_states,
            proposals=outputs.proposals,
            gate_values=outputs.gate_values,
            step_logits=step_logits,
            exit_steps=outputs.exit_steps,
        )
        if return_dict is False:
            return out.to_tuple()
        return out
