"""train_configs/paper/: one TOML per table 1 row and figure 5 rung, each the paper's recipe
(its preset's, to the key) with only its method's parts changed; each builds, and every
distinct set of parts trains on 2 CPU ranks from its TOML at debug size."""

import pytest
import tomli

from grt_titan.model.methods.table import LADDER, SCSE, TABLE_1, paper_method
from grt_titan.model.model import build_meta_model
from grt_titan.run_reader import load_model_args

from grt_test_helpers import REPO, step_losses
from tests.cases import PAPER_CONFIGS, cpu_scale_overrides, paper_configs

CONFIGS = paper_configs()


def model_args(path):
    """The flavor's args after the TOML's [grt] overrides and the start-up checks."""
    return load_model_args(path)[0]


def base_preset(path):
    flavor = tomli.loads(path.read_text())["model"]["flavor"]
    name = {"small_core_only": "grt_small"}.get(flavor) or (flavor if flavor.startswith("dense_") else f"grt_{flavor}")
    return REPO / "train_configs" / f"{name}.toml"


def test_every_row_and_rung_has_a_toml():
    names = {p.stem for p in CONFIGS}
    # All but MoR token choice; SCSE (not the GRT paper's) at the small size only.
    rows = [row.config for row in TABLE_1 if row.config is not None and row is not SCSE]
    assert sorted(rows) == ["dense", "grt", "mor", "ouro", "poisson", "rrt"]
    for size in ("small", "medium", "large"):
        assert {f"{size}_{row}" for row in rows} <= names
    assert "small_scse" in names and not {"medium_scse", "large_scse"} & names
    # table 1's isoParams rows: MoR, heavy-tail Poisson and GRT at medium and large
    assert {f"{size}_isoparams_{row}" for size in ("medium", "large") for row in ("mor", "poisson", "grt")} <= names
    assert (
        sorted(n for n in names if n.startswith("ladder_"))
        == [rung.config for rung in LADDER]
        == [
            "ladder_1_dense",
            "ladder_2_recurrence",
            "ladder_3_prelude_coda",
            "ladder_4_noise",
            "ladder_5_reinjection",
            "ladder_6_gate",
        ]
    )


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_row_is_its_presets_recipe_with_only_the_parts_changed(path):
    row, preset = tomli.loads(path.read_text()), tomli.loads(base_preset(path).read_text())
    # Every row dumps into its own folder under outputs/paper/ (docs/paper_suite.md), named for the row.
    assert row["job"]["dump_folder"] == f"./outputs/paper/{path.stem}"
    for toml in (row, preset):
        toml["job"].pop("dump_folder"), toml["job"].pop("description")
        toml["model"].pop("flavor")
        toml.pop("grt", None)
    assert row == preset


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_row_builds_and_is_the_method_it_names(path):
    args = model_args(path)
    row = paper_method(path.stem)  # the row of grt_titan/model/methods/table.py this TOML trains
    assert args.method_name == row.name
    # The TOML sets its row's parts and the paper's settings of the row.
    assert {k: getattr(args, k) for k in {**row.parts, **row.settings}} == {**row.parts, **row.settings}
    if args.router == "expert_choice":  # MoR rows: the released code's update (docs/mor.md)
        assert args.router_update == "block"
    # Every row has the dense twin's number of block applications (table 1's isoFLOP sense).
    dense = {"small": 12, "medium": 24, "large": 36}
    size = "small" if path.stem.startswith("ladder_") else path.stem.split("_")[0]
    if "isoparams" not in path.stem:
        assert args.unrolled_layers == dense[size]
    assert sum(p.numel() for p in build_meta_model(args).parameters()) > 0


def test_ladder_rungs_add_one_component_each():
    rungs = [
        model_args(PAPER_CONFIGS / f"{name}.toml")
        for name in (
            "ladder_2_recurrence",
            "ladder_3_prelude_coda",
            "ladder_4_noise",
            "ladder_5_reinjection",
            "ladder_6_gate",
        )
    ]

    def parts(a):
        return dict(
            prelude_coda=(a.n_prelude_layers, a.n_coda_layers) != (0, 0),
            noise=a.state_noise_std > 0,
            injection=a.injection == "proj",
            gate=a.update == "gate",
        )

    for before, after in zip(rungs, rungs[1:]):
        changed = [k for k in parts(before) if parts(before)[k] != parts(after)[k]]
        assert len(changed) == 1 and parts(after)[changed[0]], (before.method_name, after.method_name)
    assert all(r.depth_sampling == "uniform" for r in rungs)  # only the named component changes


# Rows whose parts train nowhere else on 2 ranks: the core-only layout (no prelude or coda) and
# MoR's released update (`router_update = "block"`, set only by the MoR TOMLs). Every other
# row's parts train on 2 ranks from the same [grt] values: GRT (grt_debug.toml, everywhere),
# dense (dense_debug), Poisson, RRT and SCSE (test_method_parity.py), Ouro (test_ouro_parallel.py),
# and ladder rungs 3-5 are GRT's parts less the gate (Poisson's overwrite update) or less
# re-injection (RRT's); test_row_builds_and_is_the_method_it_names ties each TOML to its parts.
TRAINED_ROWS = ["ladder_2_recurrence", "small_mor"]


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED_ROWS)
def test_row_trains_on_two_cpu_ranks_from_its_toml(name, run_torchrun, tmp_path):
    args = cpu_scale_overrides(PAPER_CONFIGS / f"{name}.toml", steps=3, dump_folder=tmp_path / "run")
    args += ["--metrics.log_freq", "1", "--metrics.no-enable-tensorboard", "--validation.no-enable"]
    proc = run_torchrun(2, args, tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    losses = step_losses(output)
    assert list(losses) == [1, 2, 3] and all(5 < loss < 12 for loss in losses.values()), output[-2000:]
