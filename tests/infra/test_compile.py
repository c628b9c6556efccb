"""The recurrence step compiles once (fullgraph) and is reused for every step and every r."""

import pytest
import torch
from torch._dynamo.utils import counters
from torchtitan.config.job_config import ActivationCheckpoint, Compile

from grt_titan.components.loss import grt_loss
from grt_titan.infra.parallelize import apply_recurrence_ac, apply_recurrence_compile
from grt_titan.model import grt_flavors
from grt_titan.model.part import TrainingOutput

from grt_test_helpers import MOR_PARTS, build_model

VOCAB = 512


@pytest.mark.slow
@pytest.mark.parametrize(
    "checkpoint, supervised",
    [(None, False), ("step", True)],
    ids=["plain", "step_ac_supervised"],
)
def test_no_recompiles_across_depths_and_steps(checkpoint, supervised):
    """`plain`: the step alone. `step_ac_supervised`: per-step AC with per-step supervision
    (every step read out toward its own target, at its scored rows) through the same compiled
    step and sampled depths; per-step AC alone adds no guard that this case does not hold."""
    torch._dynamo.reset()
    model = build_model(vocab_size=VOCAB, step_supervision=supervised)
    reference = build_model(vocab_size=VOCAB, step_supervision=supervised)
    if checkpoint:
        apply_recurrence_ac(model, ActivationCheckpoint(mode="full"), checkpoint, compile_enabled=True)
    # Recompiles are dynamo's (guards on depth, step index, grad mode), whatever the backend;
    # aot_eager skips inductor's C++ code generation, which inductor's own numerics need only
    # (the GPU suite, benchmarks/gpu/suite.py, compiles this step with inductor).
    apply_recurrence_compile(model, Compile(enable=True, backend="aot_eager"))
    assert isinstance(model.recurrence.step, torch._dynamo.eval_frame.OptimizedModule)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    step_labels = torch.randint(0, VOCAB, (2, 32, 3), generator=torch.Generator().manual_seed(2))

    def loss_of(net, depth):
        if not supervised:
            return net(tokens, num_recurrences=depth).float().square().mean()
        out = net(tokens, num_recurrences=depth, step_labels=step_labels)
        assert isinstance(out, TrainingOutput) and out.step_logits is not None  # every step read out
        return grt_loss(out, tokens) / tokens.numel()

    def train_step(depth=None):
        optimizer.zero_grad()
        loss = loss_of(model, depth)
        loss.backward()
        optimizer.step()
        return loss

    # Warm-up compiles each distinct graph once (prelude/coda blocks, the step).
    torch.manual_seed(3)
    eager = loss_of(reference, 2)
    torch.manual_seed(3)
    compiled = train_step(depth=2)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    graphs = counters["stats"]["unique_graphs"]
    seen = []
    for _ in range(20):  # sampled depths r ~ Uniform{1..R}
        train_step()
        seen.append(model.recurrence.depth_sampler.history[-1])
    assert len(set(seen)) == grt_flavors["debug"].num_recurrences  # every r was exercised
    assert counters["stats"]["unique_graphs"] == graphs, "a depth or a step recompiled"
    assert not counters["recompiles"], dict(counters["recompiles"])


@pytest.mark.slow
def test_mixture_of_recursions_compiles_one_step_graph():
    """Every MoR step runs the core on its own k_i tokens; the token dimension is dynamic, so
    the R steps share one graph: with a recompile limit of 1 any recompile (another k_i,
    another training step) raises. aot_eager: dynamo + AOTAutograd, where shapes are decided
    (inductor compiles the GRT's step in the GPU suite, benchmarks/gpu/suite.py). The "block"
    update (`router_update`), which the paper's MoR rows train compiled; the default "delta"
    compiles without a recompile in test_method_parity's expert-choice run."""
    torch._dynamo.reset()
    model = build_model(**MOR_PARTS, vocab_size=VOCAB, router_update="block")
    reference = build_model(**MOR_PARTS, vocab_size=VOCAB, router_update="block")
    apply_recurrence_compile(model, Compile(enable=True, backend="aot_eager"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(1))

    def loss_of(out):
        return out.logits.float().square().mean() + out.aux_loss_sum

    def train_step():
        optimizer.zero_grad()
        loss = loss_of(model(tokens))
        loss.backward()
        optimizer.step()
        return loss

    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        compiled = train_step()  # k = 64, 48, 32, 16
        torch.testing.assert_close(compiled, loss_of(reference(tokens)), rtol=1e-5, atol=1e-6)
        for _ in range(2):
            train_step()
