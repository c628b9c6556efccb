"""Every shipped TOML starts at the layout its header says it is a preset for.

Each file in train_configs/ runs with its own parallelism, compile, AC and float8 settings as
rank 0 of its intended world size on torchtitan's fake backend (real plans, shapes, compile
and a full step; collectives return without communicating), one step at sequence 16, compiled
presets with the `aot_eager_decomp_partition` backend (COMPILE_BACKEND says why), a
recurrent preset's step at depth 1 (SHALLOWEST_STEP says why), each part of its stack one
block deep at its own width (ONE_BLOCK_PER_PART says why; README's table of every preset at full
depth is checked on the meta device). The
step's loss and gradient norm mean nothing there (no data moves), so the test checks what
ran: the mesh, the model's size, compile and AC, never a loss value. The
world size comes from the header's first line: "2 CPU processes", "one node of 8 x ...",
"4+ nodes of 8 x ..." (4 x 8 = 32). A header this test cannot read fails it, so no preset
promises a layout that is not run here.

A retrofit preset (train_configs/retrofit_*.toml: `grt-titan retrofit`'s TOML for a model users
hold, docs/retrofit.md) reads the source's tokenizer from `[model] hf_assets_path`; CI holds no
such folder, so its run gets a stand-in tokenizer with the source tokenizer's number of ids
(the start-up vocabulary check compares it with the flavor's rows) and a prepared dataset of
its ids. Its weights are not needed: no run here loads the student from a checkpoint (its
`initial_load_path` is unset, `no_initial_weights_args`: a start would load it even with
checkpointing off, and CI holds no retrofit).

A preset that trains on a prepared folder of its own (grt_task_debug: the task data its docs
make) gets a token dataset of GPT-2 ids in its place (`stand_in_dataset_args`).

A distillation preset (`[distill] teacher`) names a teacher CI cannot hold, so its run gets a
stand-in: grt_medium_distill.toml's dense_medium checkpoint (354.8M parameters) becomes
dense_debug (the GPT-2 vocabulary, as the GPT-2 presets') saved here as a torchtitan step
folder with train_configs/dense_debug.toml as its `teacher_config`; retrofit_qwen3_0_6b_distill's
Qwen3-0.6B folder (the retrofit's source teaching its student) becomes a one-layer stock Qwen3
folder of the source's vocabulary beside the stand-in tokenizer. The run builds it, shards it
on the preset's mesh (FSDP x TP for the Qwen3 one: the TP shards loaded, then FSDP-sharded),
loads it under the fake backend and runs a distilled step; the test checks the teacher's log
line (its source, parameters and layout) and that the KD term was logged, never its value.

A preset equal to another but for what one of them adds (`STARTED_AS`: the Qwen3 retrofit and
the same with its source as teacher; grt_medium and the same distilled from dense_medium;
grt_large and the same in fault-tolerant replica groups, whose quorum needs a lighthouse the
fake backend cannot stand in for; grt_medium and grt_large and their isoParams twins, deeper
parts at the same width, which one block per part makes the same job; the paper's smaller
scales and the largest, another width of the same job; a test holds each pair equal) is
started through the other one: one run starts both at their layout, and the parameter count
checked is the run's.
"""

import dataclasses
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tomli
from torchtitan.protocols.train_spec import get_train_spec

import grt_titan.spec  # noqa: F401  registers the spec
from grt_titan.model.model import build_meta_model

from grt_test_helpers import (
    ANSI,
    REPO,
    distill_teacher,
    mesh_degrees,
    no_initial_weights_args,
    parse_config,
    source_tokenizer,
    stand_in_dataset_args,
    stand_in_source_tokenizer,
    stand_in_teacher_args,
    step_losses,
    write_token_dataset,
)
from tests.launcher import fake_backend_env, launch

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "train_configs").glob("*.toml"))
_WORDS = {"one": 1, "two": 2}


def intended_world_size(path: Path) -> int:
    header = path.read_text().splitlines()[0]
    if match := re.match(r"# Preset: (\d+) CPU processes", header):
        return int(match.group(1))
    if match := re.match(r"# Preset: (one|two|\d+)\+? nodes? of (\d+) x ", header):
        nodes = _WORDS.get(match.group(1)) or int(match.group(1))
        return nodes * int(match.group(2))
    raise AssertionError(f"{path.name}: header {header!r} names no layout this test can run")


