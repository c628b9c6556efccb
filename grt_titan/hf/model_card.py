"""README.md (model card) of an exported GRT folder: layout, parameters, training facts."""

from __future__ import annotations

from typing import Any

from grt_titan.model.args import GRTModelArgs

_PARTS = (
    ("embeddings", ("model.embed_tokens.", "model.embed_positions.")),
    ("prelude", ("model.prelude.",)),
    ("core (shared)", ("model.core.",)),
    ("projection + gate", ("model.proj.", "model.gate.")),
    ("per-step LoRA adapters", ("model.adapters.",)),
    ("per-step routers (MoR)", ("model.router.",)),
    ("coda", ("model.coda.",)),
    ("final norm", ("model.norm.",)),
    ("exit gate (Ouro)", ("model.exit_gate.",)),
    ("LM head", ("lm_head.",)),
)


def parameter_table(hf_state_dict: dict[str, Any]) -> list[tuple[str, int]]:
    counts = []
    for name, prefixes in _PARTS:
        n = sum(v.numel() for k, v in hf_state_dict.items() if k.startswith(prefixes))
        if n:
            if name == "projection + gate":  # name only what the parts store
                name = " + ".join(
                    part
                    for part, prefix in (("projection", "model.proj."), ("gate", "model.gate."))
                    if any(k.startswith(prefix) for k in hf_state_dict)
                )
            counts.append((name, n))
    return counts


def layout(args: GRTModelArgs) -> str:
    if not args.is_recurrent:
        return f"dense, {args.n_prelude_layers + args.n_coda_layers} layers"
    return f"{args.n_prelude_layers} + {args.n_core_layers}x{args.num_recurrences} + {args.n_coda_layers}"


