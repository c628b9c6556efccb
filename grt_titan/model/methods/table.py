"""The paper's methods as named sets of parts, in one table (as flavors.py is for sizes):
every row of table 1 and every rung of figure 5's ladder (docs/architecture.md, "Methods as
parts"). Adding a method is a row here plus the module that implements its new part.

A row (`Method`) has
- `name`: what `GRTModelArgs.method_name` returns for it (the run label in run records and
  `grt-titan table`, so a name never changes once runs carry it);
- `parts`: the `GRTModelArgs` values that make it on a recurrent flavor (p + n x R + c): `[grt]`
  keys, and for dense and the bare recurrence the layout their flavors set. The tests build
  their debug-size models from these (tests/grt_test_helpers.py);
- `key`: the parts that identify a table 1 row; `method_name` is the first row of `TABLE_1`
  (in its order) whose key parts match, so a run with one other setting keeps its name;
- `settings`: the paper's values of the row beyond its parts (train_configs/paper/ sets them;
  a debug-size test may not);
- `config`: its TOMLs in train_configs/paper/, `{size}[_isoparams]_{config}.toml` for table 1,
  the file's stem for a rung.

Parts that no table 1 row claims are named by figure 5's ladder: "recurrence" plus each
`LADDER_COMPONENTS` entry they have ("recurrence + prelude/coda + noise"; any mix is named so,
e.g. "recurrence + noise" without prelude and coda). The rungs of `LADDER` are such names.

A leaf module (no grt_titan import): `GRTModelArgs.method_name` reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping


def _frozen(**values: Any) -> Mapping[str, Any]:
    """A read-only dict: the rows are shared by every caller (copy with dict(...) to change)."""
    return MappingProxyType(values)


@dataclass(frozen=True, eq=False)
class Method:
    """One row of table 1 or rung of figure 5 (fields: the module docstring)."""

    name: str
    parts: Mapping[str, Any]
    key: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=_frozen)
    config: str | None = None

    def matches(self, args: Any) -> bool:
        """`args` (GRTModelArgs or alike) has this row's key parts; never for a rung (no key)."""
        return bool(self.key) and all(getattr(args, name) == self.parts[name] for name in self.key)


_NO_NOISE = dict(state_noise_std=0.0, gate_noise_std=0.0)

# Table 1, in lookup order (the first row whose key parts match names the args).
DENSE = Method("dense", _frozen(n_core_layers=0), key=("n_core_layers",), config="dense")
# Not table 1's MoR row (expert choice, below): a run of its own, no TOML (`[grt] router = "token_choice"`).
MOR_TOKEN_CHOICE = Method(
    "MoR (token choice)",
    _frozen(router="token_choice", injection="none", update="overwrite", depth_sampling="fixed", **_NO_NOISE),
    key=("router",),
    settings=_frozen(router_balance_weight=0.1),
)
MOR = Method(
    "MoR",
    _frozen(router="expert_choice", injection="none", update="overwrite", depth_sampling="fixed", **_NO_NOISE),
    key=("router",),
    # "block": the released code's update (docs/mor.md); the args' default stays "delta".
    settings=_frozen(router_scale=0.1, router_aux_weight=0.001, router_update="block"),
    config="mor",
)
OURO = Method(
    "Ouro",
    _frozen(objective="exit_distribution", injection="none", update="overwrite", depth_sampling="fixed", **_NO_NOISE),
    key=("objective",),
    settings=_frozen(exit_entropy_weight=0.05, exit_threshold=1.0),
    config="ouro",
)
RRT = Method(
    "RRT",
    _frozen(injection="none", update="overwrite", depth_sampling="fixed", **_NO_NOISE, step_adapter="lora"),
    key=("step_adapter",),
    settings=_frozen(lora_rank=64, lora_scale=2.0),
    config="rrt",
)
POISSON = Method(
    "Heavy-tail Poisson",
    _frozen(
        injection="proj", update="overwrite", initial_state="random", depth_sampling="poisson_lognormal", **_NO_NOISE
    ),
    key=("depth_sampling",),
    settings=_frozen(backprop_recurrences=8),
    config="poisson",
)
GRT = Method(
    "GRT",
    _frozen(
        injection="proj",
        update="gate",
        initial_state="prelude",
        step_adapter="none",
        objective="final",
        router="none",
        depth_sampling="uniform",
        state_noise_std=0.1,
        gate_noise_std=0.1,
    ),
    key=("injection", "update", "initial_state"),
    settings=_frozen(gate_temperature=1.0, gate_bias_init=4.0),
    config="grt",
)
# Not a row of the GRT paper's table 1: Source-Centered State Evolution (arXiv 2607.27656,
# grt_titan/model/methods/scse.py), compared on equal terms. Its paper's core is llama-style (bias-free,
# zero-preserving), which its TOMLs set; its depth is sampled uniformly from 1..R, as there.
SCSE = Method(
    "SCSE",
    _frozen(injection="deviation", update="deviation", initial_state="anchor", depth_sampling="uniform", **_NO_NOISE),
    key=("update",),
    settings=_frozen(anchor_scale=0.1, initial_deviation_scale=0.1, deviation_step_size=0.5, deviation_mask_eps=1e-8),
    config="scse",
)
TABLE_1: tuple[Method, ...] = (DENSE, MOR_TOKEN_CHOICE, MOR, OURO, RRT, POISSON, SCSE, GRT)

