"""The host-neutral reader of a run (grt_titan/run_reader.py): a training TOML reads as
torchtitan 0.2.2's parse reads it, a run record of either host gives the args the run built,
bad input is named in one line, and the tools that read runs load nothing of 0.2.2's alone."""

import dataclasses
import json
import subprocess
import sys

import pytest

from grt_titan.run_reader import CheckpointError, load_model_args
from grt_titan.run_record import build_run_record, write_run_record

from grt_test_helpers import DEBUG_TOML, REPO

CONFIGS = REPO / "train_configs"
# (TOML, command-line overrides): [grt] parts, a llama RoPE table stretched by seq_len, a
# flavor changed on the command line, a paper row (SCSE's parts), a curriculum and a flag.
CASES = [
    (DEBUG_TOML, []),
    (DEBUG_TOML, ["--grt.num_recurrences", "3", "--grt.gate_noise_std=0.2", "--checkpoint.no-enable"]),
    (DEBUG_TOML, ["--model.flavor", "dense_debug", "--training.seq_len", "64"]),
    (CONFIGS / "grt_llama_1b.toml", ["--training.seq_len", "16384"]),
    (CONFIGS / "paper" / "small_scse.toml", []),
    (CONFIGS / "paper" / "small_mor.toml", ["--grt.eval_recurrences", "5"]),
    (CONFIGS / "grt_task_debug.toml", ["--grt.depth_curriculum_steps", "4"]),
]
# The settings the tools read besides the args (export-hf, analyze, table).
READ = [
    ("job", "dump_folder"),
    ("job", "description"),
    ("model", "flavor"),
    ("model", "hf_assets_path"),
    ("training", "seq_len"),
    ("training", "global_batch_size"),
    ("training", "steps"),
    ("validation", "dataset"),
    ("validation", "dataset_path"),
    ("validation", "seq_len"),
    ("metrics", "save_tb_folder"),
    ("debug", "seed"),
    ("checkpoint", "enable"),
]


@pytest.mark.parametrize("training_schedule", [False, True])
@pytest.mark.parametrize("path, overrides", CASES, ids=[f"{p.stem} {' '.join(o)}" for p, o in CASES])
def test_a_toml_reads_as_torchtitan_0_2_parses_it(path, overrides, training_schedule):
    """The same GRTModelArgs as 0.2.2's parse + `update_from_config` (the schedule keys
    nulled, as a trained model is read), and the same settings."""
    pytest.importorskip("torchtitan.components.ft")  # torchtitan 0.2.2
    from grt_titan.checkpoints.job_files import parse_job_config
    from grt_titan.run_reader import TRAINING_SCHEDULE_KEYS, flavor_args

    job_config = parse_job_config(path, overrides)
    if not training_schedule:
        job_config.grt = dataclasses.replace(job_config.grt, **dict.fromkeys(TRAINING_SCHEDULE_KEYS))
    expected = flavor_args(job_config.model.flavor, str(path))
    # GRTModelArgs' own update, without the spec's start-up checks (they look for the job's
    # data folders, which a fresh clone has not prepared).
    expected.update_from_config(job_config)
    args, view = load_model_args(path, overrides, training_schedule=training_schedule)
    assert args == expected
    for section, key in READ:
        assert getattr(getattr(view, section), key) == getattr(getattr(job_config, section), key), (section, key)
    assert view.data == job_config.data


def test_a_toml_reads_without_torchtitan_0_2():
    """What the reader gives, checked by value: it needs no host parser (tests/test_run_reader.py
    runs on the torchtitan 0.3 lane too)."""
    args, view = load_model_args(DEBUG_TOML, ["--grt.num_recurrences", "3", "--training.trainable", "a.*", "b"])
    assert (args.num_recurrences, args.min_recurrences, args.dim, args.gate_noise_std) == (3, 1, 128, 0.1)
    assert (view.model.flavor, view.training.seq_len, view.validation.dataset) == ("debug", 128, "grt_default")
    assert view.training.trainable == ["a.*", "b"] and view.job.config_file == str(DEBUG_TOML)
    dense, _ = load_model_args(DEBUG_TOML, ["--model.flavor", "dense_debug", "--grt.depth_curriculum_steps", "9"])
    assert not dense.is_recurrent and dense.depth_curriculum_steps == 0  # a schedule: dropped
    with pytest.raises(CheckpointError, match="no depth to ramp"):
        load_model_args(DEBUG_TOML, ["--model.flavor", "dense_debug", "--grt.depth_curriculum_steps=9"], training_schedule=True)  # fmt: skip


