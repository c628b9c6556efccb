"""Bad configs through the real entry point (`python -m grt_titan.train`, one process): the
run stops at start-up, before the model is built, with a message naming the key and what is
allowed, and the traceback ends in grt_titan's or torchtitan's config code, not deep inside
torch (docs/reliability.md, "Config validation"). The checks themselves, in process:
tests/test_config_checks.py.

A finished run is extended: from a full last save it resumes at the next step; from the
model-only last save torchtitan makes by default (`[checkpoint] last_save_model_only`) it
stops with one line, instead of DCP's `Missing key in checkpoint state_dict`.
"""

from __future__ import annotations

import re

import pytest

from grt_test_helpers import DEBUG_TOML, REGISTERED_CONVERTERS, one_process


def launch(tmp_path, *overrides, env=None, config=DEBUG_TOML):
    """`python -m grt_titan.train` as one process (rank 0 of 1, or of NGPU on the fake backend)."""
    return one_process(
        [
            "--job.config_file",
            str(config),
            "--job.dump_folder",
            str(tmp_path / "run"),
            "--training.seq_len",
            "64",
            "--training.local_batch_size",
            "2",
            "--validation.no-enable",
            "--metrics.no-enable-tensorboard",
            *overrides,
        ],
        env=env,
    )


FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.MULTILINE)


RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.MULTILINE)


def assert_clear_failure(proc, *patterns):
    output = RANK_PREFIX.sub("", proc.stdout + proc.stderr)  # torch prefixes rank errors
    assert proc.returncode != 0, output[-2000:]
    assert "Training starts" not in output and "Applied FSDP" not in output  # failed before building
    frames = FRAME.findall(output)
    assert frames, output[-2000:]
    last = frames[-1]
    # The raising frame is plugin or torchtitan config code, never torch internals.
    assert "/grt_titan/" in last or "/torchtitan/" in last, last
    assert "/site-packages/torch/" not in last, last
    final = [line for line in output.splitlines() if re.match(r"^[\w.]*(Error|Exception):", line)]
    assert final, output[-2000:]
    for pattern in patterns:
        assert re.search(pattern, output), (pattern, output[-2000:])


# One case per place a start-up error is raised: the model args' checks (each message is pinned
# in process by tests/test_config_checks.py, which also covers the unknown flavor and R < 1),
# the data loader, and the parallel plan on a fake-backend mesh.
ENTRY_CASES = {
    "seq_len>positions": (
        ["--training.seq_len", "2048"],
        {},
        [r"\[training\] seq_len = 2048 exceeds", r"max_seq_len = 1024"],
    ),
    # Raised by the data loader, which torchtitan builds before the model args.
    "missing_dataset": (
        ["--training.dataset", "/nonexistent/grt-data"],
        {},
        [r"\[training\] dataset = '/nonexistent/grt-data': no such file", r"prepared dataset folder"],
    ),
    # 3 fake ranks: a TP degree torchtitan's mesh accepts but the 4-head flavor cannot split.
    "tp_vs_heads": (
        ["--comm.mode", "fake_backend", "--parallelism.tensor_parallel_degree", "3", "--training.seq_len", "96"],
        {"NGPU": "3"},
        [r"tensor_parallel_degree = 3 must divide the flavor's n_heads = 4; allowed: 1, 2, 4"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENTRY_CASES))
def test_entry_point_fails_clearly(name, tmp_path):
    overrides, env, patterns = ENTRY_CASES[name]
    proc = launch(tmp_path, *overrides, env=env)
    assert_clear_failure(proc, *patterns)


@pytest.mark.slow
def test_entry_point_reports_toml_problems_together(tmp_path):
    text = DEBUG_TOML.read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(
        text.replace('\ndtype = "float32"', '\ndtype = "fp32"').replace(
            'mixed_precision_param = "float32"', 'mixed_precision_param = "bf16"'
        )
    )
    proc = launch(tmp_path, config=bad)
    assert_clear_failure(
        proc,
        r"invalid job config:\n",
        r"  - \[training\] dtype = 'fp32' is invalid; allowed: 'bfloat16', 'float32'",
        r"  - \[training\] mixed_precision_param = 'bf16' is invalid; allowed: 'bfloat16', 'float32'",
    )


@pytest.mark.slow
def test_unknown_converter_through_the_entry_point(tmp_path):
    proc = launch(tmp_path, "--model.converters", "float8", "--training.steps", "1")
    assert_clear_failure(
        proc,
        r"ValueError: invalid job config: \[model\] converters: unknown converter "
        r"'float8' \(did you mean 'quantize\.linear\.float8'\?\); allowed: " + re.escape(REGISTERED_CONVERTERS),
    )
    assert "KeyError" not in proc.stdout + proc.stderr


# ---- extend a finished run ----------------------------------------------------------------

RUN = ["--checkpoint.enable", "--checkpoint.interval", "4", "--metrics.log_freq", "1"]


@pytest.mark.slow
def test_extending_a_finished_run(tmp_path):
    """4 steps saved in full (last_save_model_only = false) -> extended to 8 (default: the last
    save is model-only) resumes at step 5 -> extended to 10 stops at start-up, naming the key
    and the full step-4 checkpoint, with no DCP traceback."""
    first = launch(tmp_path, *RUN, "--training.steps", "4", "--checkpoint.no-last_save_model_only")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]

    second = launch(tmp_path, *RUN, "--training.steps", "8")
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert "Training starts at step 5" in out and re.search(r"step:\s+8\s", out), out[-3000:]

    third = launch(tmp_path, *RUN, "--training.steps", "10")
    path = re.escape(str(tmp_path / "run" / "checkpoint" / "step-8"))
    assert_clear_failure(
        third,
        rf"ValueError: invalid job config: \[checkpoint\] last_save_model_only: {path} "
        r"holds only the model weights",
        r"--checkpoint\.load_step 4, or start from these weights",
    )
    assert "Missing key" not in third.stdout + third.stderr