# Sequence length of the runs: 16 in CI (what is checked, the plans, shapes, compile and AC, does
# not depend on it; 64 took 1.26x the time of 16 over all presets, 163 s vs 129 s in one process);
# `GRT_PRESET_SEQ_LEN=256 pytest tests/infra/test_presets.py` runs them longer (docs/parallelism.md,
# "Presets").
SEQ_LEN = int(os.environ.get("GRT_PRESET_SEQ_LEN", "16"))
# The presets' compile runs dynamo, AOTAutograd, the decompositions and the min-cut partitioner
# as inductor does, without inductor's C++ code generation (most of a compiled case's time on
# CPU). Inductor itself runs in the parity and TP + compile + AC tests.
COMPILE_BACKEND = "aot_eager_decomp_partition"
# The presets compute in bf16 (FSDP's mixed_precision_param); the runs here in float32. On a CPU
# without bf16 instructions (AVX2 only, as some CI machines) a bf16 matmul takes ~60x a float32
# one (512 x 4096 @ 4096 x 128: 8.2 s vs 0.12 s for 20, torch 2.13), and grt_large's one step
# 212 s against 40 s. What this test checks (mesh, shapes, plans, compile, AC) does not depend
# on the dtype; bf16 under FSDP, TP, compile, AC and float8 runs in the parallel matrix's
# corners at debug size (tests/infra/test_parallel_matrix.py). `GRT_PRESET_DTYPE=bfloat16`
# runs the presets as shipped.
PRESET_DTYPE = os.environ.get("GRT_PRESET_DTYPE", "float32")


# A recurrent preset's step runs at r = 1, the first step of a depth curriculum (its law's
# largest depth ramps from r_min = 1; docs/training.md): the recurrence step is compiled,
# checkpointed and sharded as at any depth (one compiled step serves every r:
# tests/infra/test_compile.py), while its core blocks run once instead of the sampled r times
# (r = 4 for most presets' first draw), about a third of the presets' time in CI.
SHALLOWEST_STEP = ["--grt.depth_curriculum_steps", "1000"]


# Each preset's run builds every part of its stack one block deep (its prelude, core and coda; a
# dense preset's stack of layers) at its own width, heads, vocabulary, mesh, plans, compile and
# AC. Everything the run checks is applied block by block and alike for every block of a part
# (FSDP and TP per block, AC and compile per block, one compiled recurrence step), so a part's
# further blocks add time, not coverage: one step's cost follows the parameters it gathers and
# reduces, and the presets at full depth took 2.2x the time (227 s against 101 s, one at a
# time on a 2-core machine). The CPU presets (FULL_DEPTH), run by users as shipped, keep their
# depth; every preset's full-depth size is README's table's
# (test_readme_configurations_table_is_every_preset_at_full_depth, on the meta device).
ONE_BLOCK_PER_PART = True
FULL_DEPTH = {"grt_debug", "dense_debug"}


def preset_model_args(path: Path):
    """The preset's architecture as shipped: its flavor (a name or a flavor file) with the
    TOML's `[grt]` overrides, as GRTModelArgs.update_from_config applies them."""
    from grt_titan.model.args import CONFIGURABLE_FIELDS
    from grt_titan.model.flavors import flavor_from_file

    toml = tomli.loads(path.read_text())
    flavor = toml["model"]["flavor"]
    args = flavor_from_file(str(REPO / flavor)) or get_train_spec("grt").model_args[flavor].replace()
    for name, value in toml.get("grt", {}).items():
        if name in CONFIGURABLE_FIELDS:
            setattr(args, name, value)
    return args


def one_block_per_part_args(path: Path, tmp: Path) -> list[str]:
    """`--model.flavor` of a flavor file: the preset's architecture with each part one block
    deep (a part it has not stays empty); none for FULL_DEPTH's presets."""
    if not ONE_BLOCK_PER_PART or path.stem in FULL_DEPTH:
        return []
    args = preset_model_args(path)
    depths = {name: min(1, getattr(args, name)) for name in ("n_prelude_layers", "n_core_layers", "n_coda_layers")}
    shallow = args.replace(**depths)
    flavor_file = tmp / f"{path.stem}-one-block-per-part.json"
    flavor_file.write_text(json.dumps({f.name: getattr(shallow, f.name) for f in dataclasses.fields(shallow)}))
    return ["--model.flavor", str(flavor_file)]


