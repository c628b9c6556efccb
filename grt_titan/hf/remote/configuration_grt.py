"""Configuration of the Gated Recurrent Transformer (GRT, arXiv 2608.15062) for transformers.

Remote code (imports torch and transformers only): `grt-titan export-hf` copies this file
and its siblings next to config.json, and `AutoConfig.from_pretrained(dir,
trust_remote_code=True)` loads it. The rules of each recurrence part's fields live with the
part (parts_grt.py); this file checks the architecture and the choices, then asks the parts.

Depth has the training args' names: `num_recurrences` is R, the depth the model was trained
at (one router or adapter set per step up to it), and `eval_recurrences` the default depth
of a call (None: R); a call may pass its own, `forward(..., num_recurrences=r)`. A
config.json written before these names (`num_recurrences` the default depth,
`train_recurrences` R) loads with the same depths (`legacy_depth_keys`).
"""

from transformers import PretrainedConfig

from .cache_grt import KV_CACHE_STRATEGIES
from .parts_grt import PARTS, ExpertChoice, active_parts

BLOCK_STYLES = ("gpt2", "llama", "qwen3")
# Block styles whose per-head width may differ from hidden_size / num_attention_heads.
EXPLICIT_HEAD_DIM_STYLES = ("qwen3",)

# The named parts of the recurrence (grt_titan docs/architecture.md, "Methods as parts") that
# this model implements, each with its allowed choices; the first choice is GRT's. The
# choices other than the plain loop's have a part in parts_grt.py.
RECURRENCE_PARTS = {
    "injection": ("proj", "none", "deviation"),
    "update": ("gate", "overwrite", "deviation"),
    "initial_state": ("prelude", "random", "anchor"),
    "step_adapter": ("none", "lora"),
    "objective": ("final", "exit_distribution"),
    "router": ("none", "expert_choice"),
}
# Settings of a part, written to config.json only when the model uses that part (its `settings`).
PART_SETTINGS = {(part.key, part.choice): part.settings for part in PARTS if part.settings}
# The parts MoR fixes (tests/hf/test_hf_parts.py checks them against grt_titan's table of methods).
MOR_REQUIRED_PARTS = ExpertChoice.required


# The key of R in a config.json written before R had one name across grt_titan (there,
# `num_recurrences` was the default depth of a call).
LEGACY_R_KEY = "train_recurrences"


def legacy_depth_keys(num_recurrences, eval_recurrences, kwargs: dict) -> tuple:
    """(num_recurrences = R, eval_recurrences) of the config's arguments; pops an old
    config.json's `train_recurrences` from `kwargs`.

    Old form: `num_recurrences` = the default depth r, `train_recurrences` = R (None when
    unknown: dense models, configs built by hand). It becomes R = train_recurrences (else
    r) and eval_recurrences = r (None when r = R: the default depth then follows R, as in
    training), so the model computes what it did.
    """
    if LEGACY_R_KEY not in kwargs:
        return num_recurrences, eval_recurrences
    R = kwargs.pop(LEGACY_R_KEY)
    if eval_recurrences is not None:
        raise ValueError(
            f"{LEGACY_R_KEY} (R in a config.json before eval_recurrences existed) and eval_recurrences = "
            f"{eval_recurrences!r} cannot be combined; allowed: num_recurrences (R) and eval_recurrences"
        )
    depth = num_recurrences
    if R is None:
        return depth, None
    return R, None if depth == R else depth


