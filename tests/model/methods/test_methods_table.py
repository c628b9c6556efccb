"""The table of methods (grt_titan/model/methods/table.py): every row of table 1 and rung of figure 5
is a named set of parts, and `GRTModelArgs.method_name` is a lookup in it. The paper's TOMLs
against the table: tests/infra/test_paper_configs.py; the HF config: tests/hf/test_hf_parts.py."""

import pytest

from grt_titan.model import grt_flavors
from grt_titan.model.args import GRT_PARTS
from grt_titan.model.methods.table import (
    GRT,
    LADDER,
    LADDER_COMPONENTS,
    METHODS,
    POISSON,
    TABLE_1,
    ladder_components,
    paper_method,
)


def row_args(row):
    """The row's parts on the debug flavor (R = 4), validated: a model the tests can build."""
    args = grt_flavors["debug"].replace(**row.parts)
    args.validate()
    return args


@pytest.mark.parametrize("row", METHODS + LADDER, ids=lambda row: f"{row.config}:{row.name}")
def test_every_row_is_named_by_its_own_parts(row):
    assert set(row.key) <= set(row.parts)
    assert row_args(row).method_name == row.name
    # With the paper's settings too (Poisson's truncation k = 8 needs R >= 8).
    depth = {"num_recurrences": 8} if "backprop_recurrences" in row.settings else {}
    assert grt_flavors["debug"].replace(**row.parts, **row.settings, **depth).method_name == row.name


def test_names_and_configs_are_unique():
    assert len({row.name for row in METHODS}) == len(METHODS)
    configs = [row.config for row in METHODS if row.config is not None]
    assert len(set(configs)) == len(configs)
    assert [paper_method(rung.config) for rung in LADDER] == list(LADDER)
    assert paper_method("medium_isoparams_poisson") is POISSON
    with pytest.raises(KeyError, match="no TOML"):
        paper_method("small_huginn")


def test_grt_parts_are_the_grt_row():
    assert GRT_PARTS == {k: GRT.parts[k] for k in GRT_PARTS}
    assert row_args(GRT) == grt_flavors["debug"]  # GRT is the args' defaults


def test_each_rung_adds_one_component():
    components = [ladder_components(row_args(rung)) for rung in LADDER[1:]]
    labels = [label for label, _ in LADDER_COMPONENTS]
    assert components == [labels[:k] for k in range(len(labels) + 1)]
    assert all(row_args(rung).depth_sampling == "uniform" for rung in LADDER[1:])


def test_a_row_keeps_its_name_with_other_settings_and_other_mixes_get_ladder_names():
    debug = grt_flavors["debug"]
    # Table 1 rows are identified by their key parts only (first match in TABLE_1's order).
    poisson = debug.replace(**{**POISSON.parts, "injection": "none"}, backprop_recurrences=2)
    assert poisson.method_name == "Heavy-tail Poisson"
    assert debug.replace(state_noise_std=0.0, gate_noise_std=0.0).method_name == "GRT"
    assert [row.name for row in TABLE_1][:3] == ["dense", "MoR (token choice)", "MoR"]
    # Mixes no row names: the ladder's components they have.
    assert debug.replace(injection="none", state_noise_std=0.05).method_name == (
        "recurrence + prelude/coda + noise + gate"
    )
    assert debug.replace(initial_state="random").method_name == (
        "recurrence + prelude/coda + noise + re-injection + gate"
    )
    assert grt_flavors["debug_core_only"].replace(update="overwrite").method_name == (
        "recurrence + noise + re-injection"
    )
