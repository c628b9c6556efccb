"""Hugging Face model of the Gated Recurrent Transformer (GRT, arXiv 2608.15062).

Remote code (imports torch and transformers only): `grt-titan export-hf` copies this file
and its siblings next to the weights, and `AutoModelForCausalLM.from_pretrained(dir,
trust_remote_code=True)` loads it (transformers copies the files it imports relatively):

    configuration_grt.py   GRTConfig
    parts_grt.py           the recurrence's parts: each one's rules, modules and hooks
    layers_grt.py          RoPE, attention, MLP, blocks, the gate, RRT's step adapters
    cache_grt.py           GRTCache (the KV cache across recurrences), MoRCache, the masks
    routing_grt.py         Mixture-of-Recursions' routed recurrence
    exit_grt.py            Ouro's exit gate and per-token exit
    halting_grt.py         per-token halting at inference (`halting=...`)
    modeling_grt.py        the models (this file)

The math equals grt_titan's torchtitan model:

    h     = embed(x) (+ learned positions, gpt2 style)
    h_pre = prelude(h);  h = h_pre
    for step in 1..r:                                    r = the call's depth
        o = core(W_proj [h ; h_pre])                     the same n blocks every step
        g = sigmoid(f_g([LN(h) ; LN(h_pre)]) / tau)      no noise at inference
        h = g * h + (1 - g) * o
    logits = lm_head(norm(coda(h)))

That is GRT; the config's recurrence parts give the paper's other recurrent models:

    injection = "none"        o = core(h)                        (no W_proj)
    update = "overwrite"      h = o                              (no gate)
    initial_state = "random"  h_0 = row t of a fixed TruncNormal table for position t
    step_adapter = "lora"     core at step s = core + step s's LoRA (RRT, r <= R)
    SCSE (injection, update = "deviation", initial_state = "anchor"): h* = h_pre + a A h_pre,
                              h_0 = h_pre + b B h_pre; o = core(h - h*),
                              h = h + m s (o - (h - h*)), m = 0 for a sequence at its anchor
    objective = "exit_distribution"   Ouro: with exit_threshold q < 1, every step's state is
                              read out, hidden_t = norm(coda(h_t)), an exit gate gives
                              lambda_t = sigmoid(exit_gate(hidden_t)), and each token's
                              logits are lm_head(hidden_t) at its Q-exit step t (the first
                              with 1 - prod_{j<=t} (1 - lambda_j) >= q, else r). As Ouro's
                              released code, all r steps run and the chosen one is gathered
                              (no compute saved). q = 1 is the last step: the plain forward.
    router = "expert_choice"  step s updates only the tokens its router routes (MoR, r <= R;
                              routing_grt.py, and its recursion-wise cache `MoRCache`)

Each choice above is a part (parts_grt.py): the model builds the active parts' modules, and
the forward asks each key's slot for its hook (the initial state, the core's input, a core
block's adapter, the update, the steps, the readout), so it never tests a config field.

Depth, as in training: R = `config.num_recurrences` (the trained depth); the default depth
of a call is `config.eval_recurrences` (None: R); a call's own is `forward(...,
num_recurrences=r)` / `generate(..., num_recurrences=r)` (0 = prelude + coda only, r < R
early exit, r > R extrapolation).

KV cache across recurrences: `GRTCache` (cache_grt.py), the one place the strategies live
(`per_step`, `first`, `last`, `average`).

Per-token halting (halting_grt.py): `forward(..., halting="state" | "gate" | "kl" |
"entropy" | "argmax", halting_threshold=x, min_recurrences=a, num_recurrences=b)` (and the
same in `generate`) lets each token stop recurring once its rule says it has converged, after
at least a and at most b steps; the output's `recurrence_depths` `[B, T]` is the depth each
token used.

RoPE (llama style) rotates interleaved pairs (x[2i], x[2i+1]) exactly like torchtitan's
complex `apply_rotary_emb`, so the exported q/k weights are torchtitan's, unpermuted; qwen3
style rotates the halves (x[i], x[i + d_h / 2]) after its per-head q/k RMSNorm (qk-norm), as
torchtitan's qwen3 block and Hugging Face's Qwen3 do.

Analysis outputs (`output_recurrence=True`): the states h_0 (= h_pre, or the random initial
state), h_1..h_r, the core proposals o_1..o_r and the gates g_1..g_r (None without a
gate); `output_step_logits=True` adds the logits of exiting after every step s = 0..r
(coda + head on h_s).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.generation.configuration_utils import GenerationMode
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

# MoRCache and eval_initial_state stay importable from this module (benchmarks, tests), as
# before the parts had their own file.
from .cache_grt import GRTCache, MoRCache, attention_masks  # noqa: F401
from .configuration_grt import GRTConfig
from .halting_grt import (
    HALTING_RULES,
    LEARNED_RULE,
    READOUT_RULES,
    Halting,
    HaltingProbe,
    halting_of_call,
    halting_steps,
)
from .layers_grt import GRTBlock, eval_initial_state, make_norm, rope_inverse_frequencies  # noqa: F401
from .parts_grt import PARTS, active_parts, cache_class, slots

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
    recurrence_depths: with per-token halting (`halting=...`), the depth `[B, T]` each token
        used (0 for left padding); None otherwise (every token runs the call's depth).
    halting_logits: a readout halting rule's (kl, entropy, argmax) logits `[B, T, V]` of each
        token at the step it halted, `halting_head` of `last_hidden_state`, already computed
        for the rule (GRTForCausalLM returns them instead of running its head again).
    """

    recurrence_states: tuple[torch.Tensor, ...] | None = None
    proposals: tuple[torch.Tensor, ...] | None = None
    gate_values: tuple[torch.Tensor, ...] | None = None
    step_exits: tuple[torch.Tensor, ...] | None = None
    exit_steps: torch.Tensor | None = None
    recurrence_depths: torch.Tensor | None = None
    halting_logits: torch.Tensor | None = None


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
    recurrence_depths: with per-token halting (`halting=...`), the depth `[B, T]` each token
        used (0 for left padding); None otherwise.
    """

    recurrence_states: tuple[torch.Tensor, ...] | None = None
    proposals: tuple[torch.Tensor, ...] | None = None
    gate_values: tuple[torch.Tensor, ...] | None = None
    step_logits: tuple[torch.Tensor, ...] | None = None
    exit_steps: torch.Tensor | None = None
    recurrence_depths: torch.Tensor | None = None


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
        init_new_weights = getattr(module, "init_new_weights", None)  # a part's module: its own init
        if init_new_weights is not None:
            init_new_weights()


@dataclass
class ForwardContext:
    """What the phases of one `GRTModel.forward` share: the depth, the cache and where the
    new tokens go in it, their positions, RoPE and attention masks."""

    depth: int
    cache: GRTCache | None
    cache_slots: torch.Tensor
    position_ids: torch.Tensor
    past: int  # tokens cached before this call that the keys start with (dynamic cache)
    per_token_exit: bool  # Ouro with q < 1 (and r >= 1): every step read out
    rope: tuple[torch.Tensor, torch.Tensor] | None
    mask: torch.Tensor | None
    core_mask: torch.Tensor | None  # a static compressed cache's core keys differ
    halting: Halting | None  # per-token halting (halting_grt.py), None: a fixed depth
    halting_head: nn.Module | None = None  # the LM head a readout halting rule reads each step with
    halted_readout: tuple | None = None  # a readout rule's (hidden, coda outputs) at each token's halting step

    def kv(self, kind: str, index: int, step: int = 0):
        """The `kv_update` of a block (`GRTAttention`): None without a cache."""
        if self.cache is None:
            return None
        return lambda k, v: self.cache.update_kv(k, v, kind, index, step, self.cache_slots)


class ForwardRecord:
    """What one forward keeps for its outputs: the hidden states (`output_hidden_states`),
    the states h_0..h_r (`keep_states`: analysis outputs, step exits, Ouro's per-token exit),
    the proposals and gates (`keep_parts`)."""

    def __init__(self, embeddings: torch.Tensor, hidden: bool, keep_states: bool, keep_parts: bool):
        self.hidden_states = [embeddings] if hidden else None
        self.keep_states, self.keep_parts = keep_states, keep_parts
        self.states: list[torch.Tensor] = []
        self.proposals: list[torch.Tensor] = []
        self.gates: list[torch.Tensor | None] = []

    def block(self, h: torch.Tensor) -> None:
        if self.hidden_states is not None:
            self.hidden_states.append(h)

    def step(self, h: torch.Tensor, proposal: torch.Tensor, gate: torch.Tensor | None) -> None:
        if self.keep_states:
            self.states.append(h)
            if self.keep_parts:
                self.proposals.append(proposal)
                self.gates.append(gate)
        self.block(h)


class GRTModel(GRTPreTrainedModel):
    """Embeddings, prelude, recurrence (the shared core and the modules of the config's
    parts, parts_grt.py), coda, final norm."""

    def __init__(self, config: GRTConfig):
        super().__init__(config)
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        if config.block_style == "gpt2":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, d)
        self.prelude = nn.ModuleList(GRTBlock(config) for _ in range(config.num_prelude_layers))
        if config.num_core_layers:
            self.core = nn.ModuleList(GRTBlock(config) for _ in range(config.num_core_layers))
        # The recurrence's parts (parts_grt.py): each active part's module under its name
        # (`model.proj`, `model.gate`, `model.adapters`, `model.exit_gate`, `model.router`, ...);
        # those of the parts a model does not have are None: no weights stored, none expected.
        self.parts = active_parts(config)  # this file's copy of the parts (the config's may be another)
        self.slots = slots(self.parts)
        self.cache_class = cache_class(self.parts)
        for part in PARTS:
            if part.module_name is not None:  # SCSE's injection and update hold no module
                setattr(self, part.module_name, part.build(config) if part in self.parts else None)
        self.coda = nn.ModuleList(GRTBlock(config) for _ in range(config.num_coda_layers))
        self.norm = make_norm(config)
        # The learned halting rule's probe, where the export holds one (halting_grt.py).
        self.halting_probe = HaltingProbe(d) if config.halting_probe else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def resolve_depth(self, num_recurrences) -> int:
        """The depth r of a call: `num_recurrences`, checked; None: the config's `eval_depth`."""
        if num_recurrences is None:
            return self.config.eval_depth
        if isinstance(num_recurrences, bool) or not isinstance(num_recurrences, int):
            raise TypeError(f"num_recurrences must be an int, got {num_recurrences!r}")
        if num_recurrences < 0:
            raise ValueError(f"num_recurrences = {num_recurrences}; use r >= 0")
        if num_recurrences and not self.config.num_core_layers:
            raise ValueError(f"num_recurrences = {num_recurrences} given to a model without core layers")
        for part in self.parts:  # per-step modules: no depth above R
            part.check_depth(num_recurrences, self.config.num_recurrences)
        return num_recurrences

    def _rope(self, position_ids, device):
        """(cos, sin) of the positions: [B or 1, T, 1, d_h / 2] for llama's interleaved pairs,
        each frequency twice, [.., d_h], for qwen3's halves; None for gpt2 (learned positions)."""
        if self.config.block_style == "gpt2":
            return None
        inv_freq = rope_inverse_frequencies(self.config, device=device)
        angles = position_ids.float()[..., None] * inv_freq  # [B or 1, T, d_h / 2]
        if self.config.block_style == "qwen3":  # torchtitan's qwen3 cache: cat([angles, angles])
            angles = torch.cat([angles, angles], dim=-1)
        return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]

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
        halting=None,
        halting_threshold=None,
        min_recurrences=None,
        halting_head=None,
        **kwargs,
    ):
        """A `GRTBaseModelOutputWithPast`; its `to_tuple()` (None fields left out) when
        `return_dict` is False (None: `config.return_dict`).

        In phases: the call's depth and cache, its context (positions, RoPE, masks), the
        prelude, the recurrence (the loop, or MoR's routed steps), the readout (coda and
        final norm, or Ouro's per-token exit)."""
        config = self.config
        if output_hidden_states is None:
            output_hidden_states = config.output_hidden_states
        if return_dict is None:
            return_dict = getattr(config, "return_dict", True)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        depth = self.resolve_depth(num_recurrences)
        config.check_call_settings()  # the parts' settings may have been set after loading
        halt = self._halting(halting, halting_threshold, min_recurrences, depth, halting_head)
        cache = past_key_values if past_key_values is not None else cache
        cache, use_cache = self._open_cache(cache, use_cache, kv_cache_strategy, router_inference)
        call = self._context(inputs_embeds, attention_mask, position_ids, cache, cache_slots, depth, halt)
        call.halting_head = halting_head

        h = inputs_embeds
        if config.block_style == "gpt2":
            h = h + self.embed_positions(call.position_ids)
        keep_states = output_recurrence or output_step_exits or call.per_token_exit
        record = ForwardRecord(h, output_hidden_states, keep_states, output_recurrence)
        h_pre = self._blocks(self.prelude, "prelude", h, call, record)
        keep = None if attention_mask is None else attention_mask[:, -h.shape[1] :]
        h, depths = self._recurrence(h_pre, call, record, router_inference, keep)
        h, exits, exit_steps = self._readout(h, call, record, output_step_exits)
        if cache is not None:
            cache.end_forward(h.shape[1])

        out = GRTBaseModelOutputWithPast(
            last_hidden_state=h,
            **{CACHE_FIELD: cache if use_cache else None},
            hidden_states=tuple(record.hidden_states) if record.hidden_states is not None else None,
            recurrence_states=tuple(record.states) if output_recurrence else None,
            proposals=tuple(record.proposals) if output_recurrence else None,
            gate_values=tuple(record.gates) if output_recurrence and self.slots["update"].gated else None,
            step_exits=tuple(exits) if exits is not None else None,
            exit_steps=exit_steps,
            recurrence_depths=depths,
            halting_logits=None if call.halted_readout is None else call.halted_readout[2],
        )
        return out if return_dict else out.to_tuple()

    # ---- the phases of forward ------------------------------------------------------

    def _halting(self, halting, halting_threshold, min_recurrences, depth: int, head) -> Halting | None:
        """The call's per-token halting (halting_grt.py), checked against the model's parts."""
        if halting == LEARNED_RULE:
            if self.halting_probe is None:
                raise ValueError(
                    f"halting = {LEARNED_RULE!r} reads a halting probe, and this export holds none (config.json's "
                    "halting_probe is false); allowed: halting = one of "
                    f"{HALTING_RULES}, or export with `grt-titan export-hf --halting-probe FILE`"
                )
            if halting_threshold is None:
                raise ValueError(f"halting = {LEARNED_RULE!r} needs halting_threshold (>= 0; 0 never halts)")
            halt = halting_of_call("state", halting_threshold, min_recurrences, depth)  # the same number checks
            halt = Halting(LEARNED_RULE, halt.threshold, halt.min_depth, halt.max_depth)
        else:
            halt = halting_of_call(halting, halting_threshold, min_recurrences, depth)
        if halt is None:
            return None
        if halt.rule in READOUT_RULES and head is None:
            raise ValueError(
                f"halting = {halting!r} reads each step's next-token distribution: call GRTForCausalLM "
                "(or give GRTModel halting_head=the LM head); allowed here: halting = 'state' or 'gate'"
            )
        config = self.config
        if not config.num_core_layers:
            raise ValueError(f"halting = {halting!r} given to a model without core layers")
        own = [part.label for part in self.parts if part.key == "router"]
        if self.slots["objective"].reads_every_step(config):
            own.append(f"exit_threshold = {config.exit_threshold} (Ouro's per-token exit)")
        if own:
            raise ValueError(
                f"halting = {halting!r} is not supported with {own[0]}: that model chooses each "
                "token's steps itself; allowed: halting = None"
            )
        if halt.rule == "gate" and not self.slots["update"].gated:
            raise ValueError(
                f"halting = 'gate' needs the gate (update = 'gate'); this model's update is "
                f"{config.update!r}; allowed: halting = 'state'"
            )
        return halt

    def _open_cache(self, cache, use_cache, kv_cache_strategy, router_inference):
        """(the call's cache, use_cache): the given cache, checked by the parts, or a new one of
        the parts' cache class if use_cache (None: the config's, unless a part keeps none)."""
        config = self.config
        if use_cache is None:
            use_cache = config.use_cache and all(part.keeps_cache(config, router_inference) for part in self.parts)
        if cache is not None:
            if not isinstance(cache, GRTCache):
                raise TypeError(
                    f"past_key_values must be a GRTCache (got {type(cache).__name__}); "
                    "a GRT needs its own cache across recurrence steps"
                )
            for part in self.parts:  # MoR: a MoRCache
                part.check_cache(cache)
        if cache is None and use_cache:
            cache = self.cache_class(config, strategy=kv_cache_strategy)
        elif cache is not None and kv_cache_strategy not in (None, cache.strategy):
            raise ValueError(f"kv_cache_strategy = {kv_cache_strategy!r} but the given cache uses {cache.strategy!r}")
        return cache, use_cache

    def _context(
        self, inputs_embeds, attention_mask, position_ids, cache, cache_slots, depth, halting
    ) -> ForwardContext:
        """The call's cache slots and positions (left padding: from each row's first real
        token), the cache begun at this depth, RoPE and the attention masks."""
        config = self.config
        batch, seqlen = inputs_embeds.shape[:2]
        device = inputs_embeds.device
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
            cache.check_layout(config, halting is not None and halting.rule in READOUT_RULES)
            cache.begin(depth)
        if config.block_style == "gpt2":
            if not torch.compiler.is_compiling() and int(position_ids.max()) >= config.max_position_embeddings:
                raise ValueError(
                    f"position {int(position_ids.max())} is beyond the learned positions "
                    f"(max_position_embeddings = {config.max_position_embeddings})"
                )
        mask, staged_mask = attention_masks(attention_mask, cache, cache_slots, past, seqlen, batch, device)
        return ForwardContext(
            depth=depth,
            cache=cache,
            cache_slots=cache_slots,
            position_ids=position_ids,
            past=past,
            # Ouro with q < 1: every step read out, each token's exit step gathered (r = 0 has
            # no step to exit at: the plain readout of h_0).
            per_token_exit=depth > 0 and self.slots["objective"].reads_every_step(config),
            rope=self._rope(position_ids, device),
            mask=mask,
            core_mask=staged_mask if staged_mask is not None else mask,
            halting=halting,
        )

    def _blocks(self, blocks, kind: str, h, call: ForwardContext, record: ForwardRecord):
        """The prelude or the coda (`kind`), each block's output recorded."""
        for i, block in enumerate(blocks):
            h = block(h, call.rope, call.mask, call.kv(kind, i))
            record.block(h)
        return h

    def _recurrence(self, h_pre, call: ForwardContext, record: ForwardRecord, router_inference, keep):
        """(h_r after `call.depth` steps from h_0 (recorded first), each token's depth or None):
        the initial state's slot gives h_0, the router's runs the steps (the plain loop, or MoR's
        routed steps; `keep` [B, T]: False for padding, which never enters MoR's core), or the
        plain loop with per-token halting."""
        start = self.slots["initial_state"]
        h = start.initial_state(self, h_pre, call.position_ids)
        source = start.source(self, h_pre)  # h_pre, or SCSE's anchor h*
        record.states.append(h)  # depth 0 too: r = 0 reads out h_0
        depths = None
        if call.halting is not None:
            h, depths, call.halted_readout = halting_steps(
                self, h, source, call, record, call.halting, keep, call.halting_head
            )
        else:
            h = self.slots["router"].run_steps(self, h, source, call, record, router_inference, keep)
        if call.cache is not None:
            call.cache.end_recurrence(call.depth, call.cache_slots)
        return h, depths

    def plain_steps(self, h, h_pre, call: ForwardContext, record: ForwardRecord) -> torch.Tensor:
        """The plain loop: o = core(step input), each core block with its step's adapter, then
        the update; the slots of injection, step_adapter and update give each."""
        inject, adapt, update = (self.slots[key] for key in ("injection", "step_adapter", "update"))
        for step in range(call.depth):
            o = inject.core_input(self, h, h_pre)
            for j, block in enumerate(self.core):
                o = block(o, call.rope, call.core_mask, call.kv("core", j, step), adapt.core_lora(self, step, j))
            h, g = update.update(self, h, h_pre, o)
            record.step(h, o, g)
        return h

    def _readout(self, h, call: ForwardContext, record: ForwardRecord, output_step_exits: bool):
        """(the LM head's input, the step exits or None, the exit steps or None): the
        objective's slot reads out (coda and final norm on h_r, or Ouro's per-token exit)."""
        exits = None
        if output_step_exits:
            if call.past > 0:
                raise ValueError(
                    "output_step_logits needs the whole sequence in one call (no past cache): "
                    "an early exit's coda has no cached K/V for earlier tokens"
                )
            # A per-token exit reads every step out itself; only h_0's exit is extra.
            states = record.states[:1] if call.per_token_exit else record.states[:-1]
            exits = [self._exit(s, call.rope, call.mask) for s in states]
        return self.slots["objective"].readout(self, h, call, record, exits)

    def coda_readout(self, h, call: ForwardContext, record: ForwardRecord, exits):
        """The plain readout: coda and final norm on h_r (appended to `exits` when kept); a
        readout halting rule's: each token's readout at the step it halted, already run."""
        if call.halted_readout is not None:
            h, coda_outputs, _ = call.halted_readout
            for output in coda_outputs:
                record.block(output)
        else:
            h = self.norm(self._blocks(self.coda, "coda", h, call, record))
        if exits is not None:
            exits.append(h)
        return h, exits, None

    def _exit(self, h, rope, mask):
        """Coda and final norm on an intermediate state, without cache (analysis only)."""
        for block in self.coda:
            h = block(h, rope, mask, None)
        return self.norm(h)


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

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, *args, **kwargs):
        """Assisted decoding (prompt lookup, an assistant model) needs the cache before the first
        forward, which otherwise opens it: open it here, refused unless exact (`per_step`)."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode, *args, **kwargs)
        if generation_mode != GenerationMode.ASSISTED_GENERATION or generation_config.use_cache is False:
            return
        strategy, routing = model_kwargs.get("kv_cache_strategy"), model_kwargs.get("router_inference")
        cache, _ = self.model._open_cache(model_kwargs.get(CACHE_FIELD), True, strategy, routing)
        cache.check_assisted_decoding()
        model_kwargs[CACHE_FIELD] = cache

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
        halting=None,
        halting_threshold=None,
        min_recurrences=None,
        **kwargs,
    ):
        r"""Logits `[B, T, V]` for `input_ids` `[B, T]`.

        Args:
            num_recurrences: depth r of this call (None: `config.eval_depth`, the config's
                eval_recurrences, default R = config.num_recurrences).
            kv_cache_strategy: strategy of the cache this call creates (None: the config's);
                ignored-but-checked when `past_key_values` is given.
            cache_slots: cache slots of the new tokens (static caches); default: the
                next T slots.
            output_recurrence: also return `recurrence_states`, `proposals`, `gate_values`.
            output_step_logits: also return `step_logits` for every exit s = 0..r.
            logits_to_keep: compute logits for the last k positions only (0 = all).
            router_inference: Mixture-of-Recursions' routing rule of this call, "threshold"
                (causal, generation) or "top_k" (training's, use_cache=False); None: the config's.
            halting: per-token halting rule of this call, "state", "gate", "kl", "entropy" or
                "argmax" (halting_grt.py); None: every token runs the call's depth.
            halting_threshold: a token halts once its rule's measure is below it (0 never
                halts; inf halts every token at `min_recurrences`); for "argmax", once its
                argmax has not changed for this many successive steps (0 halts at
                `min_recurrences`, inf never).
            min_recurrences: the fewest steps a token runs (default 1); `num_recurrences` is
                then the most.
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
            halting=halting,
            halting_threshold=halting_threshold,
            min_recurrences=min_recurrences,
            halting_head=self.lm_head,  # the readout rules read each step's logits with it
        )
        if outputs.halting_logits is not None:  # a readout halting rule computed them
            logits = self._keep(outputs.halting_logits, logits_to_keep)
        else:
            logits = self._logits(outputs.last_hidden_state, logits_to_keep)
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
            recurrence_depths=outputs.recurrence_depths,
        )
        if return_dict is False:
            return out.to_tuple()
        return out

    def _logits(self, h: torch.Tensor, logits_to_keep) -> torch.Tensor:
        """The LM head on every position, the last `logits_to_keep` (an int > 0) or those it
        indexes (a tensor)."""
        return self.lm_head(self._keep(h, logits_to_keep))

    @staticmethod
    def _keep(x: torch.Tensor, logits_to_keep) -> torch.Tensor:
        """The positions `logits_to_keep` keeps: all (0), the last k (an int), those a tensor indexes."""
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            return x[:, -logits_to_keep:]
        if isinstance(logits_to_keep, torch.Tensor):
            return x[:, logits_to_keep]
        return x
