"""grt_debug trained by torchtitan 0.3 (`-m torchtitan.train --module grt_titan`) on 2 gloo
ranks, held to the other host: its losses are torchtitan 0.2.2's golden ones
(tests/golden/grt_debug_losses.json, which the 0.2.2 lane reproduces within 1e-5), and its
checkpoints resume under 0.2.2 and back (a user upgrading mid-run).

The cross-host runs need the other host's interpreter, `GRT_TORCHTITAN_0_2_PYTHON` (a venv with
torchtitan 0.2.2 and grt_titan: CI's torch 2.13 venv, .ci/run); without it they skip, except
under CI, where they fail.
"""

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan 0.3's Trainer (the 0.3 lane)")

from grt_titan.components.checksums import verify_checkpoint  # noqa: E402

from grt_test_helpers import REPO, torchrun  # noqa: E402

_spec = importlib.util.spec_from_file_location("make_golden", REPO / "tests" / "golden" / "make_golden.py")
mg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mg)

GOLDEN = json.loads(mg.GOLDEN.read_text())["variants"]["fsdp2"]
# Measured: 1.2e-7 (one float32 ulp) at worst over the 20 steps, torch 2.14.1 against the golden
# file's 2.13.0 (docs/training.md, "torchtitan 0.2.2 and 0.3"); a 0.1% larger learning rate
# moves a loss by 3e-4 (tests/infra/test_golden_losses.py).
HOST_REL = 1e-4
# The golden command's own arguments in each host's spelling (tests/golden/make_golden.py).
GOLDEN_0_3 = [
    *("--training.seq_len", "64", "--training.local_batch_size", "2", "--training.steps", "20"),
    *("--metrics.log_freq", "1", "--validator.no-enable", "--debug.seed", "0"),
    *("--parallelism.data_parallel_shard_degree", "2"),
]
OTHER_HOST_ENV = "GRT_TORCHTITAN_0_2_PYTHON"


