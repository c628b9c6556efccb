"""The recurrence step compiles once (fullgraph) and is reused for every step and every r."""

import pytest
import torch
from torch._dynamo.utils import counters
from torchtitan.config.job_config import ActivationCheckpoint, Compile

from grt_titan.infra.parallelize import apply_recurrence_ac, apply_recurrence_compile
from grt_test_helpers import build_model
from grt_titan.model import grt_flavors

VOCAB = 512


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", [None, "step"])
def test_no_recompiles_across_depths_and_steps(checkpoint):
    torch._dynamo.reset()
    model = build_model(vocab_size=VOCAB)
    reference = build_model(vocab_size=VOCAB)
    if checkpoint:
        apply_recurrence_ac(model, ActivationCheckpoint(mode="full"), checkpoint, compile_enabled=True)
    apply_recurrence_compile(model, Compile(enable=True, backend="inductor"))
    assert isinstance(model.recurrence.step, torch._dynamo.eval_frame.OptimizedModule)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))

    def train_step(depth=None):
        optimizer.zero_grad()
        loss = model(tokens, num_recurrences=depth).float().square().mean()
        loss.backward()
        optimizer.step()
        return loss

    # Warm-up compiles each distinct graph once (prelude/coda blocks, the step).
    torch.manual_seed(3)
    eager = reference(tokens, num_recurrences=2).float().square().mean()
    torch.manual_seed(3)
    compiled = train_step(depth=2)
    # Inductor reorders fp32 reductions: 1e-5 relative is the compile-vs-eager tolerance.
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    graphs = counters["stats"]["unique_graphs"]
    seen = []
    for _ in range(20):  # sampled depths r ~ Uniform{1..R}
        train_step()
        seen.append(model.recurrence.depth_sampler.history[-1])
    assert len(set(seen)) == grt_flavors["debug"].num_recurrences  # every r was exercised
    assert counters["stats"]["unique_graphs"] == graphs, "a depth or a step recompiled"
    assert not counters["recompiles"], dict(counters["recompiles"])
