"""Every shipped TOML starts at the layout its header says it is a preset for.

Each file in train_configs/ runs with its own parallelism, compile, AC and float8 settings as
rank 0 of its intended world size on torchtitan's fake backend (real plans, shapes, compile
and a full step; collectives return without communicating), one step at sequence 64, compiled
presets with the `aot_eager_decomp_partition` backend (COMPILE_BACKEND says why). The
step's loss and gradient norm mean nothing there (no data moves), so the test checks what
ran: the mesh, the model's size, compile and AC, never a loss value. The
world size comes from the header's first line: "2 CPU processes", "one node of 8 x ...",
"4+ nodes of 8 x ..." (4 x 8 = 32). A header this test cannot read fails it, so no preset
promises a layout that is not run here.
"""

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tomli

from grt_titan.checkpoint_io import load_model_args
from grt_titan.model.model import build_meta_model

from grt_test_helpers import ANSI, mesh_degrees, step_losses
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


# Sequence length of the runs: 64 in CI; `GRT_PRESET_SEQ_LEN=256 pytest tests/infra/test_presets.py`
# runs them longer (docs/parallelism.md, "Presets").
SEQ_LEN = int(os.environ.get("GRT_PRESET_SEQ_LEN", "64"))
# The presets' compile runs dynamo, AOTAutograd, the decompositions and the min-cut partitioner
# as inductor does, without inductor's C++ code generation (most of a compiled case's time on
# CPU). Inductor itself runs in the parity and TP + compile + AC tests.
COMPILE_BACKEND = "aot_eager_decomp_partition"


def preset_args(path: Path, dump_folder: Path) -> list[str]:
    return [
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
        "--checkpoint.no-enable",
        "--validation.no-enable",
        "--metrics.log_freq",
        "1",
        "--metrics.no-enable-tensorboard",
    ]


@pytest.fixture(scope="module")
def preset_runs(module_tmp):
    """All presets, two at a time (each is one process; compile dominates)."""
    tmp = module_tmp("presets")

    def run(path):
        proc = launch(
            "grt_titan.train",
            preset_args(path, tmp / path.stem),
            fake_backend_env(intended_world_size(path)),
            timeout=1200,
        )
        (tmp / f"{path.stem}.log").write_text(proc.stdout + proc.stderr)
        return path.stem, proc

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, CONFIGS))


def test_every_header_names_a_world_size():
    sizes = {path.stem: intended_world_size(path) for path in CONFIGS}
    assert sizes["grt_debug"] == 2 and sizes["grt_large"] == 8 and sizes["grt_llama_1b"] == 32


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_preset_starts_at_its_layout(path, preset_runs):
    proc = preset_runs[path.stem]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert list(step_losses(output)) == [1], output[-2000:]  # one step ran (its value means nothing here)
    # The model that ran is the preset's: torchtitan's parameter count of the built model.
    args = load_model_args(path)[0]
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
