"""`[training] trainable` (grt_titan/infra/trainable.py): which parameters each pattern and
shorthand names, on the GRT and the rows whose recurrence holds more parts, and the refusals.
The real trainer's frozen runs (FSDP, TP + compile + AC, resume, export) are in
tests/reliability/test_frozen_training.py."""

from __future__ import annotations

import pytest

from grt_titan.infra.trainable import freeze_untrained, trainable_problems
from grt_titan.model import grt_flavors
from grt_titan.model.model import build_meta_model

from grt_test_helpers import RRT_PARTS, SCSE_PARTS

GATE = {
    "recurrence.step.gate." + name
    for name in (
        "state_norm.weight",
        "state_norm.bias",
        "anchor_norm.weight",
        "anchor_norm.bias",
        "w_in.weight",
        "w_in.bias",
        "w_out.weight",
        "w_out.bias",
    )
}


def model(**parts):
    return build_meta_model(grt_flavors["debug"].replace(**parts))


def trained(module, entries: list[str]) -> set[str]:
    freeze_untrained(module, entries)
    return {n for n, p in module.named_parameters() if p.requires_grad}


def test_parts_are_w_proj_and_the_gate_and_recurrent_adds_the_core():
    grt = model()
    assert trained(grt, ["parts"]) == {"recurrence.step.proj.weight", *GATE}
    recurrent = trained(grt, ["recurrent"])
    assert recurrent == {n for n, _ in grt.named_parameters() if n.startswith("recurrence.")}
    assert "recurrence.step.core.layers.1.feed_forward.w2.weight" in recurrent


def test_parts_take_scses_anchor_and_adapter_takes_rrts_adapters_alone():
    scse = trained(model(**SCSE_PARTS), ["parts"])  # no W_proj, no gate: the anchor's two maps
    assert scse == {"recurrence.anchor.anchor_proj.weight", "recurrence.anchor.init_delta_proj.weight"}
    assert not any(".core." in n for n in scse)

    rrt = model(**RRT_PARTS)
    adapters = trained(rrt, ["adapter"])
    assert adapters and all(n.startswith("recurrence.step.adapters.") for n in adapters)
    assert adapters == {n for n, _ in rrt.named_parameters() if ".adapters." in n}
    (no_parts,) = trainable_problems(rrt, ["parts"])  # RRT: no W_proj, no gate; adapters are not parts
    assert "'parts' matches nothing: this model's recurrence has nothing outside its core" in no_parts


def test_patterns_match_any_name_of_a_tied_weight_and_count_elements():
    grt = model()  # GPT-2 style: the head is the embedding
    assert "output.weight" not in dict(grt.named_parameters())  # named once, as the embedding
    assert trained(grt, ["output.weight"]) == {"tok_embeddings.weight"}
    count, total = freeze_untrained(grt, ["recurrence.step.proj.*", "norm.*"])
    assert count == 128 * 256 + 2 * 128
    assert total == sum(p.numel() for p in grt.parameters())
    everything = trained(grt, ["*"])
    assert everything == {n for n, _ in grt.named_parameters()}


def test_refusals_name_the_entry():
    grt = model()
    assert trainable_problems(grt, ["parts", "recurrent"]) == []
    (empty,) = trainable_problems(grt, [])
    assert empty.startswith("[training] trainable = [] freezes every parameter")
    (typo,) = trainable_problems(grt, ["parts", "recurence.*"])
    assert "'recurence.*' matches nothing" in typo and "'recurrence.step.proj.weight'" in typo
    (adapter,) = trainable_problems(grt, ["adapter"])
    assert 'step_adapter = "lora"' in adapter
    with pytest.raises(ValueError, match="'recurence.\\*' matches nothing"):
        freeze_untrained(grt, ["recurence.*"])
