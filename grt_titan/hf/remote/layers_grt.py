"""Layers of the GRT's transformers model: RoPE, attention (qwen3 blocks: qk-norm), MLP,
blocks, and the modules of the recurrence's parts (the gate, RRT's step adapters, the random
initial state's table), which parts_grt.py builds.

Remote code: imports torch and transformers only, exported next to modeling_grt.py. The
functions marked `# Copied from grt_titan.model.<module>.<name>` are the training model's,
character for character (tests/hf/test_hf_copies.py compares the sources).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# The annotations name transformers' base class, not GRTConfig: configuration_grt.py imports
# the parts, which import this file (an import circle).
from transformers import PretrainedConfig


# Adapted from torchtitan.models.llama3.model.model.precompute_freqs_cis: its frequencies and
# llama3 scaling, read from the config (torchtitan's code, not grt_titan's: the parity tests check it)
def rope_inverse_frequencies(config: PretrainedConfig, device=None) -> torch.Tensor:
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


# Adapted from torchtitan.models.qwen3.model.model.apply_rotary_emb: one tensor, cos / sin given
def apply_rope_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[i], x[i + d_h / 2]) of `x` [B, T, H, d_h] in x's dtype, as
    torchtitan's qwen3 blocks (and Hugging Face's rotate_half); `cos`, `sin` [.., d_h] hold each
    frequency twice."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos.to(x.dtype)) + (rotated * sin.to(x.dtype))


class GRTAttention(nn.Module):
    """Causal self-attention (SDPA); GQA and RoPE for llama and qwen3 styles (qwen3: qk-norm,
    an RMSNorm per head on q and k before RoPE), biases for gpt2 style."""

    def __init__(self, config: PretrainedConfig):
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
        self.qk_norm = config.block_style == "qwen3"
        if self.qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=config.norm_eps)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=config.norm_eps)
        self.rotate = apply_rope_halves if config.block_style == "qwen3" else apply_rope

    def forward(self, x, rope, mask, kv_update, lora=None):
        bsz, seqlen, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if lora is not None:  # RRT: the step's LoRA on GPT-2's fused q/k/v projection
            dq, dk, dv = lora("qkv", x).chunk(3, dim=-1)
            q, k, v = q + dq, k + dk, v + dv
        q = q.view(bsz, seqlen, self.num_heads, self.head_dim)
        k = k.view(bsz, seqlen, self.num_kv_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = self.rotate(q, *rope), self.rotate(k, *rope)
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
    """gpt2: down(gelu_tanh(up(x))); llama and qwen3: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        d, hidden = config.hidden_size, config.intermediate_size
        self.swiglu = config.block_style != "gpt2"
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


def make_norm(config: PretrainedConfig) -> nn.Module:
    if config.block_style == "gpt2":
        return nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
    return nn.RMSNorm(config.hidden_size, eps=config.norm_eps)