def is_recurrent(path: Path) -> bool:
    flavor = tomli.loads(path.read_text())["model"]["flavor"]
    return get_train_spec("grt").model_args[flavor].is_recurrent


def preset_args(path: Path, dump_folder: Path) -> list[str]:
    return [
        *(SHALLOWEST_STEP if is_recurrent(path) else []),
        "--comm.mode",
        "fake_backend",
        "--job.config_file",
        str(path),
        "--job.dump_folder",
        str(dump_folder),
        "--compile.backend",
        COMPILE_BACKEND,
        "--training.steps",
        "1",
        "--training.seq_len",
        str(SEQ_LEN),
        "--training.local_batch_size",
        "1",
        "--training.global_batch_size",
        "-1",
        "--training.mixed_precision_param",
        PRESET_DTYPE,
        "--checkpoint.no-enable",
        "--validation.no-enable",
        "--metrics.log_freq",
        "1",
        "--metrics.no-enable-tensorboard",
    ]


# ---- retrofit presets: a stand-in for the source folder ---------------------------------------


def stand_in_source_args(path: Path, tmp: Path) -> list[str]:
    """For a retrofit preset: its run's tokenizer (the stand-in) and a prepared dataset of that
    tokenizer's ids (the embedded corpus would be tokenized first: tens of seconds)."""
    if source_tokenizer(path) is None:
        return []
    from grt_titan.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(stand_in_source_tokenizer(path, tmp))
    ids = tokenizer.get_vocab_size()
    tokens = np.arange(1 << 14, dtype=np.int64) * 7919 % ids  # spread over all ids, not only the low ones
    splits = {"train": tokens, "val": np.zeros(0, np.int64)}
    data = write_token_dataset(tmp / f"{path.stem}-data", tokenizer, splits, shard_tokens=1 << 13, val_fraction=0.0)
    return ["--model.hf_assets_path", str(tokenizer.path), "--training.dataset", str(data)]


# ---- distillation presets: a stand-in teacher ------------------------------------------------


# A preset started through its twin: the two TOMLs are equal but for what the twin adds
# (test_qwen3_distill_preset_is_the_retrofit_preset_with_a_teacher; both run a microbatch of 1
# here), so the twin's run starts this preset's student at this preset's layout, plus a teacher.
STARTED_AS = {
    "retrofit_qwen3_0_6b": "retrofit_qwen3_0_6b_distill",
    "grt_large_ft": "grt_large",
    "grt_medium": "grt_medium_distill",
    # Table 5's isoParams twins differ from their scale in depth only, which the run's one block
    # per part takes away: the same job (grt_medium's, which its distilled twin starts).
    "grt_medium_isoparams": "grt_medium_distill",
    "grt_large_isoparams": "grt_large",
    # The paper's scales differ in their flavor (and the GRT's R) alone: at one block per part,
    # at depth 1, on FSDP 8, the same job at another width; grt_large's and dense_large's run
    # starts the smaller ones.
    "grt_small": "grt_large",
    "dense_small": "dense_large",
    "dense_medium": "dense_large",
}


def started_as(path: Path) -> Path:
    """The preset whose run starts `path`'s job (itself, unless STARTED_AS names another)."""
    return path.with_stem(STARTED_AS.get(path.stem, path.stem))


@pytest.fixture(scope="module")
def preset_runs(request, module_tmp):
    """The presets this session tests (all of them in CI; `-k NAME` runs one), two at a time
    (each is one process; compile dominates)."""
    tmp = module_tmp("presets")
    selected = {
        item.callspec.params["path"]
        for item in request.session.items
        if item.module is request.module and "path" in getattr(getattr(item, "callspec", None), "params", {})
    }

    def run(path):
        stand_in = [
            *stand_in_source_args(path, tmp),
            *stand_in_dataset_args(path, tmp),
            *no_initial_weights_args(path),
            *stand_in_teacher_args(path, tmp),
            *one_block_per_part_args(path, tmp),
        ]
        proc = launch(
            "grt_titan.train",
            [*preset_args(path, tmp / path.stem), *stand_in],
            fake_backend_env(intended_world_size(path)),
            timeout=1200,
        )
        (tmp / f"{path.stem}.log").write_text(proc.stdout + proc.stderr)
        return path.stem, (proc, stand_in)

    started = {started_as(path) for path in selected}
    with ThreadPoolExecutor(2) as pool:
        runs = dict(pool.map(run, [path for path in CONFIGS if path in started]))
    return {path.stem: runs[started_as(path).stem] for path in selected}


