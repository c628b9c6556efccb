"""Start-up checks of `[model] converters` and float8 (docs/reliability.md).

torchtitan converts the linears after the model is built, and its float8 filter skips a
linear it cannot convert without a word, so both are checked on the flavor's meta model
before: an unknown converter name, and linears float8 would silently leave in high
precision. The TP plan's float8 styles are in parallelize.py (`float8_tensorwise_tp`).
grt_titan/config_checks.py runs these in its order; the teacher's linears are checked with
`float8_problems` too (grt_titan/teacher.py).
"""

from __future__ import annotations

import difflib

from torch import nn

from grt_titan.model.model import build_meta_model
from grt_titan.sections import FLOAT8_CONVERTER

# torchtitan's flag in [quantize.linear.float8] filter_fqns that lets torchao skip small layers.
FLOAT8_AUTO_FILTER = "auto_filter_small_kn"


def float8_problems(job_config, args) -> list[str]:
    """Linears that float8 would silently leave in high precision (dims not multiples of 16).

    torchtitan's filter skips such a layer without a word; a model whose width is not a
    multiple of 16 would then train (almost) entirely in bf16. The LM head is exempt: its
    rows are the vocabulary (GPT-2: 50257), which torchtitan documents as skipped.
    """
    if FLOAT8_CONVERTER not in job_config.model.converters:
        return []
    filter_fqns = list(job_config.quantize.linear.float8.filter_fqns)
    if FLOAT8_AUTO_FILTER in filter_fqns:
        return []  # torchao chooses which layers to convert
    model = build_meta_model(args)
    skipped = tuple(name for part in args.parts for name in part.float8_skip)
    bad = []
    for fqn, module in model.named_modules():
        # The LM head (vocabulary rows) and the linears a part names (Part.float8_skip: Ouro's
        # exit gate, one output; MoR's routers, a dot product per token) stay in high precision.
        if not isinstance(module, nn.Linear) or fqn == "output" or fqn.startswith(skipped):
            continue
        if any(f in fqn for f in filter_fqns):
            continue
        out_features, in_features = module.weight.shape
        if out_features % 16 or in_features % 16:
            bad.append(f"{fqn} ({in_features} -> {out_features})")
    if not bad:
        return []
    shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
    return [
        f"[model] converters = {list(job_config.model.converters)!r}: float8 needs both "
        f"dimensions of a linear to be multiples of 16, and {len(bad)} linear(s) are not: "
        f"{shown}. They would silently stay in high precision; allowed: a flavor whose dims "
        f"are multiples of 16, or name them in [quantize.linear.float8] filter_fqns "
        f"(or add {FLOAT8_AUTO_FILTER!r})"
    ]


def converter_problems(job_config) -> list[str]:
    """`[model] converters` names torchtitan does not know (it would fail with a bare
    `KeyError` when building the converters, after the model). torchtitan 0.2.2's registry:
    0.3 takes float8 alone (torchtitan_0_3/recipe.py), so it is imported here, not above."""
    import torchtitan.components.quantization  # noqa: F401  registers the float8 and mx converters
    from torchtitan.protocols.model_converter import _registry_model_converter_cls

    registered = sorted(_registry_model_converter_cls)
    problems = []
    for name in job_config.model.converters:
        if name in registered:
            continue
        # "float8" -> "quantize.linear.float8": same last component, linear before grouped_mm.
        tail = str(name).rsplit(".", 1)[-1]
        close = sorted((r for r in registered if r.rsplit(".", 1)[-1] == tail), key=lambda r: ".linear." not in r)
        close = close or difflib.get_close_matches(str(name), registered, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"[model] converters: unknown converter {name!r}{hint}; allowed: {', '.join(registered)}")
    return problems
