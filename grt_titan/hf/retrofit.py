"""`grt-titan retrofit`: a pretrained dense Hugging Face model -> a GRT that starts from it.

    grt-titan retrofit SRC --out DIR [--prelude P] [--core A:B] [--coda C] [--recurrences R] [--init INIT]
    grt-titan retrofit SRC --plan [--data NAME|PATH] [--tokens N] [--plan-json FILE]

SRC is a local folder of a GPT-2, Llama (3.x) or Qwen3 model (config.json, model.safetensors
or the shards of model.safetensors.index.json, tokenizer files), read by grt_titan/hf/stock_folders.py
(the one reader of stock models: the architecture, the weights as flat per-layer tensors, and
the refusals). Here: source layers 0..P-1 become the prelude, A..B-1 the weight-tied core, the
last C the coda; the layers between are dropped (the default split maps every layer). Embeddings,
GPT-2's positions, the final norm and the LM head (tied or not) are copied. W_proj and the gate,
the GRT's own parts, are set by `--init` (docs/retrofit.md derives each from eq. 2-5):

    every-depth (default)  W_proj = [0, I], gate closed: h_t = core(h_pre) at every step t, so
                           every depth r >= 1 computes the source (less its dropped layers)
    first-loop             W_proj = [I, 0], gate closed: h_1 = core(h_pre) (the source at r = 1),
                           loops 2..R iterate the core on its own output
    damped                 W_proj = [I, 0], g = 1 - 1/R: each loop adds 1/R of the core's update

(the closed gate: f_g's output layer weight 0, bias -B, g = sigmoid(-B) ~ 4e-8 with B = 17, so
1 - g is 1 to within one fp32 ulp). `--plan` measures candidate splits on a sample of data and
writes nothing (grt_titan/hf/retrofit_plan.py); the command is grt_titan/hf/retrofit_cli.py.

DIR receives:
- `model/`: a torchtitan model-only DCP checkpoint (model FQNs at the top level, fp32), what
  `[checkpoint] initial_load_path` loads with `initial_load_model_only = true`; it holds the
  init's W_proj and gate (weights, not settings);
- `model_args.json`: the GRT's architecture (GRTModelArgs fields), the TOML's flavor
  (`[model] flavor = "<DIR>/model_args.json"`: a flavor may be such a file); its
  `gate_bias_init` is the flavors' (+4): built from it alone, a GRT starts from scratch;
- `train.toml`: a training config for it (the source's tokenizer, the recipe of the nearest
  preset at a continued-training learning rate, a depth curriculum, validation by depth);
- `retrofit.json`: where each GRT layer comes from, and the init;
- with `--task-recipe`, `task.toml`: the recipe that teaches it a multi-step task one step
  per loop (`task_toml`).

Nothing is written unless every check passes (grt_titan/runtime/atomic_dir.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib
import torch

from grt_titan.checkpoints.hf_weights import read_hf_weights
from grt_titan.checkpoints.load import save_checkpoint
from grt_titan.checkpoints.start_load import RETROFIT_RECORD
from grt_titan.data.tasks import DEFAULT_SYMBOLS
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.model import GRTModel
from grt_titan.model.state_dict_adapter import optional_native_keys
from grt_titan.run_reader import CheckpointError
from grt_titan.runtime.atomic_dir import atomic_directory

from .stock_folders import (
    n_dense_layers,
    pad_vocab_rows,
    place_layers,
    read_stock_config,
    source_args,
    stock_to_flat,
)

# The gate's closed bias B: sigmoid(-17) = 4.1e-8 < 2^-24 / 2, so 1 - g rounds to 1 in fp32
# and g h_0 is below the resolution of core(h_pre) wherever |h_0| is not 1e7 times larger.
GATE_CLOSED_BIAS = 17.0
DEFAULT_RECURRENCES = 4
# Continued training: the nearest preset's peak learning rate divided by this.
CONTINUED_LR_DIVISOR = 10.0
PRESETS = Path(__file__).resolve().parents[2] / "train_configs"
# The GRT's own parts, which no source layer fills: W_proj and the gate (set by `retrofit_init`).
GRT_OWN_PARTS = ("recurrence.step.proj.", "recurrence.step.gate.")
# `--init`: what W_proj and the gate start as (docs/retrofit.md, "Which depths start at the source").
RETROFIT_INITS = {
    "every-depth": "W_proj = [0, I], gate closed: every depth r >= 1 is the source",
    "first-loop": "W_proj = [I, 0], gate closed: r = 1 is the source, loops 2..R iterate the core",
    "damped": "W_proj = [I, 0], g = 1 - 1/R: each loop adds 1/R of the core's update",
}
DEFAULT_INIT = "every-depth"
# The written TOML's depth curriculum ramps r_max from r_min to R over this share of training.steps.
CURRICULUM_SHARE = 4
# ... and its learning-rate warm-up is this share of training.steps (the weights are trained already).
WARMUP_SHARE = 50
# The task recipe (`--task-recipe`, task.toml): per-step supervision, then the answers alone
# for the last 1/ANNEAL_SHARE of training.steps (outcome-only annealing, arXiv 2608.11233).
ANNEAL_SHARE = 4
# One chat-rendered iterated-function problem per sequence (up to 2R + 1 = 33 symbols at R = 16).
TASK_SEQ_LEN = 256


class RetrofitError(CheckpointError):
    """Bad retrofit input, named in one line (the key and what is allowed)."""


# ---- the layer plan --------------------------------------------------------------------


@dataclass(frozen=True)
class LayerPlan:
    """Which source layers form the prelude, the core and the coda (the rest are dropped)."""

    num_source_layers: int
    prelude: tuple[int, ...]
    core: tuple[int, ...]
    coda: tuple[int, ...]

    @property
    def kept(self) -> tuple[int, ...]:
        return self.prelude + self.core + self.coda

    @property
    def dropped(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_source_layers) if i not in self.kept)

    def grt_keys(self) -> dict[int, str]:
        """Source layer -> the GRT block it becomes (its native prefix)."""
        keys = {s: f"prelude.layers.{j}" for j, s in enumerate(self.prelude)}
        keys.update({s: f"recurrence.step.core.layers.{j}" for j, s in enumerate(self.core)})
        keys.update({s: f"coda.layers.{j}" for j, s in enumerate(self.coda)})
        return keys


def default_split(num_layers: int) -> tuple[int, tuple[int, int], int]:
    """(P, (A, B), C): every source layer kept, a core of 2p layers (p = max(1, L // 8):
    McLeish et al. 2025's core size) in the middle of the stack, the layers before it the
    prelude and those after it the coda. At r = 1 the GRT is the whole source (under
    `--init every-depth` at every r); McLeish's drop-the-middle shape and other cores are
    measured by `--plan` (docs/retrofit.md, "Choosing the split")."""
    if num_layers < 3:
        raise RetrofitError(
            f"config.json: num_hidden_layers = {num_layers}; a retrofit needs >= 3 layers (prelude, core, coda)"
        )
    core = min(2 * max(1, num_layers // 8), num_layers - 2)
    prelude = (num_layers - core) // 2
    return prelude, (prelude, prelude + core), num_layers - prelude - core


def plan_layers(num_layers: int, prelude: int | None, core: tuple[int, int] | None, coda: int | None) -> LayerPlan:
    """The layer plan of the options (unset: `default_split`'s), checked: in range, in order,
    not overlapping, a non-empty core."""
    p0, core0, c0 = default_split(num_layers) if num_layers >= 3 else (1, (1, 2), 1)
    p = p0 if prelude is None else prelude
    c = c0 if coda is None else coda
    a, b = core0 if core is None else core
    if num_layers < 1:
        raise RetrofitError(f"config.json: num_hidden_layers = {num_layers}; allowed: >= 1")
    if not 0 <= p <= num_layers:
        raise RetrofitError(
            f"--prelude {p} is out of range; allowed: 0..{num_layers} (the source has {num_layers} layers)"
        )
    if not 0 <= c <= num_layers:
        raise RetrofitError(
            f"--coda {c} is out of range; allowed: 0..{num_layers} (the source has {num_layers} layers)"
        )
    if not 0 <= a < b <= num_layers:
        raise RetrofitError(
            f"--core {a}:{b} is out of range; allowed: A:B with 0 <= A < B <= {num_layers} (a non-empty core)"
        )
    if a < p:
        raise RetrofitError(f"--core {a}:{b} overlaps the prelude (layers 0..{p - 1}); allowed: A >= {p}")
    if b > num_layers - c:
        raise RetrofitError(
            f"--core {a}:{b} overlaps the coda (layers {num_layers - c}..{num_layers - 1}); allowed: B <= {num_layers - c}"
        )
    return LayerPlan(num_layers, tuple(range(p)), tuple(range(a, b)), tuple(range(num_layers - c, num_layers)))


# ---- the source -> the GRT's args and weights ----------------------------------------------------


def retrofit_args(source: GRTModelArgs, plan: LayerPlan, **grt: Any) -> GRTModelArgs:
    """The GRT's args: the source's architecture (`source`, grt_titan/hf/stock_folders.py's reading of
    its config.json), the plan's layer counts and the `[grt]` settings `grt` (num_recurrences,
    ...). The gate's closed bias is not among them: it lives in the checkpoint's weights
    (`retrofit_init`), so the args build a GRT with the flavors' normal gate init."""
    args = source.replace(
        n_prelude_layers=len(plan.prelude),
        n_core_layers=len(plan.core),
        n_coda_layers=len(plan.coda),
        **{k: v for k, v in grt.items() if v is not None},
    )
    try:
        args.validate(where="retrofit")
    except ValueError as e:
        raise RetrofitError(str(e)) from e
    return args


def native_source_weights(
    hf: dict[str, torch.Tensor], source: GRTModelArgs, plan: LayerPlan, args: GRTModelArgs
) -> dict[str, torch.Tensor]:
    """The GRT's native weights that come from the source: its kept layers at their GRT places,
    embeddings, positions, final norm, LM head (untied only). With `vocab_multiple_of` the
    embedding / head rows are padded with zero rows to padded_vocab_size, as import-hf pads them."""
    return pad_vocab_rows(place_layers(stock_to_flat(hf, source, plan.kept), plan.grt_keys()), args)


def retrofit_init(model: GRTModel, init: str = DEFAULT_INIT, gate_bias: float = GATE_CLOSED_BIAS) -> None:
    """Set W_proj and the gate per `init` (RETROFIT_INITS; docs/retrofit.md derives each).

    every-depth: W_proj = [0, I] makes every step's input h_pre, so each step computes
    core(h_pre) and the closed gate writes it through: h_t = h_1 at every t. The state noise
    enters through W_proj's zero half and the gate noise cannot open a gate at -17, so a
    training forward is the source too. first-loop / damped: W_proj = [I, 0] (h_tilde = h),
    the gate closed or at g = 1 - 1/R (logit tau * log(R - 1)). f_g's first layer keeps its
    random init, so its output layer's gradient is nonzero and Adam can move the gate."""
    if init not in RETROFIT_INITS:
        raise RetrofitError(f"--init {init!r} is unknown; allowed: {', '.join(RETROFIT_INITS)}")
    step, args = model.recurrence.step, model.model_args
    dim, depth = args.dim, args.num_recurrences
    with torch.no_grad():
        if hasattr(step, "proj"):
            step.proj.weight.zero_()
            half = slice(dim, 2 * dim) if init == "every-depth" else slice(0, dim)
            step.proj.weight[:, half].copy_(torch.eye(dim))
        if hasattr(step, "gate"):
            step.gate.w_out.weight.zero_()
            damped = init == "damped" and depth > 1
            bias = args.gate_temperature * math.log(depth - 1) if damped else -gate_bias
            step.gate.w_out.bias.fill_(bias)


def retrofit_model(
    src: str | Path,
    plan: LayerPlan | None = None,
    seed: int = 0,
    gate_bias: float = GATE_CLOSED_BIAS,
    init: str = DEFAULT_INIT,
    **grt: Any,
) -> tuple[GRTModel, LayerPlan, dict[str, Any]]:
    """(float32 GRTModel holding the retrofitted source, its layer plan, the source config).

    `plan`: default `plan_layers(L, None, None, None)`. `init`: RETROFIT_INITS. `grt`: `[grt]`
    settings (num_recurrences, ...). The model is in train mode, as `model_from_state` returns one.
    """
    if init not in RETROFIT_INITS:  # before the weights are read
        raise RetrofitError(f"--init {init!r} is unknown; allowed: {', '.join(RETROFIT_INITS)}")
    src = Path(src)
    config = read_stock_config(src)
    source = source_args(config)
    plan = plan or plan_layers(n_dense_layers(source), None, None, None)
    args = retrofit_args(source, plan, **grt)
    try:
        hf = read_hf_weights(src)
    except FileNotFoundError as e:
        raise RetrofitError(f"{src}: weight file missing: {e}") from e
    native = native_source_weights(hf, source, plan, args)
    torch.manual_seed(seed)  # f_g's first layer: its only random weights
    model = GRTModel(args)
    with torch.no_grad():
        model.init_weights()
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in native.items()}, strict=False)
    own = set(missing) - optional_native_keys(args)  # what the source does not hold: W_proj and the gate
    assert not unexpected and all(k.startswith(GRT_OWN_PARTS) for k in own), (unexpected, sorted(own))
    model.tie_weights()
    retrofit_init(model, init, gate_bias)
    return model, plan, config