def test_every_header_names_a_world_size():
    sizes = {path.stem: intended_world_size(path) for path in CONFIGS}
    assert sizes["grt_debug"] == 2 and sizes["grt_large"] == 8 and sizes["grt_llama_1b"] == 32
    assert sizes["retrofit_qwen3_0_6b"] == 8 and sizes["grt_medium_distill"] == 8
    assert sizes["retrofit_qwen3_0_6b_distill"] == 8


def _qwen3_0_6b_config() -> dict:
    """Qwen/Qwen3-0.6B's config.json (its numbers; transformers' own class, no weights)."""
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    return json.loads(config.to_json_string())


def readme_configurations() -> dict[str, dict[str, str]]:
    """README's "Configurations" table, by preset (the TOML's stem)."""
    text = (REPO / "README.md").read_text()
    start = text.index("| config | flavor | layout |")
    lines = text[start : text.index("\n\n", start)].splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]
    return {row["config"].removesuffix(".toml"): row for row in rows}


def stored_params(count: int) -> str:
    """README's spelling of a parameter count: 7.4M, 601.3M, 1.04B."""
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def test_readme_configurations_table_is_every_preset_at_full_depth():
    """Every preset in README's table as it is shipped, built at full depth on the meta device:
    its flavor, layout, width, heads and stored parameters (its run in this module builds each
    part one block deep: ONE_BLOCK_PER_PART)."""
    table = readme_configurations()
    # grt_large_ft is grt_large in replica groups (docs/reliability.md), not a row of its own.
    assert set(table) == {path.stem for path in CONFIGS} - {"grt_large_ft"}
    for path in CONFIGS:
        if path.stem not in table:
            continue
        row, args = table[path.stem], preset_model_args(path)
        assert row["flavor"] == tomli.loads(path.read_text())["model"]["flavor"].removeprefix("train_configs/"), (
            path.stem
        )
        p, n, r, c = args.n_prelude_layers, args.n_core_layers, args.num_recurrences, args.n_coda_layers
        layout = f"{p} + {n}x{r} + {c}" if args.is_recurrent else f"{p} layers"
        assert row["layout"].startswith(layout), (path.stem, row["layout"], layout)
        assert row["d"] == str(args.dim) and row["heads"].split()[0] == str(args.n_heads), path.stem
        count = sum(param.numel() for param in build_meta_model(args).parameters())
        assert row["stored params"] == stored_params(count), (path.stem, row["stored params"], count)


def test_qwen3_preset_is_what_retrofit_writes():
    """retrofit_qwen3_0_6b ships `grt-titan retrofit`'s output for Qwen3-0.6B at its defaults:
    the flavor file is its model_args.json, the TOML its train.toml but for the paths
    (repository-relative) and the layout (TP 2)."""
    from grt_titan.hf.retrofit import DEFAULT_RECURRENCES, plan_layers, retrofit_args, training_toml
    from grt_titan.hf.stock_folders import n_dense_layers, source_args

    config = _qwen3_0_6b_config()
    source = source_args(config)  # what `grt-titan retrofit` reads from config.json, weights aside
    plan = plan_layers(n_dense_layers(source), None, None, None)
    args = retrofit_args(source, plan, num_recurrences=DEFAULT_RECURRENCES)
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    preset = REPO / "train_configs" / "retrofit_qwen3_0_6b.toml"
    shipped = tomli.loads(preset.read_text())
    assert json.loads((REPO / shipped["model"]["flavor"]).read_text()) == json.loads(json.dumps(fields))
    assert (plan.prelude, plan.core, plan.coda) == (tuple(range(11)), tuple(range(11, 17)), tuple(range(17, 28)))

    src, out = Path("/src/Qwen3-0.6B"), Path("/out/qwen3")
    written = tomli.loads(training_toml(src, out, args, plan, config))
    paths = {
        ("job", "dump_folder"): "./outputs/retrofit_qwen3_0_6b",
        ("model", "flavor"): "train_configs/retrofit/qwen3_0_6b.json",
        ("model", "hf_assets_path"): "models/Qwen3-0.6B",
        ("checkpoint", "initial_load_path"): "retrofits/qwen3/model",
    }
    for (section, key), value in paths.items():
        assert shipped[section].pop(key) == value
        written[section].pop(key)
    assert shipped.pop("parallelism") == {"data_parallel_shard_degree": -1, "tensor_parallel_degree": 2}
    written.pop("parallelism")
    shipped["job"].pop("description")
    written["job"].pop("description")
    assert shipped == written
    # The docs' retrofit command writes where the preset loads from.
    assert "grt-titan retrofit models/Qwen3-0.6B --out retrofits/qwen3" in (REPO / "docs" / "retrofit.md").read_text()