def run_0_3(dump: Path, *args: str, config: str = "grt_debug", env: dict | None = None) -> subprocess.CompletedProcess:
    proc = torchrun(
        2,
        ["--module", "grt_titan", "--config", config, *GOLDEN_0_3, "--dump_folder", str(dump), *args],
        dump.parent,
        module="torchtitan.train",
        env={"OMP_NUM_THREADS": "1", **(env or {})},
        log_name=f"{dump.name}.log",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def run_0_2(dump: Path, *args: str) -> subprocess.CompletedProcess:
    """The same job on torchtitan 0.2.2, in the other host's interpreter."""
    python = os.environ.get(OTHER_HOST_ENV)
    if not python:
        if os.environ.get("CI"):
            pytest.fail(f"{OTHER_HOST_ENV} is unset: CI's 0.3 lane runs the cross-host tests (.ci/run)")
        pytest.skip(f"{OTHER_HOST_ENV} names no torchtitan 0.2.2 interpreter")
    command = [python, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d"]
    command += ["--rdzv-endpoint=localhost:0", "--local-ranks-filter=0", "-m", "grt_titan.train"]
    command += mg.run_args(2, dump) + list(args)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


@pytest.fixture(scope="module")
def fresh(module_tmp):
    """20 golden steps on 0.3, a full checkpoint at step 10, the model at step 20."""
    dump = module_tmp("host_0_3") / "fresh"
    run_0_3(dump, "--checkpoint.enable", "--checkpoint.interval", "10")
    return dump


@pytest.mark.slow
def test_losses_are_the_0_2_2_hosts(fresh):
    assert mg.scalars(fresh) == pytest.approx(GOLDEN["losses"], rel=HOST_REL)


@pytest.mark.slow
def test_it_checkpoints_and_records_the_run(fresh):
    assert sorted(p.name for p in (fresh / "checkpoint").iterdir()) == ["step-10", "step-20"]
    # checksummed by default, as on 0.2.2 (torchtitan_0_3/checkpoint.py): both hosts verify them
    assert [verify_checkpoint(str(fresh / "checkpoint" / s)) for s in ("step-10", "step-20")] == [[], []]
    record = json.loads((fresh / "grt_run.json").read_text())
    assert record["flavor"] == "debug" and record["label"] == "GRT" and record["world_size"] == 2
    assert record["model_args"]["num_recurrences"] == 4 and record["versions"]["torchtitan"].startswith("0.3")


@pytest.mark.slow
def test_it_logs_the_gate_metrics_as_0_2_2_does(fresh):
    """grt_titan's metrics processor on 0.3 (torchtitan_0_3/metrics.py), log_freq 1: each step's
    sampled depth and per-recurrence-step gate statistics, under the 0.2.2 host's tags."""
    depths = mg.scalars(fresh, "grt/r")
    assert len(depths) == 20 and set(depths) <= {1.0, 2.0, 3.0, 4.0}  # r ~ Uniform{1..4}, one forward a step
    assert mg.scalars(fresh, "grt/r_mean") == depths  # the FLOPs' depth bookkeeping agrees
    gates = mg.scalars(fresh, "grt_gate_mean/step1")
    assert len(gates) == 20 and all(0 < g < 1 for g in gates)
    assert len(mg.scalars(fresh, "grt_gate_mean/step4")) == depths.count(4.0)  # step i at r >= i only
    assert "grt  r: " in (fresh.parent / "fresh.log").read_text()  # the console line


@pytest.mark.slow
def test_its_checkpoint_exports_and_the_export_generates(fresh, tmp_path, monkeypatch):
    """`grt-titan export-hf` of the 0.3 run (its record as the config), verified by export-hf
    itself against the native model's logits; the export then decodes greedily with its KV
    cache exactly as without one."""
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grt_titan.cli import main as cli

    out = tmp_path / "export"
    assert cli(["export-hf", "--checkpoint", str(fresh / "checkpoint"), "--config", str(fresh), "--out", str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(str(out))("The quick brown fox", return_tensors="pt").input_ids
    cached = model.generate(ids, max_new_tokens=8, do_sample=False)
    uncached = model.generate(ids, max_new_tokens=8, do_sample=False, use_cache=False)
    assert cached.shape == (1, ids.shape[1] + 8) and torch.equal(cached, uncached)


@pytest.fixture(scope="module")
def resumed_under_0_2(fresh, module_tmp):
    """0.2.2 resumes 0.3's step 10 and checkpoints every 5 steps (15, 20)."""
    dump = module_tmp("host_0_3") / "to_0_2"
    shutil.copytree(fresh / "checkpoint" / "step-10", dump / "checkpoint" / "step-10")
    proc = run_0_2(dump, "--checkpoint.enable", "--checkpoint.interval", "5", "--checkpoint.no-last_save_model_only")
    (dump.parent / "to_0_2.log").write_text(proc.stdout + proc.stderr)
    return dump


@pytest.mark.slow
def test_0_2_2_resumes_a_0_3_checkpoint(resumed_under_0_2):
    assert mg.scalars(resumed_under_0_2) == pytest.approx(GOLDEN["losses"][10:], rel=HOST_REL)
    assert "unverified" not in (resumed_under_0_2.parent / "to_0_2.log").read_text()  # 0.3's checksums verified
    assert verify_checkpoint(str(resumed_under_0_2 / "checkpoint" / "step-15")) == []  # 0.3 verifies these


def gpu_recipe(folder: Path) -> Path:
    """grt_debug with the GPU presets' step code: per-op selective AC (each recurrence step one
    region, `[grt] recurrence_checkpoint = "step"`) and compile, a preset of its own folder."""
    text = (REPO / "train_configs" / "grt_debug.toml").read_text()
    text = text.replace(
        '[activation_checkpoint]\nmode = "none"',
        '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "op"',
    )
    text = text.replace("[grt]\n", '[grt]\nrecurrence_checkpoint = "step"\n') + "\n[compile]\nenable = true\n"
    assert text.count('mode = "selective"') == 1 and text.count("recurrence_checkpoint") == 1
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "grt_debug_gpu_recipe.toml").write_text(text)
    return folder


@pytest.mark.slow
def test_0_3_resumes_a_0_2_2_checkpoint_with_the_gpu_step_code(resumed_under_0_2, module_tmp):
    """Resume, activation checkpointing and compile on 0.3 in one run: the recomputation is
    exact and the compiled step stays within the hosts' tolerance of the eager golden run.

    Compiled with `aot_eager_decomp_partition` (tests/infra/test_presets.py's COMPILE_BACKEND):
    dynamo's graphs, AOTAutograd's joint graphs, the decompositions and the min-cut partitioner
    that inductor runs, which is where 0.3's compile wiring and selective AC meet, without
    inductor's C++ code generation, which GPUs never run (they take Triton) and which took 50
    of this test's 78 s in CI. Inductor itself compiles the trainer on the GPU
    (benchmarks/gpu/suite.py)."""
    tmp = module_tmp("host_0_3")
    dump = tmp / "back_to_0_3"
    shutil.copytree(resumed_under_0_2 / "checkpoint" / "step-15", dump / "checkpoint" / "step-15")
    configs = {"GRT_TRAIN_CONFIGS": str(gpu_recipe(tmp / "configs"))}
    proc = run_0_3(
        dump,
        "--checkpoint.enable",
        "--compile.backend",
        "aot_eager_decomp_partition",
        config="grt_debug_gpu_recipe",
        env=configs,
    )
    log = (dump.parent / "back_to_0_3.log").read_text()
    assert "Applied SelectiveAC" in log and "Compiled the recurrence step once" in log, proc.stdout[-2000:]
    assert "unverified" not in log  # 0.2.2's checksums, verified on 0.3
    assert mg.scalars(dump) == pytest.approx(GOLDEN["losses"][15:], rel=HOST_REL)
