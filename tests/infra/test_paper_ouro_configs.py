"""train_configs/paper/*_ouro.toml: the GRT recipe of the same scale with Ouro's parts."""

import tomllib

import pytest
from torchtitan.protocols.train_spec import get_train_spec

import grt_titan  # noqa: F401  registers the spec
from grt_test_helpers import REPO, parse_config
from grt_titan.model.model import build_meta_model

SCALES = ("small", "medium", "large")
OURO_PARTS = {
    "depth_sampling": "fixed", "injection": "none", "update": "overwrite", "state_noise_std": 0.0,
    "gate_noise_std": 0.0, "objective": "exit_distribution", "exit_entropy_weight": 0.05,
    "exit_threshold": 1.0,
}


@pytest.mark.parametrize("scale", SCALES)
def test_ouro_config_is_the_grt_recipe_with_ouro_parts(scale):
    path = REPO / "train_configs" / "paper" / f"{scale}_ouro.toml"
    ouro = tomllib.loads(path.read_text())
    grt = tomllib.loads((REPO / "train_configs" / f"grt_{scale}.toml").read_text())
    assert ouro["grt"] == {"num_recurrences": grt["grt"]["num_recurrences"], **OURO_PARTS}
    assert ouro["job"]["dump_folder"] == f"./outputs/paper/{scale}_ouro"
    for section in set(grt) | set(ouro):
        if section not in ("grt", "job"):
            assert ouro.get(section) == grt.get(section), section  # the recipe, unchanged

    config = parse_config(path=path)
    args = get_train_spec("grt").model_args[config.model.flavor].replace()
    args.update_from_config(config)
    assert args.method_name == "Ouro"
    model = build_meta_model(args)
    assert model.exit_gate is not None
    nparams, flops = args.get_nparams_and_flops(model, config.training.seq_len)
    # Training reads every step out: more FLOPs than the same layout's final-step loss.
    plain = args.replace(objective="final")
    assert nparams > 0 and flops > plain.train_flops_per_token(config.training.seq_len)