def test_qwen3_distill_preset_is_the_retrofit_preset_with_a_teacher():
    """retrofit_qwen3_0_6b_distill is retrofit_qwen3_0_6b (itself what the retrofit writes)
    with its source as the teacher, its own dump folder and half the microbatch; nothing else
    differs, so the two presets cannot drift apart."""
    retrofit, distill = (
        tomli.loads((REPO / "train_configs" / f"{name}.toml").read_text())
        for name in ("retrofit_qwen3_0_6b", "retrofit_qwen3_0_6b_distill")
    )
    assert distill.pop("distill") == {
        "teacher": retrofit["model"]["hf_assets_path"],  # the source folder: its weights and tokenizer
        "alpha": 0.5,
        "temperature": 2.0,
        "loss": "forward_kl",
    }
    assert distill["job"].pop("dump_folder") == "./outputs/retrofit_qwen3_0_6b_distill"
    assert (retrofit["training"].pop("local_batch_size"), distill["training"].pop("local_batch_size")) == (12, 6)
    for toml in (retrofit, distill):
        toml["job"].pop("description")
        toml["job"].pop("dump_folder", None)
    assert distill == retrofit


def test_distilled_medium_preset_is_grt_medium_with_a_teacher():
    """grt_medium_distill is grt_medium with a [distill] section and its own dump folder;
    nothing else differs, so its run starts grt_medium's job too (STARTED_AS)."""
    medium, distill = (
        tomli.loads((REPO / "train_configs" / f"{name}.toml").read_text())
        for name in ("grt_medium", "grt_medium_distill")
    )
    assert distill.pop("distill")["teacher_config"] == "train_configs/dense_medium.toml"
    for toml in (medium, distill):
        toml["job"].pop("description")
        toml["job"].pop("dump_folder")
    assert distill == medium


@pytest.mark.parametrize(
    "smaller, larger", [("grt_small", "grt_large"), ("dense_small", "dense_large"), ("dense_medium", "dense_large")]
)
def test_paper_scales_differ_in_their_flavor_alone(smaller, larger):
    """The paper's scales (table 1): the same recipe and layout, the flavor (and the GRT's R)
    their only difference, so the larger one's run starts the smaller one's job (STARTED_AS)."""
    small, large = (tomli.loads((REPO / "train_configs" / f"{name}.toml").read_text()) for name in (smaller, larger))
    for toml in (small, large):
        toml["model"].pop("flavor")
        toml.get("grt", {}).pop("num_recurrences", None)
        toml["job"].pop("description")
        toml["job"].pop("dump_folder")
    assert small == large
    assert STARTED_AS[smaller] == larger


def test_fault_tolerant_large_preset_is_grt_large_in_replica_groups():
    """grt_large_ft is grt_large with a [fault_tolerance] section, its own dump folder and the
    microbatch that splits the global batch over 2 groups x 8 GPUs; nothing else differs. Each
    group runs grt_large's layout, started by grt_large's run (STARTED_AS)."""
    large, ft = (
        tomli.loads((REPO / "train_configs" / f"{name}.toml").read_text()) for name in ("grt_large", "grt_large_ft")
    )
    section = ft.pop("fault_tolerance")
    assert (section["enable"], section["group_size"], section["process_group"]) == (True, 2, "nccl")
    assert ft["job"].pop("dump_folder") == "./outputs/grt_large_ft"
    groups_x_gpus = section["group_size"] * intended_world_size(REPO / "train_configs" / "grt_large_ft.toml")
    assert ft["training"]["global_batch_size"] % (ft["training"]["local_batch_size"] * groups_x_gpus) == 0
    for toml in (large, ft):
        toml["job"].pop("description")
        toml["job"].pop("dump_folder", None)
        toml["training"].pop("local_batch_size")
        toml["validation"].pop("local_batch_size")
    assert ft == large


