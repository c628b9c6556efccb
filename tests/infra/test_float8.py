"""Float8 through torchtitan's converter (torchao, emulated on CPU).

Block styles: float8 swaps linears, whatever block holds them, so the FSDP training run stays
on the paper's gpt2 blocks (grt_debug), and qwen3 blocks get what is their own: the
conversion of their linears (SwiGLU's w3; q_norm / k_norm are not linears) and the float8 TP
plan, torchao's Float8 styles on torchtitan's qwen3 block plan with its head-sharded q, k, v
(the fake-backend test, which ran gpt2 blocks before: the parallel matrix's float8 corner,
tests/infra/test_parallel_matrix.py, runs gpt2's float8 TP plan with the same float8
all-gather at TP 4, so no gpt2 path lost a test).
"""

import json
import re

import pytest
import torchtitan.components.quantization  # noqa: F401  registers the float8 converter
from torch import nn
from torchtitan.protocols.model_converter import build_model_converters

import grt_titan.spec  # noqa: F401  registers the spec
from grt_titan.model import grt_flavors
from grt_titan.model.model import build_meta_model

from grt_test_helpers import ANSI, dense_teacher_args, one_process, one_rank_dims, parse_config, step_losses


def converted_fqns(*overrides, block_style: str = "gpt2") -> tuple[set[str], set[str]]:
    config = parse_config(
        "--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate", *overrides
    )
    model = build_meta_model(grt_flavors["debug"].replace(block_style=block_style))
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    build_model_converters(config, one_rank_dims()).convert(model)
    from torchao.float8.float8_linear import Float8Linear

    return linears, {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}


@pytest.mark.parametrize("block_style", ["gpt2", "qwen3"])
def test_float8_converts_block_projection_and_gate_linears(block_style):
    linears, converted = converted_fqns(block_style=block_style)
    # Every linear but the LM head (4097 outputs is not a multiple of 16).
    assert converted == linears - {"output"}
    assert {"recurrence.step.proj", "recurrence.step.gate.w_in", "recurrence.step.gate.w_out"} <= converted
    assert "recurrence.step.core.layers.0.attention.wq" in converted
    if block_style == "qwen3":
        assert "recurrence.step.core.layers.0.feed_forward.w3" in converted


def test_float8_filter_fqns_keeps_the_gate_high_precision():
    linears, converted = converted_fqns("--quantize.linear.float8.filter_fqns", "gate")
    assert not any("gate" in n for n in converted)
    assert converted == {n for n in linears if "gate" not in n and n != "output"}


@pytest.mark.slow
def test_float8_emulated_trains_like_float32_on_two_fsdp_ranks(tmp_path):
    """The golden run's recipe (grt_debug, FSDP 2, float32, 20 steps; tests/golden/make_golden.py)
    with float8 linears ends within 2% of the golden float32 losses, which
    tests/infra/test_golden_losses.py holds the float32 run to (one float8 run, no float32 twin)."""
    from tests.golden import make_golden

    golden = json.loads(make_golden.GOLDEN.read_text())["variants"]["fsdp2"]["losses"]
    # The float8 run has a teacher at alpha 0 (docs/distillation.md): the student's converters
    # make its linears float8 too, FSDP-sharded; alpha 0 trains on the CE alone (exactly as
    # without a teacher), so the comparison with float32 stands, and the KD term is logged.
    teacher = ["--distill.alpha", "0", *dense_teacher_args(tmp_path / "teacher")]
    float8 = ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate", *teacher]
    proc = make_golden.torchrun(2, make_golden.run_args(2, tmp_path / "float8", float8), tmp_path / "float8-log")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Swapped to Float8Linear" in output
    losses = make_golden.scalars(tmp_path / "float8")
    assert len(losses) == make_golden.STEPS and golden[-1] < golden[0] - 1.5  # both train
    assert losses[-1] == pytest.approx(golden[-1], rel=0.02)
    plain = ANSI.sub("", output)
    assert "frozen, sharded like the student (FSDP 2)" in plain
    kd = [float(v) for v in re.findall(r"distill  kd: (\S+)", plain)]
    assert len(kd) == make_golden.STEPS and all(0 < v < 20 for v in kd), kd  # the teacher ran every step


@pytest.mark.slow
def test_float8_tensor_parallel_builds_and_steps_on_fake_backend(tmp_path):
    """gloo cannot run float8 TP; the fake backend checks plans, shapes and a full step.
    qwen3 blocks: torchao's Float8 TP styles on the qwen3 plan (module docstring). With a
    teacher, converted and sharded the same way (its gpt2 blocks' float8 TP plan)."""
    proc = one_process(
        [
            "--job.config_file",
            "train_configs/grt_debug.toml",
            "--grt.block_style",
            "qwen3",
            "--comm.mode",
            "fake_backend",
            "--job.dump_folder",
            str(tmp_path),
            "--parallelism.data_parallel_shard_degree",
            "4",
            "--parallelism.tensor_parallel_degree",
            "2",
            "--model.converters",
            "quantize.linear.float8",
            "--quantize.linear.float8.emulate",
            "--quantize.linear.float8.enable_fsdp_float8_all_gather",
            "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
            *dense_teacher_args(tmp_path / "teacher"),  # float8 too, FSDP 4 x TP 2 with float8 all-gather
            "--training.steps",
            "2",
            "--training.seq_len",
            "64",
            "--validation.no-enable",
            "--metrics.no-enable-tensorboard",
            "--metrics.log_freq",
            "1",
        ],
        env={"NGPU": "8", "WORLD_SIZE": "8"},
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Applied Float8 tensorwise Tensor Parallelism to the GRT" in output
    assert sorted(step_losses(output)) == [1, 2]
    assert "frozen, sharded like the student (FSDP 4 x TP 2)" in ANSI.sub("", output)
    qwen3 = sum(p.numel() for p in build_meta_model(grt_flavors["debug"].replace(block_style="qwen3")).parameters())
    assert f"size: {qwen3:,} total parameters" in ANSI.sub("", output)  # the qwen3 model ran


@pytest.mark.slow
def test_core_weights_are_cast_once_per_step_whatever_the_depth(tmp_path):
    """FSDP float8 all-gather casts the core once; r calls of its Float8Linears reuse it."""
    import json

    out = tmp_path / "casts.json"
    proc = one_process([str(out)], module="tests.infra.float8_cast_worker", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    casts = json.loads(out.read_text())
    core_linears = 1 + 2 * 6 + 2  # W_proj, 2 core blocks x (wq, wk, wv, wo, w1, w2), gate w_in/w_out
    for depth in ("1", "4"):
        assert casts[depth]["all_gather:WEIGHT"] == core_linears  # cast once, when gathered
        assert "linear:WEIGHT" not in casts[depth]  # never re-cast by the r calls
    # Activations are cast per call, as they must be: r times as many.
    assert casts["4"]["linear:INPUT"] == 4 * casts["1"]["linear:INPUT"]