# ---- the tokenizer, the TOML, the folder -------------------------------------------------------


def check_tokenizer(src: Path, args: GRTModelArgs) -> int:
    """The source tokenizer's vocabulary size; refused if it emits ids the embeddings lack."""
    from grt_titan.tokenizer import load_tokenizer, resolve_tokenizer_source

    try:
        found = resolve_tokenizer_source(str(src))
    except FileNotFoundError:
        found = None
    if found is None:
        raise RetrofitError(f"{src}: no tokenizer.json (the retrofit trains with the source's own tokenizer)")
    try:
        vocab = load_tokenizer(src).get_vocab_size()
    except (ValueError, OSError) as e:
        raise RetrofitError(f"{src}/tokenizer.json: cannot be loaded: {e}") from e
    if vocab > args.vocab_size:
        raise RetrofitError(
            f"{src}/tokenizer.json: vocabulary of {vocab} ids differs from the embeddings' vocab_size = "
            f"{args.vocab_size} rows (config.json); allowed: a tokenizer whose ids are all embedding rows"
        )
    return vocab


def nearest_preset(args: GRTModelArgs) -> Path:
    """The train_configs/grt_*.toml whose flavor's width is nearest the source's (llama and
    qwen3 sources prefer the llama preset at equal distance)."""
    from grt_titan.model.flavors import grt_flavors

    best, best_key = None, None
    for path in sorted(PRESETS.glob("grt_*.toml")):
        flavor = tomllib.loads(path.read_text())["model"]["flavor"]
        if flavor not in grt_flavors:
            continue
        preset = grt_flavors[flavor]
        same_family = (preset.block_style == "gpt2") == (args.block_style == "gpt2")
        key = (abs(math.log(preset.dim / args.dim)), not same_family)
        if best_key is None or key < best_key:
            best, best_key = path, key
    assert best is not None, f"no grt_*.toml preset in {PRESETS}"
    return best


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


