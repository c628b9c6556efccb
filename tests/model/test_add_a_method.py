"""Adding a method the documented way (docs/methods.md): a module with its part's math, rules,
FLOPs term and settings (the page's own code, run here), its parts in the table of parts, a row
in the table of methods, which gives its key the `[grt]` choice. The toy method, GRT with a gate that reads the state
only, trains a step; and the `[grt]` section declares exactly the args' configurable fields."""

import dataclasses
import re
import typing
from typing import Literal

import pytest
import torch

import grt_titan.model.args as args_module
from grt_titan.components.loss import grt_loss
from grt_titan.model import GRTModelArgs, grt_flavors
from grt_titan.model.args import CONFIGURABLE_FIELDS
from grt_titan.model.methods import table as methods
from grt_titan.sections import GRTSection
from grt_titan.spec import JobModelArgs

from grt_test_helpers import REPO, build_model, matmul_flops, parse_config


def documented_module() -> dict:
    """The toy method's module as docs/methods.md writes it (its python block, run here): its
    math, `StateGate`, and its part, `StateGateUpdate` (rules, start-up problem, FLOPs term)."""
    text = (REPO / "docs" / "methods.md").read_text()
    code = re.search(r"<!-- docs-test: check -->\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/methods.md", "exec"), namespace)
    return namespace


MODULE = documented_module()
StateGate, StateGateUpdate = MODULE["StateGate"], MODULE["StateGateUpdate"]
# Its row in the table of methods.
TOY = methods.Method("GRT (state gate)", {"update": "state_gate", "gate_noise_std": 0.0}, key=("update",))


@pytest.fixture
def toy(monkeypatch) -> GRTModelArgs:
    """What listing the module in `MODULES` and its row in the table of methods do at import,
    done for this test only: its `PARTS` join the table of parts (grt_titan/model/part_table.py),
    its row joins the table of methods, and the key's choices are derived again from the rows
    (grt_titan/model/args.py). Its `SETTINGS` declare nothing (test_settings.py adds a setting)."""
    assert MODULE["SETTINGS"] is MODULE["StateGateSettings"] and not dataclasses.fields(MODULE["SETTINGS"])
    monkeypatch.setattr(GRTModelArgs, "parts", (*GRTModelArgs.parts, *MODULE["PARTS"]))
    monkeypatch.setattr(methods, "TABLE_1", (*methods.TABLE_1, TOY))
    monkeypatch.setattr(methods, "METHODS", (*methods.METHODS, TOY))
    monkeypatch.setattr(args_module, "Update", Literal[methods.choices("update")])
    return grt_flavors["debug"].replace(**TOY.parts)


def test_a_rows_choice_is_its_keys(monkeypatch):
    """Each part key allows what the rows give it, GRT's first; a new row adds its choice."""
    assert typing.get_args(args_module.Update) == methods.choices("update") == ("gate", "overwrite", "deviation")
    assert methods.choices("router")[0] == "none" and "token_choice" in methods.choices("router")
    with pytest.raises(ValueError, match=r"update = 'state_gate'.*allowed"):
        grt_flavors["debug"].replace(update="state_gate").validate()
    monkeypatch.setattr(methods, "METHODS", (*methods.METHODS, TOY))
    assert methods.choices("update") == ("gate", "overwrite", "deviation", "state_gate")


def test_a_toy_method_added_as_documented_trains_a_step(toy):
    toy.validate()
    assert toy.method_name == "GRT (state gate)"
    model = build_model(toy)
    assert isinstance(model.recurrence.step.gate, StateGate)
    tokens = torch.randint(0, toy.vocab_size, (2, 17))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def eval_loss() -> float:
        with torch.no_grad():
            return grt_loss(model.eval()(inputs), labels).item()

    before = eval_loss()
    grt_loss(model.train()(inputs), labels).backward()
    assert model.recurrence.step.gate.w.weight.grad.abs().sum() > 0
    optimizer.step()
    assert eval_loss() < before


def test_the_toy_flops_term_counts_its_gate(toy):
    """The part's `step_params` enters eq. 1: the count matches torch's FlopCounterMode."""
    model = build_model(toy).eval()
    S, r = 16, 3
    measured = matmul_flops(model, torch.randint(0, toy.vocab_size, (1, S)), num_recurrences=r)
    blocks = toy.n_prelude_layers + toy.n_core_layers * r + toy.n_coda_layers
    assert measured == S * (toy.forward_flops_per_token(S, r) - blocks * 4 * S * toy.dim)
    plain = toy.replace(update="overwrite")
    assert toy.forward_flops_per_token(S, r) - plain.forward_flops_per_token(S, r) == r * 2 * toy.dim**2


def test_the_toy_rules_and_start_up_problems_are_checked(toy):
    with pytest.raises(ValueError, match=r"gate_noise_std = 0.1 is invalid; update = 'state_gate' draws no gate"):
        toy.replace(gate_noise_std=0.1).validate()
    config = parse_config("--grt.gate_noise_std", "0", "--parallelism.tensor_parallel_degree", "2")
    with pytest.raises(ValueError, match=re.escape("[grt] update = 'state_gate' does not support tensor_parallel")):
        JobModelArgs.of(toy).update_from_config(config)  # as torchtitan's Trainer gets the flavor


def test_the_grt_section_declares_the_configurable_fields():
    """Each field of `GRTModelArgs` that `[grt]` may override is a `[grt]` key of its type or
    unset, and the section's other keys are its own (recurrence checkpointing and sharding)."""
    section = typing.get_type_hints(GRTSection)
    args = typing.get_type_hints(GRTModelArgs)
    model_keys = [f.name for f in dataclasses.fields(GRTSection) if f.name in args]
    assert model_keys == list(CONFIGURABLE_FIELDS)
    assert set(section) - set(model_keys) == {"recurrence_checkpoint", "core_reshard_after_forward"}
    for name in CONFIGURABLE_FIELDS:
        assert section[name] == args[name] | None, name
        assert getattr(GRTSection(), name) is None, name  # unset keeps the flavor's value


def test_the_scse_diff_of_the_recipe_is_in_the_tree():
    """docs/methods.md shows SCSE's row as a diff: each `+` line is in the file it names, so
    the recipe's example cannot drift from the package."""
    text = (REPO / "docs" / "methods.md").read_text()
    diff = re.search(r"### SCSE's row, as a diff\n.*?```diff\n(.*?)```", text, re.S).group(1)
    files: dict[str, list[str]] = {}
    for line in diff.splitlines():
        if line.startswith("+++ b/"):
            current = files.setdefault(line[len("+++ b/") :], [])
        elif line.startswith("+"):
            current.append(line[1:])
    # Outside its module, a method touches the list of modules, the table of methods and its TOMLs.
    assert set(files) == {
        "grt_titan/model/methods/__init__.py",
        "grt_titan/model/methods/table.py",
        "train_configs/paper/small_scse.toml",
    }, files
    assert all(files.values()), files
    for path, lines in files.items():
        source = (REPO / path).read_text().splitlines()
        missing = [line for line in lines if not any(line in have for have in source)]
        assert not missing, f"{path}: {missing}"
