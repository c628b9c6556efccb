"""End to end: a short grt_debug run through torchtitan's Trainer on 2 CPU ranks (FSDP 2,
gloo) trains, logs torchtitan's and the recurrence's metrics and the depth-wise validation
and writes its run record; `grt-titan analyze` reads its sharded checkpoint and `grt-titan
table` its record and events (here, not in tests/analysis/, so that one training run serves
all). The README's own 2-rank command runs in tests/docs."""

import json
import math

import pytest

from grt_titan.cli import main as cli_main

from components_helpers import check_analysis_output
from grt_test_helpers import step_losses

CONFIG = "train_configs/grt_debug.toml"


@pytest.fixture(scope="module")
def trained_run(module_tmp):
    """20 steps of grt_debug on 2 ranks at the golden run's size (global batch 4 of 64 tokens,
    tests/golden/make_golden.py), logs every 5, validation at steps 1 and 20, model-only
    checkpoint."""
    from grt_test_helpers import torchrun

    tmp = module_tmp("grt_debug_run")
    proc = torchrun(
        2,
        [
            "--job.config_file",
            CONFIG,
            "--job.dump_folder",
            str(tmp / "run"),
            "--training.steps",
            "20",
            "--training.local_batch_size",
            "2",
            "--training.seq_len",
            "64",
            "--validation.freq",
            "20",
            "--validation.local_batch_size",
            "4",
            "--validation.seq_len",
            "64",
            "--validation.steps",
            "1",
            "--checkpoint.enable",
            "--checkpoint.interval",
            "20",
            "--checkpoint.last_save_model_only",
        ],
        tmp,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return tmp / "run", output


@pytest.mark.slow
def test_training_logs_recurrence_metrics_and_depthwise_validation(trained_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, output = trained_run
    assert "Applied FSDP to the GRT" in output
    assert "grt  r: " in output and "loss by depth r: 0: " in output
    losses = step_losses(output)
    assert sorted(losses) == [1, 5, 10, 15, 20]
    # From ln(4097) = 8.3 at init towards the unigram plateau in 20 steps (the golden run of
    # this size: 8.33 -> 6.66).
    assert losses[1] > 8.0 and losses[20] < losses[1] - 1.2
    (events,) = list((run / "tb").rglob("events.out.tfevents.*"))  # rank 0's only
    acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])

    def values(tag):
        return {e.step: e.value for e in acc.Scalars(tag)} if tag in scalars else {}

    for tag in ("loss_metrics/global_avg_loss", "tflops", "throughput(tps)", "grt/r_mean"):
        assert tag in scalars, tag
    assert "mfu(%)" not in scalars  # no peak FLOP rate on CPU (docs/training.md)
    # The depth is drawn per step, the same on both ranks (tests/infra/test_train_cpu.py).
    r_means = values("grt/r_mean")
    assert all(1 <= v <= 4 for v in r_means.values()) and len(set(r_means.values())) > 1

    # Recurrence metrics exactly on the log steps, for the steps each logged forward ran.
    r = values("grt/r")
    assert sorted(r) == [1, 5, 10, 15, 20] and all(1 <= v <= 4 for v in r.values())
    assert r == values("grt/r_last")  # no gradient accumulation: one forward per step
    for name in ("gate_mean", "gate_std", "gate_copy_frac", "gate_write_frac", "update_ratio"):
        for i in range(1, 5):
            assert sorted(values(f"grt_{name}/step{i}")) == [s for s, d in r.items() if i <= d], (name, i)
    gate = values("grt_gate_mean/step1")
    assert all(0.9 < g < 1.0 for g in gate.values())  # bias +4 at init: g ~ 0.98

    # Depth-wise validation at steps 1 and 20; the plain loss is the eval depth's (R = 4).
    for rr in (0, 1, 2, 3, 4, 6):
        assert sorted(values(f"validation_metrics/loss_r{rr}")) == [1, 20]
        assert f"validation_metrics/flops_per_token_r{rr}" in scalars
    assert values("validation_metrics/loss") == values("validation_metrics/loss_r4")
    images = acc.Images("validation_metrics/depth_curve")
    assert [i.step for i in images] == [1, 20]


@pytest.mark.slow
def test_the_run_record_and_the_table_of_a_trained_run(trained_run, capsys):
    run, _ = trained_run
    record = json.loads((run / "grt_run.json").read_text())
    assert (record["label"], record["flavor"], record["config_file"]) == ("GRT", "debug", CONFIG)
    assert record["model_args"]["num_recurrences"] == 4 and record["model_args"]["dim"] == 128
    assert (record["seq_len"], record["global_batch_size"], record["world_size"]) == (64, 4, 2)
    assert record["job_config"]["training"]["steps"] == 20
    assert not list(run.glob(".grt_run.json.tmp*"))

    assert cli_main(["table", str(run)]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("| GRT |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["GRT", "1+2x4+1", "4", "10"] and cells[7:] == ["20", "1"]
    assert math.isfinite(float(cells[6])) and float(cells[6]) < 7.8  # trained: below ln(4097) = 8.3


@pytest.mark.slow
def test_analyze_an_hf_export(trained_run, tmp_path):
    pytest.importorskip("grt_titan.hf.export")
    run, _ = trained_run
    export = tmp_path / "export"
    assert (
        cli_main(
            ["export-hf", "--checkpoint", str(run / "checkpoint" / "step-20"), "--config", CONFIG, "--out", str(export)]
        )
        == 0
    )
    out = tmp_path / "analysis"
    assert (
        cli_main(
            [
                "analyze",
                str(export),
                "--out",
                str(out),
                "--seq-len",
                "64",
                "--num-sequences",
                "2",
                "--batch-size",
                "2",
                "--no-progress",
                "--prompt",
                "Hello",
                "--no-halting",  # the two routes' fixed-depth numbers are compared
            ]
        )
        == 0
    )
    result = check_analysis_output(out, num_recurrences=4, max_depth=6)
    assert result["model"]["kind"] == "hf_export"
    ckpt = tmp_path / "from_ckpt"
    assert (
        cli_main(
            [
                "analyze",
                str(run / "checkpoint"),
                "--config",
                CONFIG,
                "--out",
                str(ckpt),
                "--seq-len",
                "64",
                "--num-sequences",
                "2",
                "--batch-size",
                "2",
                "--no-progress",
                "--prompt",
                "Hello",
                # One rule: the sweep's wiring on a real checkpoint (each rule's numbers:
                # tests/analysis); its forwards are its own, the fixed-depth numbers unchanged.
                "--halting-rules",
                "state",
            ]
        )
        == 0
    )
    same = check_analysis_output(ckpt, num_recurrences=4, max_depth=6)
    assert same["model"]["kind"] == "checkpoint" and same["model"]["step"] == 20
    # Trained for 20 steps: well below the initial ln(4097) = 8.3.
    assert all(loss < 7.8 for loss in same["early_exit"]["loss"])
    # The same weights by either route: the same numbers (fp32 export, same data).
    assert result["early_exit"]["loss"] == pytest.approx(same["early_exit"]["loss"], rel=1e-5)
