"""Checkpointing across recurrences: exact gradients, and memory that stops growing with R."""

import pytest
import torch
from torchtitan.config.job_config import ActivationCheckpoint

from grt_titan.infra.memory_stats import saved_activation_bytes
from grt_titan.infra.parallelize import apply_recurrence_ac
from grt_titan.model import grt_flavors

from grt_test_helpers import MOR_PARTS, build_model

VOCAB = 512


def run(model, depth, seed=5):
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed)  # the noise of the steps
    model(tokens, num_recurrences=depth).float().square().mean().backward()
    return {clean(n): p.grad.clone() for n, p in model.named_parameters()}


def clean(fqn: str) -> str:
    return fqn.replace("_checkpoint_wrapped_module.", "")


AC_MODES = {
    "full_per_block": (ActivationCheckpoint(mode="full"), "block"),
    "op_sac_per_block": (ActivationCheckpoint(mode="selective", selective_ac_option="op"), "block"),
    "layer_sac_per_block": (ActivationCheckpoint(mode="selective", selective_ac_option="2"), "block"),
    "full_per_step": (ActivationCheckpoint(mode="full"), "step"),
    "op_sac_per_step": (ActivationCheckpoint(mode="selective", selective_ac_option="op"), "step"),
}


@pytest.mark.parametrize("mode", sorted(AC_MODES))
def test_checkpointed_gradients_equal_plain(mode):
    reference = run(build_model(vocab_size=VOCAB), depth=3)
    model = build_model(vocab_size=VOCAB)
    ac_config, recurrence_checkpoint = AC_MODES[mode]
    apply_recurrence_ac(model, ac_config, recurrence_checkpoint, compile_enabled=False)
    grads = run(model, depth=3)
    assert grads.keys() == reference.keys()
    for name, ref in reference.items():
        scale = ref.abs().max().clamp_min(1e-30)
        # Recomputation replays the same fp32 ops on the same inputs and noise.
        assert ((grads[name] - ref).abs().max() / scale).item() < 1e-6, name


def saved_bytes_per_token(model, depth) -> float:
    tokens = torch.randint(0, VOCAB, (2, 32))
    return saved_activation_bytes(model, tokens, num_recurrences=depth) / tokens.numel()


def memory_per_mode(depths=(2, 4, 8)) -> dict[str, list[float]]:
    table = {}
    for mode, ac in (("none", None), ("per_block", "block"), ("per_step", "step")):
        row = []
        for depth in depths:
            model = build_model(vocab_size=VOCAB, num_recurrences=depth)
            if ac is not None:
                apply_recurrence_ac(model, ActivationCheckpoint(mode="full"), ac, compile_enabled=False)
            row.append(saved_bytes_per_token(model, depth))
        table[mode] = row
    return table


def test_per_step_checkpointing_keeps_only_the_state_between_steps():
    d = grt_flavors["debug"].dim
    table = memory_per_mode()
    slope = {mode: (row[2] - row[1]) / 4 for mode, row in table.items()}  # bytes/token per extra step
    # per_step keeps h, the two noise tensors and the step output per step: <= 4 d-sized fp32 tensors.
    assert slope["per_step"] <= 4 * d * 4
    # Without checkpointing every core block's activations stay: many times more.
    assert slope["none"] > 8 * slope["per_step"]
    assert slope["per_step"] <= slope["per_block"] < slope["none"]
    for row in table.values():
        assert row[0] < row[1] < row[2]


@pytest.mark.parametrize("mode", ["op_sac_per_block", "full_per_step"])
def test_mixture_of_recursions_checkpointed_gradients_equal_plain(mode):
    """MoR's routed step (gathered tokens, router weight as an input) recomputes exactly too."""
    mor = dict(MOR_PARTS, vocab_size=VOCAB)
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))

    def grads(model):
        out = model(tokens)
        (out.logits.float().square().mean() + out.aux_loss_sum).backward()
        return {clean(n): p.grad.clone() for n, p in model.named_parameters()}

    reference = grads(build_model(**mor))
    model = build_model(**mor)
    apply_recurrence_ac(model, *AC_MODES[mode], compile_enabled=False)
    checkpointed = grads(model)
    assert checkpointed.keys() == reference.keys()
    for name, ref in reference.items():
        scale = ref.abs().max().clamp_min(1e-30)
        assert ((checkpointed[name] - ref).abs().max() / scale).item() < 1e-6, name
