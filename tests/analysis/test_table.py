"""`grt-titan table`: every column of synthetic runs (a run record + TensorBoard events)
against hand-computed values, seeds grouped, CSV, the ladder figure, errors. (A real
trained run: tests/components/test_observability_e2e.py.)"""

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from grt_titan.analysis import table
from grt_titan.analysis.runs import LOSS_TAG, find_run_dirs, load_run
from grt_titan.cli import main as cli_main
from grt_titan.model import grt_flavors
from grt_titan.run_record import RECORD_NAME, build_run_record, write_run_record

from grt_test_helpers import REPO, parse_config

V, S = 50257, 1024  # GPT-2 vocabulary, the paper's sequence length


def make_run(root, name, flavor, losses, *, seed=0, recurrences=None, timestamps=("20260101-0000",), extra=()):
    """A run folder as training leaves it: grt_run.json (from a real JobConfig of `flavor` at
    S = 1024, plus the command-line overrides `extra`) and TensorBoard events, `losses`
    {step: validation loss} split over `timestamps` folders (a resumed run starts a new one);
    a training-loss scalar beside them."""
    from torch.utils.tensorboard import SummaryWriter

    run = root / name
    overrides = [
        "--job.dump_folder",
        str(run),
        "--model.flavor",
        flavor,
        "--training.seq_len",
        str(S),
        "--debug.seed",
        str(seed),
        "--grt.num_recurrences",
        str(recurrences or 4),
        *extra,
    ]
    jc = parse_config(*overrides)
    args = dataclasses.replace(grt_flavors[flavor])
    args.update_from_config(jc)
    write_run_record(run, build_run_record(jc, args, world_size=2, batch_degree=2))
    items = sorted(losses.items())
    for k, stamp in enumerate(timestamps):
        writer = SummaryWriter(str(run / "tb" / stamp))
        for step, loss in items[k :: len(timestamps)]:
            writer.add_scalar("loss_metrics/global_avg_loss", loss + 1.0, step)
            writer.add_scalar(LOSS_TAG, loss, step)
        writer.close()
    return run


def small_flops(d=768, p=1, n=1, c=1, R=10):
    """Paper eq. 1 + LM head at depth R, by hand."""
    return (p + n * R + c) * (24 * d * d + 4 * S * d) + R * 10 * d * d + 2 * d * V


def gpt2_params(d, blocks, recurrent):
    """Stored parameters of a gpt2-style model, counted from the architecture (tied head):
    a block is 4 biased d x d attention linears, 2 LayerNorms, a biased 4d MLP = 12 d^2 + 13 d;
    W_proj 2 d^2; gate 2 LayerNorms, w_in (2d -> d) and w_out (d -> d), biased = 3 d^2 + 6 d."""
    total = V * d + S * d + blocks * (12 * d * d + 13 * d) + 2 * d  # embeddings, blocks, final norm
    if recurrent:
        total += 2 * d * d + 3 * d * d + 6 * d
    return total


@pytest.fixture(scope="module")
def runs(module_tmp):
    root = module_tmp("runs")
    return {
        "dense": make_run(root, "small_dense", "dense_small", {10: 3.5, 20: 3.3}),
        "grt_a": make_run(
            root,
            "small_grt_seed0",
            "small",
            {10: 3.4, 20: 3.25, 30: 3.0},
            seed=0,
            recurrences=10,
            timestamps=("20260101-0000", "20260101-0100"),
        ),
        "grt_b": make_run(root, "small_grt_seed1", "small", {10: 3.4, 30: 3.2}, seed=1, recurrences=10),
        "no_val": make_run(root, "small_grt_noval", "small", {}, recurrences=6),
    }


def test_every_column_of_a_grt_and_a_dense_row(runs):
    dense, grt = table.build_rows([load_run(runs["dense"]), load_run(runs["grt_a"])])
    assert (grt.method, grt.layout, grt.unique_layers, grt.block_applications) == ("GRT", "1+1x10+1", 3, 12)
    assert (dense.method, dense.layout, dense.unique_layers, dense.block_applications) == ("dense", "12L", 12, 12)
    assert grt.flops_per_token == small_flops()
    assert dense.flops_per_token == 12 * (24 * 768**2 + 4 * S * 768) + 2 * 768 * V
    assert grt.flops_per_token / dense.flops_per_token == pytest.approx(1.21, abs=0.005)  # the paper's 1.21x
    assert grt.params == gpt2_params(768, 3, recurrent=True) == 63_602_688  # README: 63.6M
    assert dense.params == gpt2_params(768, 12, recurrent=False)
    # The last validation loss is the one at the largest step, over both tb/ folders.
    assert (grt.loss_mean, grt.steps, len(grt.scored), grt.loss_std) == (3.0, "30", 1, None)
    assert (dense.loss_mean, dense.steps) == (pytest.approx(3.3), "20")