RECIPE_SECTIONS = ("optimizer", "lr_scheduler", "training", "activation_checkpoint", "compile", "metrics")


def _span(layers: tuple[int, ...]) -> str:
    """Consecutive source layers as "a-b" (a plan's prelude, core and coda are runs)."""
    if not layers:
        return "none"
    return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])


def _header(src: Path, out: Path, plan: LayerPlan, config: dict[str, Any], init: str) -> list[str]:
    return [
        f"# Retrofit of {src} ({config['model_type']}, {plan.num_source_layers} layers) into a GRT:",
        f"#   prelude = source layers {_span(plan.prelude)}, core = {_span(plan.core)}, coda = {_span(plan.coda)}"
        + (f", dropped {_span(plan.dropped)}" if plan.dropped else ""),
        f"#   --init {init}: {RETROFIT_INITS[init]}",
        "# Written by `grt-titan retrofit` (docs/retrofit.md). Train it with:",
        f"#   torchrun --nproc_per_node=2 -m grt_titan.train --job.config_file {out / 'train.toml'}",
        "[job]",
        f"dump_folder = {_toml_value(str(out / 'outputs'))}",
        f"description = {_toml_value(f'GRT retrofitted from {src.name}')}",
        'custom_config_module = "grt_titan.job_config"',
        "",
        "[experimental]",
        'custom_import = "grt_titan"',
        "",
        "[model]",
        'name = "grt"',
        "# The architecture (the source's widths, heads, RoPE, norms, tying, vocabulary) is this file.",
        f"flavor = {_toml_value(str(out / 'model_args.json'))}",
        "# The source's own tokenizer.",
        f"hf_assets_path = {_toml_value(str(src))}",
        "",
    ]