# Figure 5's components, in the ladder's order: (label, the bare recurrence's values). Parts
# have a component when any of its values differs from the bare recurrence's.
LADDER_COMPONENTS: tuple[tuple[str, Mapping[str, Any]], ...] = (
    ("prelude/coda", _frozen(n_prelude_layers=0, n_coda_layers=0)),
    ("noise", _frozen(state_noise_std=0.0)),
    ("re-injection", _frozen(injection="none")),
    ("gate", _frozen(update="overwrite")),
)

# Figure 5: rung k is train_configs/paper/ladder_{k}_*.toml; each adds one component to the
# rung before it, all at GRT's depth sampling (only the named component changes).
_UNIFORM = _frozen(depth_sampling="uniform")
LADDER: tuple[Method, ...] = (
    dataclasses.replace(DENSE, config="ladder_1_dense"),
    Method(
        "recurrence",
        _frozen(n_prelude_layers=0, n_coda_layers=0, injection="none", update="overwrite", **_NO_NOISE),
        settings=_UNIFORM,
        config="ladder_2_recurrence",
    ),
    Method(
        "recurrence + prelude/coda",
        _frozen(injection="none", update="overwrite", **_NO_NOISE),
        settings=_UNIFORM,
        config="ladder_3_prelude_coda",
    ),
    Method(
        "recurrence + prelude/coda + noise",
        _frozen(injection="none", update="overwrite", state_noise_std=0.1, gate_noise_std=0.0),
        settings=_UNIFORM,
        config="ladder_4_noise",
    ),
    Method(
        "recurrence + prelude/coda + noise + re-injection",
        _frozen(injection="proj", update="overwrite", state_noise_std=0.1, gate_noise_std=0.0),
        settings=_UNIFORM,
        config="ladder_5_reinjection",
    ),
    dataclasses.replace(GRT, config="ladder_6_gate"),
)

# Every distinct row: table 1, then the rungs that are not table 1 rows.
METHODS: tuple[Method, ...] = TABLE_1 + LADDER[1:-1]


def choices(key: str) -> tuple[Any, ...]:
    """The values the rows give `[grt]` key `key`, GRT's first, then in the rows' order: the
    choices the key allows (grt_titan/model/args.py), so a new method's row adds its own."""
    return tuple(dict.fromkeys(row.parts[key] for row in (GRT, *METHODS) if key in row.parts))


def ladder_components(args: Any) -> list[str]:
    """The labels of the figure 5 components that `args` has, in the ladder's order."""
    return [label for label, bare in LADDER_COMPONENTS if any(getattr(args, k) != v for k, v in bare.items())]


def method_name(args: Any) -> str:
    """The name of the method `args` makes: the first table 1 row whose key parts match,
    else the ladder's name ("recurrence" plus the components it has)."""
    for row in TABLE_1:
        if row.matches(args):
            return row.name
    return " + ".join(["recurrence", *ladder_components(args)])


def paper_method(stem: str) -> Method:
    """The row that train_configs/paper/{stem}.toml trains (KeyError for another name)."""
    for row in LADDER:
        if row.config == stem:
            return row
    for row in TABLE_1:
        if row.config is not None and stem.endswith("_" + row.config) and not stem.startswith("ladder_"):
            return row
    raise KeyError(f"{stem!r} is no TOML of train_configs/paper/ (grt_titan/model/methods/table.py)")