def test_seeds_of_a_row_give_mean_std_and_n(runs):
    rows = table.build_rows([load_run(runs[k]) for k in ("grt_a", "dense", "grt_b")])
    assert [r.layout for r in rows] == ["1+1x10+1", "12L"]  # order of each row's first run
    grt = rows[0]
    assert [r.seed for r in grt.runs] == [0, 1] and len(grt.scored) == 2
    assert grt.loss_mean == pytest.approx(3.1)
    assert grt.loss_std == pytest.approx(math.sqrt(((3.0 - 3.1) ** 2 + (3.2 - 3.1) ** 2) / 1))  # n - 1 = 1
    assert "| GRT | 1+1x10+1 | 3 | 12 | 0.3438 | 63.6M | 3.1000 ± 0.1414 | 30 | 2 |" in table.markdown(rows)


def test_cli_prints_markdown_and_writes_csv_and_ladder(runs, tmp_path, capsys):
    out_csv, png = tmp_path / "table1.csv", tmp_path / "fig5.png"
    rc = cli_main(
        [
            "table",
            *(str(runs[k]) for k in ("dense", "grt_a", "grt_b", "no_val")),
            "--csv",
            str(out_csv),
            "--ladder-png",
            str(png),
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("| method | layout | unique layers | block applications | GFLOPs/token (fwd)")
    assert len(lines) == 2 + 3  # header, rule, dense, GRT (2 seeds), GRT at R = 6
    assert "| GRT | 1+1x6+1 | 3 | 8 |" in lines[4] and "| n/a | n/a | 0 |" in lines[4]
    assert f"{runs['no_val']}: validation loss n/a: no '{LOSS_TAG}' in the events" in err

    rows = list(csv.DictReader(out_csv.open()))
    assert list(rows[0]) == table.CSV_COLUMNS
    assert [r["layout"] for r in rows] == ["12L", "1+1x10+1", "1+1x6+1"]
    grt = rows[1]
    assert float(grt["forward_flops_per_token"]) == small_flops()
    assert int(grt["params"]) == 63_602_688 and int(grt["n"]) == 2 and grt["step"] == "30"
    assert float(grt["val_loss_mean"]) == pytest.approx(3.1) and float(grt["val_loss_std"]) == pytest.approx(
        0.1414, abs=1e-4
    )
    assert grt["runs"] == f"{runs['grt_a']};{runs['grt_b']}"
    assert rows[2]["val_loss_mean"] == rows[2]["val_loss_std"] == "" and rows[2]["n"] == "0"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ladder_figure_bars_and_dense_line():
    from grt_titan import plots

    fig = plots.ladder_figure(
        ["dense", "rung 2", "GRT"], [3.3, 3.6, 3.1], [0.0, 0.05, 0.0], dense_loss=3.3, dense_name="12L"
    )
    (ax,) = fig.axes
    assert [round(b.get_height(), 6) for b in ax.patches] == [3.3, 3.6, 3.1]
    (line,) = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert list(line.get_ydata()) == [3.3, 3.3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dense", "rung 2", "GRT"]


def test_a_run_without_a_record_needs_its_config(tmp_path, capsys):
    bare = tmp_path / "old_run"
    bare.mkdir()
    assert cli_main(["table", str(bare)]) == 2
    err = capsys.readouterr().err
    assert f"{bare} has no {RECORD_NAME}" in err and "retrain, or pass --config" in err

    # With the TOML: the model args through the same parsing as `grt-titan analyze --config`.
    assert cli_main(["table", str(bare), "--config", str(REPO / "train_configs" / "grt_debug.toml")]) == 0
    out, err = capsys.readouterr()
    assert "| GRT | 1+2x4+1 | 4 | 10 |" in out and "| n/a | n/a | 0 |" in out
    assert f"no TensorBoard folder {bare / 'tb'}" in err

    assert cli_main(["table", str(bare), "--config", "a.toml", "--config", "b.toml"]) == 2
    assert "2 --config given for 1 run(s)" in capsys.readouterr().err


def test_record_keys_unknown_and_missing(runs, tmp_path, capsys):
    record = json.loads((runs["dense"] / RECORD_NAME).read_text())
    future = tmp_path / "future"
    write_run_record(future, {**record, "model_args": {**record["model_args"], "halting_threshold": 0.5}})
    assert cli_main(["table", str(future)]) == 2
    err = capsys.readouterr().err
    assert f"{future / RECORD_NAME}: model_args key 'halting_threshold' is not a field of GRTModelArgs" in err

    older = tmp_path / "older"
    args = dict(record["model_args"])
    del args["gate_override"]
    write_run_record(older, {**record, "model_args": args})
    run = load_run(older)
    assert run.args.gate_override is None
    assert (
        f"{older / RECORD_NAME}: model_args has no 'gate_override' (an older record); using the default None"
        in capsys.readouterr().err
    )


def test_a_folder_of_runs_is_searched_below(runs, tmp_path, capsys):
    """`grt-titan table outputs/`: every folder below that holds grt_run.json, at any depth,
    in path order, each run once; a folder without any is an error naming it."""
    outputs = tmp_path / "outputs"
    dense = shutil.copytree(runs["dense"], outputs / "paper" / "small_dense_s0")
    seed0 = shutil.copytree(runs["grt_a"], outputs / "paper" / "seeds" / "small_grt_s0")
    seed1 = shutil.copytree(runs["grt_b"], outputs / "paper" / "seeds" / "small_grt_s1")
    (outputs / "scratch" / "tb").mkdir(parents=True)  # no run below: skipped
    assert find_run_dirs([outputs]) == [seed0, seed1, dense]
    assert find_run_dirs([dense, outputs / "paper", seed1]) == [dense, seed0, seed1]  # each once, first mention

    assert cli_main(["table", str(outputs)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2 + 2, out  # header, rule, GRT (2 seeds), dense
    assert "| GRT | 1+1x10+1 | 3 | 12 | 0.3438 | 63.6M | 3.1000 ± 0.1414 | 30 | 2 |" in lines[2]
    assert lines[3].startswith("| dense | 12L |")

    for empty in (outputs / "scratch", tmp_path / "nothing_here"):
        empty.mkdir(exist_ok=True)
        assert cli_main(["table", str(empty)]) == 2
        err = capsys.readouterr().err
        assert f"error: {empty} has no {RECORD_NAME}, nor any folder below it" in err, err
    assert cli_main(["table", str(tmp_path / "missing")]) == 2
    assert f"{tmp_path / 'missing'} is not a folder" in capsys.readouterr().err


POISSON = (
    "--grt.injection",
    "proj",
    "--grt.update",
    "overwrite",
    "--grt.initial_state",
    "random",
    "--grt.depth_sampling",
    "poisson_lognormal",
    "--grt.state_noise_std",
    "0",
    "--grt.gate_noise_std",
    "0",
)


def test_rows_of_one_method_show_the_settings_they_differ_in(module_tmp, runs, tmp_path, capsys):
    """Rows of one method that differ in a method setting (Poisson's mean depth and k, a GRT
    sweep, a token budget) name the differing keys only; other methods and rows differing in
    R or size only get none."""
    root = module_tmp("settings")
    made = [
        make_run(root, "poisson_m3", "small", {10: 3.6}, recurrences=10, extra=(*POISSON, "--grt.depth_mean", "3")),
        make_run(root, "poisson_m5", "small", {10: 3.5}, recurrences=10, extra=(*POISSON, "--grt.depth_mean", "5")),
        make_run(
            root,
            "poisson_m5_k4",
            "small",
            {10: 3.4},
            recurrences=10,
            extra=(*POISSON, "--grt.depth_mean", "5", "--grt.backprop_recurrences", "4"),
        ),
        make_run(root, "grt_tau2", "small", {10: 3.3}, recurrences=10, extra=("--grt.gate_temperature", "2.0")),
        make_run(
            root,
            "grt_tau2_long",
            "small",
            {10: 3.3},
            recurrences=10,
            extra=("--grt.gate_temperature", "2.0", "--training.steps", "40"),
        ),
    ]
    rows = table.build_rows([load_run(r) for r in (runs["grt_a"], runs["grt_b"], runs["no_val"], runs["dense"], *made)])
    titles = [r.title for r in rows]
    # The debug TOML's training.steps (make_run keeps it) beside the one run at 40 steps.
    steps = load_run(runs["grt_a"]).record["training_steps"]
    assert steps != 40
    grt = ("GRT (gate_temperature=1.0, training_steps={})", "GRT (gate_temperature=2.0, training_steps={})")
    assert titles == [
        grt[0].format(steps),  # seeds 0 and 1
        grt[0].format(steps),  # R = 6: the layout tells it apart, no setting
        "dense",
        "Heavy-tail Poisson (backprop_recurrences=None, depth_mean=3.0)",
        "Heavy-tail Poisson (backprop_recurrences=None, depth_mean=5.0)",
        "Heavy-tail Poisson (backprop_recurrences=4, depth_mean=5.0)",
        grt[1].format(steps),
        grt[1].format(40),
    ]
    assert [r.method for r in rows][3:6] == ["Heavy-tail Poisson"] * 3  # the label itself is unchanged
    assert rows[0].settings == {"gate_temperature": 1.0, "training_steps": steps}

    out_csv = tmp_path / "t.csv"
    assert cli_main(["table", str(root), "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert "| Heavy-tail Poisson (backprop_recurrences=4, depth_mean=5.0) | 1+1x10+1 |" in out
    assert "| GRT (training_steps=40) | 1+1x10+1 |" in out  # among these runs only the budget differs
    by_run = {Path(r["runs"]).name: r for r in csv.DictReader(out_csv.open())}
    assert by_run["poisson_m3"]["method"] == "Heavy-tail Poisson"
    assert by_run["poisson_m3"]["settings"] == "backprop_recurrences=None, depth_mean=3.0"
    assert by_run["grt_tau2"]["settings"] == f"training_steps={steps}"


def test_fault_tolerant_runs_show_live_groups_by_step(runs, tmp_path, capsys):
    """A run with [fault_tolerance]: its replica group's events (tb/<stamp>/replica_<id>/), the
    group killed after step 6 and healed at step 10 (a new start, its counter from 0 again),
    read back as spans of live groups and the steps not committed over both starts. A run
    without fault tolerance adds no section."""
    from torch.utils.tensorboard import SummaryWriter

    from grt_titan.analysis import live_groups

    ft = ["--fault_tolerance.enable", "--fault_tolerance.group_size", "3", "--fault_tolerance.replica_id", "1"]
    run = make_run(tmp_path, "ft_run", "debug", {12: 6.0}, extra=[*ft, "--metrics.log_freq", "1"])
    starts = {  # stamp: [(step, live groups, uncommitted so far)]
        "20260101-0000": [(1, 3, 0), (2, 3, 0), (3, 2, 1), (4, 2, 1), (5, 2, 1), (6, 3, 1)],
        "20260101-0100": [(10, 3, 0), (11, 3, 1), (12, 3, 1)],
    }
    for stamp, steps in starts.items():
        writer = SummaryWriter(str(run / "tb" / stamp / "replica_1"))
        for step, live, uncommitted in steps:
            writer.add_scalar(live_groups.LIVE_TAG, live, step)
            writer.add_scalar(live_groups.UNCOMMITTED_TAG, uncommitted, step)
        writer.close()

    (history,) = live_groups.group_histories(load_run(run))
    assert (history.replica_id, history.group_size, history.uncommitted) == (1, 3, 2)
    assert history.spans == "3 at 1-2, 2 at 3-5, 3 at 6, 3 at 10-12"
    assert live_groups.live_spans([(10, 2), (20, 2), (40, 2)], 10) == "2 at 10-20, 2 at 40"
    assert live_groups.group_histories(load_run(runs["dense"])) == []

    assert cli_main(["table", str(runs["dense"]), str(run)]) == 0
    out = capsys.readouterr().out
    assert "Fault tolerance: replica groups live at each logged step" in out
    assert "| ft_run | 1 | 3 | 3 at 1-2, 2 at 3-5, 3 at 6, 3 at 10-12 | 2 |" in out
    assert cli_main(["table", str(runs["dense"])]) == 0
    assert "Fault tolerance" not in capsys.readouterr().out
    # Trained with fault tolerance but without TensorBoard: said, not silently left out.
    quiet = make_run(tmp_path, "ft_no_tb", "debug", {}, extra=ft)
    assert cli_main(["table", str(quiet)]) == 0
    out, err = capsys.readouterr()
    assert "Fault tolerance" not in out
    assert f"{quiet}: trained with [fault_tolerance] but no 'fault_tolerance/live_groups' events" in err