def _grt_section(args: GRTModelArgs, steps: int) -> list[str]:
    curriculum = max(1, steps // CURRICULUM_SHARE)
    return [
        "[grt]",
        f"num_recurrences = {args.num_recurrences}",
        f"min_recurrences = {args.min_recurrences}",
        f'depth_sampling = "{args.depth_sampling}"',
        f"state_noise_std = {args.state_noise_std!r}",
        f"gate_noise_std = {args.gate_noise_std!r}",
        *([f"vocab_multiple_of = {args.vocab_multiple_of}"] if args.vocab_multiple_of > 1 else []),
        "# Depth curriculum (McLeish et al. 2025): the largest sampled depth ramps from min_recurrences to",
        f"# num_recurrences over the first {curriculum} steps (1/{CURRICULUM_SHARE} of [training] steps); 0 turns it off.",
        f"depth_curriculum_steps = {curriculum}",
        "# W_proj and the gate start as --init set them, by the checkpoint's weights, not by",
        "# gate_bias_init: without initial_load_path this trains a GRT from scratch.",
        "",
    ]


def _checkpoint_section(out: Path) -> list[str]:
    return [
        "[checkpoint]",
        "enable = true",
        'folder = "checkpoint"',
        "interval = 500",
        "# The retrofitted weights (a model-only checkpoint); a resume of this run loads its own steps.",
        f"initial_load_path = {_toml_value(str(out / 'model'))}",
        "initial_load_model_only = true",
        "last_save_model_only = false",
        "",
        "[parallelism]",
        "data_parallel_shard_degree = -1",
        "tensor_parallel_degree = 1",
        "",
    ]


def _recipe_value(section: str, key: str, value: Any, lr: float, seq_len: int, steps: int) -> Any:
    """The preset's `value` of [section] key, or its continued-training replacement."""
    replaced = {("optimizer", "lr"): lr, ("training", "seq_len"): seq_len}
    replaced[("lr_scheduler", "warmup_steps")] = max(1, steps // WARMUP_SHARE)
    return replaced.get((section, key), value)


def _recipe_sections(preset_path: Path, preset: dict, src: Path, args: GRTModelArgs, lr: float) -> list[str]:
    seq_len = min(preset["training"]["seq_len"], args.max_seq_len)
    steps = preset["training"]["steps"]
    lines = []
    for section in RECIPE_SECTIONS:
        if section not in preset:
            continue
        lines.append(f"[{section}]")
        if section == "optimizer":
            lines.append(
                f"# {preset_path.name}'s recipe (the preset nearest in width); lr = its "
                f"{preset['optimizer']['lr']!r} / {CONTINUED_LR_DIVISOR:g} for continued training of a pretrained model"
            )
        if section == "lr_scheduler":
            lines.append(f"# A short warm-up (1/{WARMUP_SHARE} of [training] steps): the weights are trained already.")
        for key, value in preset[section].items():
            if section == "training" and key == "dataset":
                lines.append(
                    "# grt_default (the embedded corpus) is tokenized with the source's tokenizer on first "
                    f"use; your own corpus: grt-titan prepare ... --tokenizer {src}"
                )
            lines.append(f"{key} = {_toml_value(_recipe_value(section, key, value, lr, seq_len, steps))}")
        lines.append("")
    return lines


def _validation_section(preset: dict, args: GRTModelArgs) -> list[str]:
    training = preset["training"]
    seq_len = min(training["seq_len"], args.max_seq_len)
    validation = preset.get("validation", {})
    return [
        "[validation]",
        "# The training data's val split, scored at every depth r = 0..R and R + 2 ([grt_metrics]",
        "# validation_depths): how far each depth is from the source as training heals it.",
        "enable = true",
        f"dataset = {_toml_value(training['dataset'])}",
        f"seq_len = {seq_len}",
        f"local_batch_size = {training['local_batch_size']}",
        f"freq = {validation.get('freq', 500)}",
        f"steps = {validation.get('steps', 20)}",
        "",
    ]


def training_toml(
    src: Path, out: Path, args: GRTModelArgs, plan: LayerPlan, config: dict[str, Any], init: str = DEFAULT_INIT
) -> str:
    """The training TOML of a retrofit in `out` (absolute paths: it runs from any folder)."""
    preset_path = nearest_preset(args)
    preset = tomllib.loads(preset_path.read_text())
    lr = float(f"{preset['optimizer']['lr'] / CONTINUED_LR_DIVISOR:.3g}")
    lines = [
        *_header(src, out, plan, config, init),
        *_grt_section(args, preset["training"]["steps"]),
        *_checkpoint_section(out),
        *_recipe_sections(preset_path, preset, src, args, lr),
        *_validation_section(preset, args),
    ]
    return "\n".join(lines)


def _toml_tables(tables: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for section, table in tables.items():
        lines += [f"[{section}]", *(f"{key} = {_toml_value(value)}" for key, value in table.items()), ""]
    return lines


def task_toml(
    src: Path, out: Path, args: GRTModelArgs, plan: LayerPlan, config: dict[str, Any], init: str = DEFAULT_INIT
) -> str:
    """The task recipe of a retrofit in `out` (docs/retrofit.md, "Reasoning in depth: the task
    recipe"): train.toml's run on the chat-rendered multi-step task folder `out/task/data`,
    the recurrent block alone trained, each loop t supervised toward the t-th intermediate
    result, then the final answer alone for the last 1/ANNEAL_SHARE of the steps."""
    recipe = tomllib.loads(training_toml(src, out, args, plan, config, init))
    steps, data, R = recipe["training"]["steps"], str(out / "task" / "data"), args.num_recurrences
    supervised = steps - steps // ANNEAL_SHARE
    symbols = max(DEFAULT_SYMBOLS["iterated-function"], 2 * R + 1)  # test depths up to 2R

    def task(depths: str) -> str:
        return f"grt-titan task iterated-function --chat --symbols {symbols} --depths {depths}"

    header = [
        f"# Task recipe of the retrofit of {src} (docs/retrofit.md, 'Reasoning in depth: the task recipe'):",
        f"# loop t is trained toward the t-th step of a multi-step task for the first {supervised} optimizer steps,",
        f"# then toward the answer alone (the last 1/{ANNEAL_SHARE}); only the recurrent block trains (W_proj, the",
        "# gate, the core); prelude, coda and embeddings stay the source's. Its data (chat records rendered by",
        "# the source's chat template), the run and its evaluation by depth:",
        f"#   {task(f'1-{R}')} --n 20000 --out {out / 'task' / 'train.jsonl'}",
        f"#   grt-titan prepare {out / 'task' / 'train.jsonl'} --tokenizer {src} --out {data} --val-fraction 0.02",
        f"#   torchrun --nproc_per_node=2 -m grt_titan.train --job.config_file {out / 'task.toml'}",
        f"#   {task(f'1-{2 * R}')} --n 600 --split test --out {out / 'task' / 'test.jsonl'}",
        f"#   grt-titan eval-task {out / 'task_outputs' / 'checkpoint'} --config {out / 'task.toml'} "
        f"--data {out / 'task' / 'test.jsonl'} --trained-depths 1-{R}",
    ]
    recipe["job"] |= {"dump_folder": str(out / "task_outputs"), "description": f"Task recipe of {src.name}'s GRT"}
    recipe["grt"] |= {"step_supervision": True, "step_supervision_steps": supervised}
    seq_len = min(TASK_SEQ_LEN, args.max_seq_len)
    recipe["training"] |= {"dataset": data, "seq_len": seq_len, "trainable": ["recurrent"]}
    recipe["validation"] |= {"dataset": data, "seq_len": seq_len}
    recipe["data"] = {"pack_records": False}  # a packed neighbour's table would answer for a problem
    return "\n".join(header + _toml_tables(recipe))


def write_retrofit(
    src: str | Path,
    out: str | Path,
    prelude: int | None = None,
    core: tuple[int, int] | None = None,
    coda: int | None = None,
    overwrite: bool = False,
    seed: int = 0,
    gate_bias: float = GATE_CLOSED_BIAS,
    init: str = DEFAULT_INIT,
    task_recipe: bool = False,
    **grt: Any,
) -> Path:
    """Check everything, then write `out` at once (nothing on any error); with `task_recipe`,
    also task.toml (`task_toml`)."""
    src, out = Path(src).resolve(), Path(out).resolve()
    if out.exists() and not overwrite:
        raise RetrofitError(f"--out {out} already exists (pass --overwrite to replace it)")
    source = source_args(read_stock_config(src))
    plan = plan_layers(n_dense_layers(source), prelude, core, coda)
    vocab = check_tokenizer(src, source)  # before the weights are read
    model, plan, config = retrofit_model(src, plan, seed=seed, gate_bias=gate_bias, init=init, **grt)
    args = model.model_args
    # Every key of the model's state dict, the tied head's too (torchtitan's load asks for it).
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    record = {
        "source": str(src),
        "model_type": config["model_type"],
        "source_layers": plan.num_source_layers,
        "prelude": list(plan.prelude),
        "core": list(plan.core),
        "coda": list(plan.coda),
        "dropped": list(plan.dropped),
        "tokenizer_vocab_size": vocab,
        "gate_closed_bias": gate_bias,
        "init": init,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out, overwrite) as tmp:
        save_checkpoint(tmp / "model", state)
        (tmp / "model_args.json").write_text(json.dumps(fields, indent=2) + "\n")
        (tmp / RETROFIT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        (tmp / "train.toml").write_text(training_toml(src, out, args, plan, config, init))
        if task_recipe:
            (tmp / "task.toml").write_text(task_toml(src, out, args, plan, config, init))
    return out
