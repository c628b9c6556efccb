"""The exported model card says what each method's parts do, from the parts themselves
(`Part.describe`), and what depths a call may ask for."""

import dataclasses

import pytest

from grt_titan.hf.model_card import render_model_card
from grt_titan.run_reader import load_model_args

from tests.cases import paper_configs

ROWS = ("small_grt", "small_dense", "small_poisson", "small_rrt", "small_ouro", "small_mor")


def card_of(args) -> str:
    return render_model_card(args, {}, {"folder_name": "exported"})


@pytest.mark.parametrize("row", ROWS)
def test_card_describes_every_active_part_of_the_row(row):
    (path,) = paper_configs(row)
    args = load_model_args(path)[0]
    card = card_of(args)
    described = [part.describe(args) for part in args.active_parts]
    assert all(f"- {line}" in card for line in described if line), card
    if not args.is_recurrent:
        assert not args.active_parts and "num_recurrences=" not in card
        return
    law = args.part("depth_sampling")
    assert f"sampling `{law.choice}`" in card
    # A per-step module (RRT's adapters, MoR's routers) stops a call at R; the others extrapolate.
    per_step = any(part.per_step for part in args.active_parts)
    assert ("R at most (one module per step)" in card) == per_step
    assert ("> R extrapolation" in card) == (not per_step)
    assert (row in ("small_rrt", "small_mor")) == per_step


def test_depth_law_lines_by_hand():
    (path,) = paper_configs("small_poisson")
    poisson = load_model_args(path)[0]
    assert poisson.part("depth_sampling").describe(poisson) == (
        f"training depths r ~ Poisson(tau) + 1, tau log-normal, E[r] = {poisson.expected_recurrences:g}, "
        "sampling `poisson_lognormal`"
    )
    (path,) = paper_configs("small_grt")
    grt = dataclasses.replace(load_model_args(path)[0], depth_curriculum_steps=100)
    assert grt.part("depth_sampling").describe(grt) == (
        f"training depths r ~ Uniform{{{grt.min_recurrences}..{grt.num_recurrences}}}, sampling `uniform`, "
        "the largest depth ramped from r_min over the first 100 steps"
    )