@pytest.mark.parametrize("scale", ["medium", "large"])
def test_isoparams_presets_are_their_scale_with_deeper_parts(scale):
    """grt_SCALE_isoparams is grt_SCALE but for its flavor, whose parts are deeper and nothing
    else: at one block per part (ONE_BLOCK_PER_PART) the two are one job (STARTED_AS)."""
    base, iso = (
        tomli.loads((REPO / "train_configs" / f"{name}.toml").read_text())
        for name in (f"grt_{scale}", f"grt_{scale}_isoparams")
    )
    assert (base["model"].pop("flavor"), iso["model"].pop("flavor")) == (scale, f"{scale}_isoparams")
    for toml in (base, iso):
        toml["job"].pop("description")
        toml["job"].pop("dump_folder")
    assert iso == base
    flavors = get_train_spec("grt").model_args
    depths = ("n_prelude_layers", "n_core_layers", "n_coda_layers")
    one_block = dict.fromkeys(depths, 1)
    assert flavors[f"{scale}_isoparams"].replace(**one_block) == flavors[scale].replace(**one_block)
    assert ONE_BLOCK_PER_PART and f"grt_{scale}" not in FULL_DEPTH


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_preset_starts_at_its_layout(path, preset_runs):
    proc, stand_in = preset_runs[path.stem]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert list(step_losses(output)) == [1], output[-2000:]  # one step ran (its value means nothing here)
    if is_recurrent(path):  # at the curriculum's first depth
        assert re.search(r"grt  r: 1  ", ANSI.sub("", output)), output[-2000:]
    # The model that ran is the preset's (the one it is started as): torchtitan's parameter
    # count of the built model.
    config = parse_config(*stand_in, *(SHALLOWEST_STEP if is_recurrent(path) else []), path=started_as(path))
    args = get_train_spec("grt").model_args[config.model.flavor].replace()
    args.update_from_config(config)
    expected = sum(p.numel() for p in build_meta_model(args).parameters())
    assert f"size: {expected:,} total parameters" in ANSI.sub("", output)
    # The layout that ran is the preset's: its degrees multiply to the intended world size.
    degrees = mesh_degrees(output)
    assert degrees, output[-2000:]
    assert degrees["dp_replicate"] * degrees["dp_shard"] * degrees["tp"] == intended_world_size(path)
    toml = tomli.loads(path.read_text())
    assert degrees["tp"] == toml.get("parallelism", {}).get("tensor_parallel_degree", 1)
    if toml.get("compile", {}).get("enable"):
        assert "Compiling each TransformerBlock with torch.compile" in output
    ac_mode = toml.get("activation_checkpoint", {}).get("mode", "none")
    if ac_mode != "none":
        assert f"Applied {ac_mode} activation checkpointing to the model" in output
    if (shape := source_tokenizer(path)) is not None:  # a retrofit preset ran with the source's vocabulary
        assert f"vocab {sum(shape)}, sha256" in output
    if distill_teacher(path) is not None:  # the stand-in teacher ran, sharded on the preset's mesh
        from torchtitan.distributed import ParallelDims

        from grt_titan.teacher import parameter_count, teacher_args, teacher_layout, teacher_source

        source = teacher_source(config.distill)
        teacher = teacher_args(source)
        dims = ParallelDims(
            **{k: degrees[k] for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp")},
            world_size=intended_world_size(path),
        )
        layout = teacher_layout(dims)  # "FSDP 8" for grt_medium_distill, "FSDP 4 x TP 2" for the Qwen3 retrofit's
        assert layout.startswith(("FSDP", "HSDP", "TP")), layout  # sharded, not replicated
        kind = f"{source.kind}, {teacher.method_name}, {parameter_count(teacher):,} parameters"
        line = f"({kind}), frozen, sharded like the student ({layout})"
        plain = ANSI.sub("", output)
        assert "Distillation teacher:" in plain and line in plain, output[-4000:]
        assert re.search(r"distill  kd: \S+  ce: \S+", plain), output[-2000:]  # the KD term was logged
