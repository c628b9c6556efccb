"""The Mixture-of-Recursions rows of table 1 (train_configs/paper/*_mor.toml): each parses, builds
on the meta device as MoR, and keeps its GRT twin's recipe (only [grt], flavor and folder differ)."""

import dataclasses

import pytest
from torchtitan.protocols.train_spec import get_train_spec

import grt_titan  # noqa: F401  registers the spec
from grt_test_helpers import REPO, parse_config
from grt_titan.model.model import build_meta_model

# table 1 row -> (GRT twin's TOML, layout p + n x R + c)
ROWS = {
    "small_mor": ("grt_small", (1, 1, 10, 1)),
    "medium_mor": ("grt_medium", (2, 5, 4, 2)),
    "large_mor": ("grt_large", (1, 5, 6, 5)),
    "medium_isoparams_mor": ("grt_medium_isoparams", (2, 20, 4, 2)),
    "large_isoparams_mor": ("grt_large_isoparams", (3, 30, 6, 3)),
}


@pytest.mark.parametrize("row", sorted(ROWS))
def test_mor_row_builds_and_keeps_the_recipe(row):
    twin, (p, n, R, c) = ROWS[row]
    config = parse_config(path=REPO / "train_configs" / "paper" / f"{row}.toml")
    args = get_train_spec("grt").model_args[config.model.flavor].replace()
    args.update_from_config(config)
    assert args.method_name == "MoR" and args.router == "expert_choice"
    assert (args.n_prelude_layers, args.n_core_layers, args.num_recurrences, args.n_coda_layers) == (p, n, R, c)
    assert args.router_capacities == tuple((R - i) / R for i in range(R))
    assert (args.router_scale, args.router_aux_weight) == (0.1, 0.001)
    model = build_meta_model(args)
    assert not any(".proj." in k or ".gate." in k for k, _ in model.named_parameters())
    assert config.job.dump_folder == f"./outputs/{row}"

    recipe = dataclasses.asdict(config)
    reference = dataclasses.asdict(parse_config(path=REPO / "train_configs" / f"{twin}.toml"))
    for cfg in (recipe, reference):
        del cfg["grt"], cfg["job"]["dump_folder"], cfg["job"]["description"], cfg["job"]["config_file"]
    assert recipe == reference