def _fmt(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else str(n)


def render_model_card(args: GRTModelArgs, hf_state_dict: dict[str, Any], card: dict[str, Any]) -> str:
    """Markdown model card. `card` keys (all optional): source_checkpoint, config_file,
    flavor, step, tokens_seen, tokens_source, validation_loss, validation_step, dtype,
    weight_files, folder_name (what the "Use" snippet loads; default "grt_model").

    The snippet runs as printed from the folder that holds the export, with no prompt
    (tests/docs runs it with stdin closed).
    """
    lines = _title(args) + _architecture(args, hf_state_dict) + _training(card)
    lines += _use(args, card.get("folder_name") or "grt_model")
    return "\n".join(lines)


# ---- the card's sections, each a list of lines ending with a blank one ---------------------


def _title(args: GRTModelArgs) -> list[str]:
    """The hub's front matter, the title and what the model is."""
    grt = not args.non_grt_parts
    return [
        "---",
        "library_name: transformers",
        "tags: [grt, gated-recurrent-transformer, recurrent-depth, torchtitan]",
        "---",
        "",
        "# Gated Recurrent Transformer (GRT)" if grt else f"# Recurrent-depth transformer: {args.method_name}",
        "",
        "Exported from a torchtitan checkpoint by `grt-titan export-hf` "
        + (
            "(Gated Recurrent Transformer, arXiv 2608.15062)."
            if grt
            else "(a baseline of the Gated Recurrent Transformer paper, arXiv 2608.15062, as grt_titan "
            "trains it: table 1's recurrent baselines and figure 5's ablation ladder)."
        ),
        "",
    ]


def _architecture(args: GRTModelArgs, hf_state_dict: dict[str, Any]) -> list[str]:
    """The layout, the recurrence's parts, the default depth and the parameters per part."""
    depth = args.eval_depth
    lines = [
        "## Architecture",
        "",
        f"- layout `p + n x R + c`: **{layout(args)}** "
        f"({args.block_style} blocks, d = {args.dim}, {args.n_heads} heads"
        + (f", {args.n_kv_heads} KV heads" if args.n_kv_heads else "")
        + f", vocabulary {args.vocab_size}, context {args.max_seq_len})",
    ]
    if args.non_grt_parts:
        lines.append(
            f"- recurrence parts: injection `{args.injection}`, update `{args.update}`, initial state "
            f"`{args.initial_state}`, step adapter `{args.step_adapter}`, objective `{args.objective}`, "
            f'router `{args.router}` (grt_titan docs/architecture.md, "Methods as parts")'
        )
    lines += [f"- {part.describe(args)}" for part in args.active_parts if part.describe(args)]
    if args.is_recurrent:
        # Ouro below q = 1 reads every step out: the coda runs once per step.
        coda_runs = depth if args.per_step_readout and args.exit_threshold < 1 else 1
        lines += [
            f"- default inference depth r = {depth} (config.json: `eval_recurrences`, null = R = `num_recurrences`)",
            f"- block executions per token at r = {depth}: "
            f"{args.n_prelude_layers + args.n_core_layers * depth + args.n_coda_layers * coda_runs}",
        ]
    total = sum(v.numel() for v in hf_state_dict.values())
    return lines + [
        f"- stored parameters: **{_fmt(total)}**"
        + (" (LM head tied to the embeddings)" if args.tie_embeddings else ""),
        "",
        "| part | parameters |",
        "|---|---|",
        "\n".join(f"| {name} | {_fmt(n)} |" for name, n in parameter_table(hf_state_dict)),
        "",
    ]


def _fact(card: dict[str, Any], key: str, unknown: str = "unknown") -> str:
    """`card[key]` as the card prints it (floats to 4 places, ints with thousands separators)."""
    value = card.get(key)
    if value is None:
        return unknown
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _training(card: dict[str, Any]) -> list[str]:
    """What the export was trained from: flavor, checkpoint, steps, tokens, validation loss."""
    return [
        "## Training",
        "",
        f"- flavor: {_fact(card, 'flavor')}; config: {_fact(card, 'config_file')}",
        f"- checkpoint: {_fact(card, 'source_checkpoint')}",
        f"- training steps: {_fact(card, 'step')}",
        f"- training tokens: {_fact(card, 'tokens_seen')} ({card.get('tokens_source') or 'source unknown'})",
        f"- validation loss: {_fact(card, 'validation_loss')}"
        + (f" at step {card['validation_step']}" if card.get("validation_step") is not None else ""),
        f"- exported dtype: {_fact(card, 'dtype')}; weight files: {', '.join(card.get('weight_files', []))}",
        "",
    ]


def _use(args: GRTModelArgs, name: str) -> list[str]:
    """How to load the folder `name` and generate: the snippet, then the cache and halting options."""
    return [
        "## Use",
        "",
        f"From the folder that holds `{name}/` (or with its hub id in place of `{name}`). "
        "The model runs this folder's `modeling_grt.py` and the files it imports "
        "(`trust_remote_code=True`); the "
        "tokenizer is the training run's (its files are in the folder), but transformers reads the "
        "folder's config to find it, so it takes the same flag (without it, transformers asks on stdin):",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'tok = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)',
        f'model = AutoModelForCausalLM.from_pretrained("{name}", trust_remote_code=True)',
        'ids = tok("The meaning of life is", return_tensors="pt").input_ids',
        *_generate_lines(args),
        "print(tok.decode(out[0]))",
        "```",
        "",
        "KV cache strategies across recurrence steps (`kv_cache_strategy`): `per_step` keeps "
        "one cache per step (exact); `first`, `last` and `average` keep one cache for the core "
        "(the paper's compressed caches; average was best). Per-token halting (`halting`: "
        "`state` or `gate`, `halting_threshold`, `min_recurrences`; `num_recurrences` the most "
        "steps) lets each token stop when it has converged. See docs/generation.md of grt_titan.",
        "",
    ]


def _generate_lines(args: GRTModelArgs) -> list[str]:
    """The snippet's generate calls: at the default depth with its cache strategies, and with
    per-token halting where the model has it."""
    if not args.is_recurrent:
        return ["out = model.generate(ids, max_new_tokens=32)"]
    depth = args.eval_depth
    per_token_exit = args.per_step_readout and args.exit_threshold < 1  # Ouro: per_step only, no halting
    lines = [
        "# depth per call: 0 = prelude + coda only, < R early exit, "
        + ("> R extrapolation" if args.extrapolates else "R at most (one module per step)"),
        f"out = model.generate(ids, max_new_tokens=32, num_recurrences={depth},",
        '                     kv_cache_strategy="per_step")'
        + ("" if per_token_exit else "  # or first / last / average"),
    ]
    if args.part("router") is None and not per_token_exit:
        lines += [
            "# per-token halting: a token stops recurring once its state changes by less than 1%",
            f'out = model.generate(ids, max_new_tokens=32, num_recurrences={depth}, halting="state",',
            "                     halting_threshold=0.01, min_recurrences=1)",
        ]
    return lines