class GRTBlock(nn.Module):
    """Pre-norm transformer block: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, config: PretrainedConfig):
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
    """g = sigmoid(w_out(silu(w_in([LN(h); LN(h_pre)]))) / tau), or a constant (override).
    No noise at inference: the model passes `noise = None`."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        d, hidden = config.hidden_size, config.gate_hidden_size
        self.state_norm = nn.LayerNorm(d, eps=config.norm_eps)
        self.anchor_norm = nn.LayerNorm(d, eps=config.norm_eps)
        self.w_in = nn.Linear(2 * d, hidden)
        self.w_out = nn.Linear(hidden, d)
        # transformers initialises the modules that hold parameters themselves (w_out, not
        # this one: remote code's modules without their own parameters are skipped), so the
        # gate's init is w_out's (`GRTPreTrainedModel._init_weights` calls it).
        self.w_out.init_new_weights = self.init_new_weights
        self.temperature = config.gate_temperature
        self.override = config.gate_override

    def init_new_weights(self) -> None:
        """Paper: the last bias starts at +4, g ~ 0.98 (near-identity recurrence); for weights
        missing from a checkpoint (`GRTPreTrainedModel._init_weights`)."""
        nn.init.constant_(self.w_out.bias, 4.0)

    # Copied from grt_titan.model.recurrence.Gate.forward
    def forward(self, h: torch.Tensor, h_pre: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        if self.override is not None:
            return torch.full_like(h, self.override)
        features = torch.cat([self.state_norm(h), self.anchor_norm(h_pre)], dim=-1)
        logits = self.w_out(F.silu(self.w_in(features))) / self.temperature
        if noise is not None:
            logits = logits + noise
        return torch.sigmoid(logits)


# Copied from grt_titan.model.methods.rrt.lora_delta
def lora_delta(x: torch.Tensor, factors: tuple[torch.Tensor, torch.Tensor], scale: float) -> torch.Tensor:
    a, b = factors
    return (x @ a.t().to(x.dtype)) @ (b.t().to(x.dtype) * scale)


class GRTStepAdapters(nn.Module):
    """RRT's per-step LoRA (Bae et al. 2024): one adapter per (recurrence step, core block)
    on the gpt2 block's fused q/k/v, attention output, MLP input and output.

    Factors are stored step-major, `a[name]` `[R, n, rank, in]` and `b[name]`
    `[R, n, out, rank]` (R = `num_recurrences`); the delta of a linear is `lora_delta`,
    scale * (x A^T) B^T, as grt_titan trains it.
    """

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        d, hidden = config.hidden_size, config.intermediate_size
        steps, blocks, rank = config.num_recurrences, config.num_core_layers, config.lora_rank
        linears = {"qkv": (d, 3 * d), "attention_out": (d, d), "mlp_in": (d, hidden), "mlp_out": (hidden, d)}
        self.scale = config.lora_scale
        self.a = nn.ParameterDict(
            {n: nn.Parameter(torch.empty(steps, blocks, rank, i)) for n, (i, _) in linears.items()}
        )
        self.b = nn.ParameterDict(
            {n: nn.Parameter(torch.empty(steps, blocks, o, rank)) for n, (_, o) in linears.items()}
        )
        # The factors' init runs where transformers initialises, on the dicts holding them (see GRTGate).
        self.a.init_new_weights = self.b.init_new_weights = self.init_new_weights

    def init_new_weights(self) -> None:
        """PEFT's from-scratch LoRA: A Kaiming-uniform, B = 0 (each adapter a no-op)."""
        for a in self.a.values():
            bound = 1 / math.sqrt(a.shape[-1])
            nn.init.uniform_(a, -bound, bound)
        for b in self.b.values():
            nn.init.zeros_(b)

    def block_lora(self, step: int, block: int):
        """`lora(name, x)` of core block `block` at step `step` (0-based), for `GRTBlock`."""

        def lora(name: str, x: torch.Tensor) -> torch.Tensor:
            return lora_delta(x, (self.a[name][step, block], self.b[name][step, block]), self.scale)

        return lora


# Copied from grt_titan.model.methods.poisson.eval_initial_state with torch.empty(max_seq_len, dim)->torch.empty(max_seq_len, dim, dtype=torch.float32)
def eval_initial_state(seed: int, max_seq_len: int, dim: int, std: float) -> torch.Tensor:
    """The eval-mode random initial state [max_seq_len, dim]: row s is position s's, the same
    for every sequence and every call (one CPU draw seeded by `seed`, always of the full
    length: a draw's prefix depends on its length)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    state = torch.empty(max_seq_len, dim, dtype=torch.float32)
    return nn.init.trunc_normal_(state, std=std, a=-3 * std, b=3 * std, generator=generator)


class GRTSourceAnchor(nn.Module):
    """SCSE's anchor h* = e + a A e and initial state h_0 = e + b B e from the prelude output
    e (A, B: bias-free Linear(d, d); `model.anchor.{anchor_proj,init_delta_proj}`)."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.anchor_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.init_delta_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.anchor_scale = config.anchor_scale
        self.initial_deviation_scale = config.initial_deviation_scale

    # Copied from grt_titan.model.methods.scse.SourceAnchor.forward
    def forward(self, h_pre: torch.Tensor) -> torch.Tensor:
        """The anchor h*."""
        return h_pre + self.anchor_scale * self.anchor_proj(h_pre)

    # Copied from grt_titan.model.methods.scse.SourceAnchor.initial_state
    def initial_state(self, h_pre: torch.Tensor) -> torch.Tensor:
        """h_0."""
        return h_pre + self.initial_deviation_scale * self.init_delta_proj(h_pre)


# Copied from grt_titan.model.methods.scse.deviation_step
def deviation_step(h, delta, proposal, step_size: float, mask_eps: float) -> torch.Tensor:
    """h + m_b s (proposal - Delta), m_b = 1{||Delta^(b)||_F^2 > eps} per sequence b."""
    wide = delta.to(torch.promote_types(delta.dtype, torch.float32))  # bf16 sums in fp32
    energy = wide.pow(2).sum(dim=tuple(range(1, delta.dim())), keepdim=True)
    mask = (energy > mask_eps).to(h.dtype)
    return h + mask * (step_size * (proposal - delta))


class InitialStateTable(nn.Module):
    """The random initial state at inference: h_0 of a token at position t is row t of
    `eval_initial_state`'s table (a cached decode step sees what a full forward gives it).
    No weights: the table is drawn from the config, kept in the model's dtype and device."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.seed, self.std = config.initial_state_seed, config.initial_state_std
        self.rows, self.dim = config.max_position_embeddings, config.hidden_size
        self.table: torch.Tensor | None = None  # not a buffer: never in the state dict

    def forward(self, h_pre: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        table = self.table
        if table is None or table.device != h_pre.device or table.dtype != h_pre.dtype:
            table = eval_initial_state(self.seed, self.rows, self.dim, self.std)
            self.table = table = table.to(device=h_pre.device, dtype=h_pre.dtype)
        if not torch.compiler.is_compiling() and int(position_ids.max()) >= table.shape[0]:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond the random initial state's table "
                f"(max_position_embeddings = {table.shape[0]})"
            )
        return table[position_ids].expand_as(h_pre)