def _write_record(folder, overrides):
    """A run record as a training start writes it, built from the reader's own view."""
    args, view = load_model_args(DEBUG_TOML, overrides, training_schedule=True)
    args.forwards_per_step = 2  # a job's gradient accumulation: a training schedule
    write_run_record(folder, build_run_record(view, args, world_size=2, batch_degree=2))
    return args


def test_a_run_record_gives_the_args_the_run_built(tmp_path):
    overrides = ["--grt.num_recurrences", "3", "--grt.depth_curriculum_steps", "2"]
    built = _write_record(tmp_path, overrides)
    assert load_model_args(tmp_path / "grt_run.json", training_schedule=True)[0] == built
    args, view = load_model_args(tmp_path)  # the dump folder names its record
    assert args == load_model_args(DEBUG_TOML, overrides)[0]  # the schedule dropped, as from the TOML
    assert (args.depth_curriculum_steps, args.forwards_per_step, args.num_recurrences) == (0, 1, 3)
    assert (view.model.flavor, view.training.seq_len, view.model.hf_assets_path) == (
        "debug",
        128,
        load_model_args(DEBUG_TOML)[1].model.hf_assets_path,
    )
    changed, _ = load_model_args(tmp_path, ["--grt.eval_recurrences", "2"])
    assert (changed.eval_recurrences, changed.num_recurrences) == (2, 3)


def test_a_torchtitan_0_3_record_is_read(tmp_path):
    """0.3's `Trainer.Config.to_dict()` layout (grt_titan/torchtitan_0_3/recipe.py places)."""
    built = _write_record(tmp_path, [])
    record = json.loads((tmp_path / "grt_run.json").read_text())
    record["job_config"] = {
        "model_spec": {"name": "grt", "flavor": "debug"},
        "hf_assets_path": "tok/llama",
        "dump_folder": "/runs/o3",
        "training": {"seq_len": 128, "local_batch_size": 8, "global_batch_size": -1, "steps": 6},
        "dataloader": {"dataset": "data/train", "dataset_path": None},
        "validator": {"enable": True, "dataloader": {"dataset": "data/val", "dataset_path": None}},
        "metrics": {"save_tb_folder": "tb3"},
        "grt": dataclasses.asdict(load_model_args(DEBUG_TOML)[1].grt),
        "data": {"seed": 7},
    }
    (tmp_path / "grt_run.json").write_text(json.dumps(record))
    args, view = load_model_args(tmp_path)
    assert args == dataclasses.replace(built, forwards_per_step=1)
    assert (view.model.hf_assets_path, view.job.dump_folder, view.metrics.save_tb_folder) == (
        "tok/llama",
        "/runs/o3",
        "tb3",
    )
    assert (view.validation.dataset, view.validation.seq_len, view.training.dataset) == ("data/val", 128, "data/train")
    assert view.data.seed == 7


def test_a_torchtitan_0_2_record_reads_as_its_parse(tmp_path):
    """The settings of a 0.2.2 record (its JobConfig) are those 0.2.2's parse of it gives."""
    pytest.importorskip("torchtitan.components.ft")
    from grt_titan.checkpoints.job_files import parse_job_config

    from grt_test_helpers import parse_config

    overrides = ["--grt.num_recurrences", "3", "--training.seq_len", "64", "--job.dump_folder", str(tmp_path)]
    job_config = parse_config(*overrides)
    args, _ = load_model_args(DEBUG_TOML, overrides)
    write_run_record(tmp_path, build_run_record(job_config, args, world_size=1, batch_degree=1))
    parsed = parse_job_config(tmp_path / "grt_run.json")
    read_args, view = load_model_args(tmp_path / "grt_run.json")
    assert read_args == args
    for section, key in READ:
        assert getattr(getattr(view, section), key) == getattr(getattr(parsed, section), key), (section, key)


