"""The non-finite step guard on torchtitan 0.3 (grt_titan/torchtitan_0_3/optimizer.py over the
host-neutral grt_titan/components/nonfinite.py), as tests/components/test_optimizer.py holds it on
0.2.2: 0.3's optimizers container, built from the recipe's config, stops (the default) or skips a
step with a NaN/inf gradient before anything changes; a skipped step trains on past 0.3's own
check of its logged loss (GRTTrainer.train_step)."""

from __future__ import annotations

import inspect
import math

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan 0.3's Trainer (the 0.3 lane)")

from torch import nn  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from grt_titan import config_registry  # noqa: E402
from grt_titan.components.nonfinite import NonFiniteStepError  # noqa: E402
from grt_titan.torchtitan_0_3.optimizer import GRTOptimizersContainer  # noqa: E402
from grt_titan.torchtitan_0_3.recipe import trainer_config  # noqa: E402
from grt_titan.torchtitan_0_3.trainer import NONFINITE_LOSS, GRTTrainer  # noqa: E402

from tests.nonfinite_cases import (  # noqa: E402
    backward,
    skip_leaves_parameters_and_optimizer_state_unchanged,
    stop_raises_before_any_update,
    two_linears,
)


def optimizers_for(model: nn.Module, on_nonfinite: str | None = None) -> GRTOptimizersContainer:
    """grt_debug's optimizer config (the recipe's), built as 0.3's Trainer builds it."""
    config = config_registry.grt_debug().optimizer
    if on_nonfinite is not None:
        config.on_nonfinite = on_nonfinite
    return config.build(model_parts=[model])


def test_the_recipe_reads_on_nonfinite(tmp_path):
    assert config_registry.grt_debug().optimizer.on_nonfinite == "stop"  # the default, as on 0.2.2
    path = tmp_path / "skip.toml"
    path.write_text('[model]\nflavor = "debug"\n[optimizer]\non_nonfinite = "skip"\n')
    config = trainer_config(path)
    assert type(config.optimizer) is GRTOptimizersContainer.Config and config.optimizer.on_nonfinite == "skip"


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_stop_raises_before_any_update(poison):
    stop_raises_before_any_update(optimizers_for, poison)


def test_skip_leaves_parameters_and_optimizer_state_unchanged():
    skip_leaves_parameters_and_optimizer_state_unchanged(optimizers_for)


class LoggedLossCheck(Trainer):
    """0.3's train_step where it matters here: the optimizer step, then 0.3's stop at a
    non-finite logged loss (its message: checked against 0.3's source below)."""

    def train_step(self, data_iterator) -> None:
        self.optimizers.step()
        raise RuntimeError(f"{NONFINITE_LOSS} (global_avg_loss=nan) at step {self.step}. Stopping training.")


class Probe(GRTTrainer, LoggedLossCheck):
    """GRTTrainer.train_step over LoggedLossCheck's, with no trainer built."""


def probe(on_nonfinite: str, poison: float | None) -> Probe:
    trainer = object.__new__(Probe)
    trainer.model, trainer.step = two_linears(), 1
    trainer.optimizers = optimizers_for(trainer.model, on_nonfinite)
    backward(trainer.model, poison)
    return trainer


def test_a_skipped_step_trains_on_past_the_check_of_its_logged_loss(caplog):
    assert f'f"{NONFINITE_LOSS} (' in inspect.getsource(Trainer.train_step)
    with caplog.at_level("WARNING"):
        probe("skip", math.nan).train_step(iter(()))
    assert "step 1: the loss is NaN or inf; not logged (a skipped step)" in caplog.text
    with pytest.raises(RuntimeError, match=f"^{NONFINITE_LOSS}"):
        probe("skip", None).train_step(iter(()))  # not skipped: 0.3's stop stands
    with pytest.raises(NonFiniteStepError, match=r"^step 1: "):
        probe("stop", math.nan).train_step(iter(()))
