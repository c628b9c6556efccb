"""Configuration of the Gated Recurrent Transformer (GRT, arXiv 2608.15062) for transformers.

Self-contained (imports transformers only): `grt-titan export-hf` copies this file next to
config.json, and `AutoConfig.from_pretrained(dir, trust_remote_code=True)` loads it.
"""

from transformers import PretrainedConfig

BLOCK_STYLES = ("gpt2", "llama")

# KV-cache strategies across recurrence steps; see `GRTCache` in modeling_grt.py.
KV_CACHE_STRATEGIES = ("per_step", "first", "last", "average")


class GRTConfig(PretrainedConfig):
    r"""Architecture `num_prelude_layers + num_core_layers x r + num_coda_layers`.

    Args:
        block_style: "gpt2" (pre-LayerNorm, biased linears, GELU(tanh) MLP, learned
            positions, tied head) or "llama" (RMSNorm, SwiGLU, GQA, RoPE, separate head).
        vocab_size, hidden_size, num_attention_heads: as usual.
        num_key_value_heads: KV heads (llama style, grouped-query attention); None = heads.
        intermediate_size: MLP hidden size (gpt2: 4 d; llama: torchtitan's SwiGLU size).
        max_position_embeddings: learned positions (gpt2) / longest trained context (llama).
        norm_eps: epsilon of every LayerNorm / RMSNorm.
        rope_theta: RoPE base (llama style).
        rope_llama3_scaling: torchtitan's llama3 frequency scaling (dict with
            `scaling_factor`, `low_freq_factor`, `high_freq_factor`,
            `original_max_position_embeddings`) or None for plain RoPE.
        num_prelude_layers, num_core_layers, num_coda_layers: p, n, c. A dense model has
            num_core_layers = 0 (no projection, no gate).
        num_recurrences: default inference depth r (0 = prelude + coda only, r < R early
            exit, r > R extrapolation). Overridable per call: `forward(...,
            num_recurrences=r)` / `generate(..., num_recurrences=r)`.
        train_recurrences: R, the largest depth seen in training (informational).
        gate_hidden_size: hidden size of the gate MLP; None = hidden_size.
        gate_temperature: tau; the gate is sigmoid(f_g(.) / tau).
        gate_override: constant gate in [0, 1] (ablation models), None = learned gate.
        kv_cache_strategy: default KV cache across recurrence steps: "per_step" (exact),
            "first", "last" or "average" (one cache for the core; see modeling_grt.py).
        training_settings: training-only settings of the run (noise, depth sampling), kept so that
            `grt-titan import-hf` restores them; unused for inference.
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
        intermediate_size=None,
        max_position_embeddings=1024,
        norm_eps=1e-5,
        rope_theta=10000.0,
        rope_llama3_scaling=None,
        num_prelude_layers=1,
        num_core_layers=1,
        num_coda_layers=1,
        num_recurrences=4,
        train_recurrences=None,
        gate_hidden_size=None,
        gate_temperature=1.0,
        gate_override=None,
        kv_cache_strategy="per_step",
        training_settings=None,
        initializer_range=0.02,
        use_cache=True,
        bos_token_id=50256,
        eos_token_id=50256,
        pad_token_id=None,
        tie_word_embeddings=None,
        **kwargs,
    ):
        if block_style not in BLOCK_STYLES:
            raise ValueError(f"block_style = {block_style!r}; allowed: {BLOCK_STYLES}")
        if kv_cache_strategy not in KV_CACHE_STRATEGIES:
            raise ValueError(
                f"kv_cache_strategy = {kv_cache_strategy!r}; allowed: {KV_CACHE_STRATEGIES}"
            )
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size = {hidden_size} is not divisible by num_attention_heads = "
                f"{num_attention_heads}"
            )
        if num_recurrences < 0 or (num_core_layers == 0 and num_recurrences):
            raise ValueError(
                f"num_recurrences = {num_recurrences} is invalid; r >= 0, and 0 for a model "
                "without core layers"
            )
        self.block_style = block_style
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.norm_eps = norm_eps
        self.rope_theta = rope_theta
        self.rope_llama3_scaling = rope_llama3_scaling
        self.num_prelude_layers = num_prelude_layers
        self.num_core_layers = num_core_layers
        self.num_coda_layers = num_coda_layers
        self.num_recurrences = num_recurrences
        self.train_recurrences = train_recurrences
        self.gate_hidden_size = gate_hidden_size or hidden_size
        self.gate_temperature = gate_temperature
        self.gate_override = gate_override
        self.kv_cache_strategy = kv_cache_strategy
        self.training_settings = training_settings or {}
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        if tie_word_embeddings is None:
            tie_word_embeddings = block_style == "gpt2"
        self.tie_word_embeddings = tie_word_embeddings
        super().__init__(**kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_hidden_layers(self) -> int:
        """Stored blocks p + n + c (the core counted once)."""
        return self.num_prelude_layers + self.num_core_layers + self.num_coda_layers