class GRTConfig(PretrainedConfig):
    r"""Architecture `num_prelude_layers + num_core_layers x r + num_coda_layers`.

    Args:
        block_style: "gpt2" (pre-LayerNorm, biased linears, GELU(tanh) MLP, learned
            positions, tied head), "llama" (RMSNorm, SwiGLU, GQA, RoPE on interleaved pairs,
            separate head) or "qwen3" (llama's with an RMSNorm per head on q and k, qk-norm,
            RoPE on the two halves of each head and an explicit head width).
        vocab_size, hidden_size, num_attention_heads: as usual.
        num_key_value_heads: KV heads (llama and qwen3 styles, grouped-query attention); None = heads.
        head_dim: per-head width; None = hidden_size / num_attention_heads (the only width
            of gpt2 and llama blocks; qwen3's may differ, Qwen3-0.6B: 128 with d = 1024 and
            16 heads). config.json holds it only where it differs.
        intermediate_size: MLP hidden size (gpt2: 4 d; llama: torchtitan's SwiGLU size).
        max_position_embeddings: learned positions (gpt2) / longest trained context (llama).
        norm_eps: epsilon of every LayerNorm / RMSNorm.
        rope_theta: RoPE base (llama and qwen3 styles).
        rope_llama3_scaling: torchtitan's llama3 frequency scaling (dict with
            `scaling_factor`, `low_freq_factor`, `high_freq_factor`,
            `original_max_position_embeddings`) or None for plain RoPE.
        num_prelude_layers, num_core_layers, num_coda_layers: p, n, c. A dense model has
            num_core_layers = 0 (no projection, no gate).
        num_recurrences: R, the depth the model was trained at (the training args'
            `num_recurrences`): RRT has one adapter set and MoR one router per step up to R.
            0 for a model without core layers.
        eval_recurrences: the default depth r of a call (the training args'
            `eval_recurrences`); None = R. 0 = prelude + coda only, r < R early exit, r > R
            extrapolation. Overridable per call: `forward(..., num_recurrences=r)` /
            `generate(..., num_recurrences=r)`. A config.json of the old form
            (`train_recurrences`) is read by `legacy_depth_keys`.
        gate_hidden_size: hidden size of the gate MLP; None = hidden_size.
        gate_temperature: tau; the gate is sigmoid(f_g(.) / tau).
        gate_override: constant gate in [0, 1] (ablation models), None = learned gate.
        kv_cache_strategy: default KV cache across recurrence steps: "per_step" (exact),
            "first", "last" or "average" (one cache for the core; see modeling_grt.py).
        injection: "proj" (core input W_proj [h ; h_pre], GRT), "none" (core input h) or
            "deviation" (core input h - h*, SCSE's deviation from its anchor h*).
        update: "gate" (h = g h + (1 - g) o, GRT), "overwrite" (h = o, no gate) or
            "deviation" (SCSE: h = h + m s (o - (h - h*)), s = `deviation_step_size`, m = 0 for
            a sequence whose ||h - h*||^2 over the call's tokens is <= `deviation_mask_eps`).
        initial_state: "prelude" (h_0 = h_pre, GRT), "random" (h_0 of position t is row t
            of one fixed TruncNormal(0, initial_state_std^2) table cut at 3 std, drawn on
            the CPU from `initial_state_seed`: heavy-tail Poisson's state at inference) or
            "anchor" (SCSE: `model.anchor` holds bias-free A, B: Linear(d, d); the anchor
            h* = h_pre + anchor_scale A h_pre, which the steps read where the others read
            h_pre, and h_0 = h_pre + initial_deviation_scale B h_pre). SCSE's three go together.
        step_adapter: "none", or "lora" (RRT: one LoRA per (core block, step) on the gpt2
            block's fused q/k/v, attention output, MLP input and output, of rank
            `lora_rank` and output scale `lora_scale`; depths above R = num_recurrences
            have no adapter and are refused).
        objective: "final" (logits of the last step, GRT) or "exit_distribution" (Ouro: an
            exit gate `model.exit_gate`, Linear(d, 1), reads every step's coda + norm output;
            lambda_t = sigmoid(gate); each token exits at its Q-exit step, the first whose
            cumulative exit probability 1 - prod_{j<=t} (1 - lambda_j) reaches
            `exit_threshold`, else the last step).
        exit_threshold: q in (0, 1] of objective "exit_distribution"; 1 (default) = the last
            step, which needs no per-step readout. q < 1 runs all r steps, reads each out and
            gathers each token's exit step; it needs kv_cache_strategy "per_step".
        router: "none", or "expert_choice" (Mixture-of-Recursions: one bias-free
            Linear(d, 1) router per step up to R = num_recurrences; a routed token's state
            becomes h + g (core(h) - h) with g = router_scale x sigmoid(logit), the others
            keep theirs). Needs gpt2 blocks, injection "none", update "overwrite".
        router_inference: MoR's routing rule, "threshold" (a token goes on to step i while
            it was active at step i-1 and sigmoid(logit_i) > 0.5: causal, the only rule
            for generation with the KV cache) or "top_k" (training's rule, top-k_i of the
            sequence with k_i = max(1, int(router_capacity[i] x T)): a full forward
            without cache only). Overridable per call: `forward(..., router_inference=...)`.
        router_capacity: MoR's share of the sequence step i keeps under top_k (R floats).
        router_scale: MoR's alpha in g = alpha x sigmoid(logit).
        router_update: MoR's update of a routed token, as trained: "delta" (h + g (core(h) - h),
            the default and every export before the field existed) or "block" (h + g core(h),
            the released MoR code's update).
        A config whose parts are all GRT's writes none of these fields (config.json stays
        as before the parts existed); a config.json without them loads as GRT.
        halting_probe: the export holds the learned halting rule's probe (`model.halting_probe`,
            halting_grt.py; `grt-titan export-hf --halting-probe FILE`), and a call takes
            `halting="learned"`. config.json holds it only where true.
        training_settings: training-only settings of the run (noise, depth sampling), kept so that
            `grt-titan import-hf` restores them; unused for inference.
        bos_token_id, eos_token_id: the tokenizer's `<|endoftext|>` id, which `grt-titan
            export-hf` writes from the export's tokenizer (50256 for GPT-2); None (the
            default, no tokenizer known): no EOS, generation stops at its length limit.
    """

    model_type = "grt"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        block_style="gpt2",
        vocab_size=50257,
        hidden_size=768,
        num_attention_heads=12,
        num_key_value_heads=None,
        head_dim=None,
        intermediate_size=None,
        max_position_embeddings=1024,
        norm_eps=1e-5,
        rope_theta=10000.0,
        rope_llama3_scaling=None,
        num_prelude_layers=1,
        num_core_layers=1,
        num_coda_layers=1,
        num_recurrences=4,
        eval_recurrences=None,
        gate_hidden_size=None,
        gate_temperature=1.0,
        gate_override=None,
        kv_cache_strategy="per_step",
        injection="proj",
        update="gate",
        initial_state="prelude",
        initial_state_std=0.02,
        initial_state_seed=0,
        step_adapter="none",
        lora_rank=64,
        lora_scale=2.0,
        objective="final",
        exit_threshold=1.0,
        anchor_scale=0.1,
        initial_deviation_scale=0.1,
        deviation_step_size=0.5,
        deviation_mask_eps=1e-8,
        router="none",
        router_capacity=None,
        router_scale=0.1,
        router_inference="threshold",
        router_update="delta",
        halting_probe=False,
        training_settings=None,
        initializer_range=0.02,
        use_cache=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=None,
        **kwargs,
    ):
        num_recurrences, eval_recurrences = legacy_depth_keys(num_recurrences, eval_recurrences, kwargs)
        self.block_style = block_style
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.norm_eps = norm_eps
        self.rope_theta = rope_theta
        self.rope_llama3_scaling = rope_llama3_scaling
        self.num_prelude_layers = num_prelude_layers
        self.num_core_layers = num_core_layers
        self.num_coda_layers = num_coda_layers
        self.num_recurrences = num_recurrences
        self.eval_recurrences = eval_recurrences
        self.gate_hidden_size = gate_hidden_size or hidden_size
        self.gate_temperature = gate_temperature
        self.gate_override = gate_override
        self.kv_cache_strategy = kv_cache_strategy
        self.injection = injection
        self.update = update
        self.initial_state = initial_state
        self.initial_state_std = initial_state_std
        self.initial_state_seed = initial_state_seed
        self.step_adapter = step_adapter
        self.lora_rank = lora_rank
        self.lora_scale = lora_scale
        self.objective = objective
        self.exit_threshold = exit_threshold
        self.anchor_scale, self.initial_deviation_scale = anchor_scale, initial_deviation_scale  # SCSE's a, b
        self.deviation_step_size, self.deviation_mask_eps = deviation_step_size, deviation_mask_eps  # s, eps
        self.router = router
        self.router_capacity = None if router_capacity is None else [float(c) for c in router_capacity]
        self.router_scale = router_scale
        self.router_inference = router_inference
        self.router_update, self.halting_probe = router_update, bool(halting_probe)
        self.training_settings = training_settings or {}
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        if tie_word_embeddings is None:
            tie_word_embeddings = block_style == "gpt2"
        self.tie_word_embeddings = tie_word_embeddings
        self.check_settings()
        super().__init__(**kwargs)

    def check_settings(self) -> None:
        """ValueError naming the field for a setting the model cannot run (run by __init__)."""
        if self.block_style not in BLOCK_STYLES:
            raise ValueError(f"block_style = {self.block_style!r}; allowed: {BLOCK_STYLES}")
        if self.kv_cache_strategy not in KV_CACHE_STRATEGIES:
            raise ValueError(f"kv_cache_strategy = {self.kv_cache_strategy!r}; allowed: {KV_CACHE_STRATEGIES}")
        if (
            self.hidden_size % self.num_attention_heads
            and self.head_dim == self.hidden_size // self.num_attention_heads
        ):
            raise ValueError(
                f"hidden_size = {self.hidden_size} is not divisible by num_attention_heads = {self.num_attention_heads}"
            )
        if (
            self.block_style not in EXPLICIT_HEAD_DIM_STYLES
            and self.head_dim != self.hidden_size // self.num_attention_heads
        ):
            raise ValueError(
                f"head_dim = {self.head_dim} is invalid for block_style = {self.block_style!r}; allowed: "
                f"hidden_size / num_attention_heads = {self.hidden_size // self.num_attention_heads} "
                f"(an explicit head width: {EXPLICIT_HEAD_DIM_STYLES})"
            )
        for name, depth in (("num_recurrences", self.num_recurrences), ("eval_recurrences", self.eval_recurrences)):
            if depth is not None and (depth < 0 or (self.num_core_layers == 0 and depth)):
                raise ValueError(f"{name} = {depth} is invalid; r >= 0, and 0 for a model without core layers")
        for name, choices in RECURRENCE_PARTS.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} = {getattr(self, name)!r}; allowed: {choices}")
        for part in PARTS:  # each part's rules on its fields (parts_grt.py)
            part.check(self)

    def check_call_settings(self) -> None:
        """The parts' rules on settings that may be set after loading (`from_pretrained(...,
        exit_threshold=q)` sets the attribute): run by every forward."""
        for part in PARTS:
            part.check_at_call(self)

    @property
    def eval_depth(self) -> int:
        """The depth of a call without `num_recurrences`: eval_recurrences, default R."""
        return self.num_recurrences if self.eval_recurrences is None else self.eval_recurrences

    @property
    def has_grt_parts(self) -> bool:
        """Every recurrence part is GRT's (the first choice of RECURRENCE_PARTS)."""
        return all(getattr(self, name) == choices[0] for name, choices in RECURRENCE_PARTS.items())

    def to_dict(self):
        """As PretrainedConfig's, without the fields of parts the model does not have: none
        for GRT's parts, else the parts and the settings of those in use; `head_dim` only
        where it is not hidden_size / num_attention_heads."""
        output = super().to_dict()
        drop = set(RECURRENCE_PARTS) if self.has_grt_parts else set()
        for part in PARTS:
            if not part.selected(self):
                drop.update(part.settings)
        if self.head_dim == self.hidden_size // self.num_attention_heads:
            drop.add("head_dim")  # the derived width: config.json stays as before the field
        if not self.halting_probe:
            drop.add("halting_probe")  # no probe: config.json stays as before the field
        for key in drop:
            output.pop(key, None)
        return output

    @property
    def active_parts(self) -> list:
        """The recurrence parts the model has (parts_grt.py), in their table's order."""
        return active_parts(self)

    @property
    def per_step_readout(self) -> bool:
        """A part reads every step out, each token at its own exit step (Ouro, q < 1)."""
        return any(part.reads_every_step(self) for part in self.active_parts)

    @property
    def num_hidden_layers(self) -> int:
        """Stored blocks p + n + c (the core counted once)."""
        return self.num_prelude_layers + self.num_core_layers + self.num_coda_layers