@pytest.mark.parametrize(
    "text, overrides, named",
    [
        (
            "[model]\nname = 'grt'\nflavor = 'debug'\n[grt]\nnum_recurence = 3\n",
            [],
            ["[grt] num_recurence", "num_recurrences"],
        ),  # fmt: skip
        ("[model]\nname = 'grt'\nflavor = 'no_such'\n", [], ["flavor 'no_such' unknown", "debug"]),
        ("[model]\nname = 'llama3'\nflavor = 'debug'\n", [], ["[model] name = 'llama3'"]),
        ("[model]\nname = 'grt'\nflavor = 'debug'\n[grtt]\nx = 1\n", [], ["[grtt] is not a section"]),
        ("[model]\nname = 'grt'\nflavor = 'debug'\n", ["--grt.num_recurence", "3"], ["[grt] num_recurence"]),
        (
            "[model]\nname = 'grt'\nflavor = 'debug'\n",
            ["--grt.num_recurrences", "x"],
            ["--grt.num_recurrences 'x': expected int"],
        ),  # fmt: skip
        ("[model]\nname = 'grt'\nflavor = 'debug'\n", ["--grt.update", "copy"], ["--grt.update 'copy': allowed: ["]),
        ("[model]\nname = 'grt'\nflavor = 'debug'\n", ["--grt.num_recurrences", "0"], ["num_recurrences"]),
        ("[model\n", [], ["cannot read as a training TOML"]),
    ],
)
def test_bad_input_is_named(tmp_path, text, overrides, named):
    path = tmp_path / "train.toml"
    path.write_text(text)
    with pytest.raises(CheckpointError) as e:
        load_model_args(path, overrides)
    message = str(e.value)
    assert message.startswith(str(path)) and "\n" not in message, message
    assert all(part in message for part in named), message


def test_bad_paths_are_named(tmp_path):
    with pytest.raises(CheckpointError, match=f"config file {tmp_path / 'missing.toml'} does not exist"):
        load_model_args(tmp_path / "missing.toml")
    with pytest.raises(CheckpointError, match="is a folder without grt_run.json"):
        load_model_args(tmp_path)
    _write_record(tmp_path, [])
    with pytest.raises(CheckpointError, match="a run record's model is its model_args"):
        load_model_args(tmp_path, ["--model.flavor", "dense_debug"])
    (tmp_path / "grt_run.json").write_text("{}")
    with pytest.raises(CheckpointError, match="not a grt_titan run record"):
        load_model_args(tmp_path)


# Modules only torchtitan 0.2.2 has, or grt_titan's 0.2.2 adapter.
ZERO_TWO_ONLY = (
    "torchtitan.components.ft",
    "torchtitan.protocols.train_spec",
    "torchtitan.models.llama3",
    "grt_titan.job_config",
    "grt_titan.spec",
    "grt_titan.config_checks",
)


def test_the_readers_of_runs_import_nothing_of_torchtitan_0_2_alone():
    """export-hf, import-hf, analyze and table, and the reader at work, on either host: what
    they load exists on torchtitan 0.3 too (proved here on whichever host runs the tests)."""
    code = (
        "import sys\n"
        "import grt_titan.hf.export, grt_titan.hf.importer, grt_titan.analysis.cli, grt_titan.analysis.load\n"
        "import grt_titan.analysis.table, grt_titan.checkpoints.folders, grt_titan.checkpoints.hf_weights\n"
        "import grt_titan.checkpoints.job_files, grt_titan.checkpoints.load, grt_titan.checkpoints.start_load\n"
        "from grt_titan.run_reader import load_model_args\n"
        f"load_model_args({str(DEBUG_TOML)!r}, ['--grt.num_recurrences', '3'])\n"
        f"print(sorted(m for m in sys.modules if m.startswith({ZERO_TWO_ONLY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
