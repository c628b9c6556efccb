"""Each workaround in grt_titan/infra/torch_workarounds.py: the defect still shows without it
(when this starts failing, torch has fixed it and the workaround can go) and is gone with it.

Each case runs in a process of its own (a job of tests/launcher.py, forked from a server that has only
imported): the workarounds change process-wide torch state.
"""

import json
import os

import pytest

from grt_titan.infra.torch_workarounds import install_rng_state_order_fix, saves_opaque_objects

from grt_test_helpers import REPO, launch

WORKER = "tests.infra.torch_workarounds_worker"


def run_case(tmp_path, case: str, fix: bool, *extra: str, env: dict | None = None) -> dict:
    out = tmp_path / f"{case}-{'fix' if fix else 'nofix'}-{'-'.join(extra)}.json"
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = launch(WORKER, [case, "fix" if fix else "nofix", str(out), *extra], full_env, timeout=600)
    assert out.exists(), (proc.stdout + proc.stderr)[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.skipif(not saves_opaque_objects(), reason="this torch saves no opaque objects for backward (2.11)")
def test_rng_states_ordered_before_the_saved_device_mesh(tmp_path):
    broken = run_case(tmp_path, "rng_order", fix=False)
    assert not broken["ok"]
    assert "expected all tensors_saved_with_vc_check to be Tensors" in broken["error"]
    fixed = run_case(tmp_path, "rng_order", fix=True)
    assert fixed["ok"], fixed.get("trace")
    # SDPA with no dropout: compiled + AC is eager's arithmetic (aot_eager runs the same ops).
    assert fixed["sdpa_vs_eager"] == 0.0
    # Dropout under AC: the backward recomputes with the forward's saved RNG state, so the
    # gradient is bit-identical to the run without AC (a different mask would change it).
    assert fixed["dropout_grad_norm"] > 0
    assert fixed["dropout_ac_vs_no_ac"] == 0.0


@pytest.mark.slow
def test_uneven_shards_share_compile_cache_entries_and_the_workaround_keeps_them_apart(tmp_path):
    """Rank 1 (2 of 5 rows) fills the cache; rank 0 (3 rows) then starts on the warm cache and
    is handed rank 1's graph, unless the workaround turned the AOTAutograd cache off for its
    uneven shard (inductor's own FX graph cache, keyed on local shapes, stays on)."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    cold = run_case(tmp_path, "uneven_cache", False, "1", env=env)
    assert cold["ok"] and cold["local_rows"] == 2, cold.get("trace")
    warm = run_case(tmp_path, "uneven_cache", False, "0", env=env)
    assert not warm["ok"]
    assert "expected size 3==2" in warm["error"]
    fixed = run_case(tmp_path, "uneven_cache", True, "0", env=env)
    assert fixed["ok"] and fixed["local_rows"] == 3, fixed.get("trace")


@pytest.mark.slow
def test_compiled_block_takes_a_tp_embedding_output(tmp_path):
    broken = run_case(tmp_path, "embedding_view", fix=False)
    assert not broken["ok"]
    assert "has no attribute '_local_tensor'" in broken["error"]
    fixed = run_case(tmp_path, "embedding_view", fix=True)
    assert fixed["ok"], fixed.get("trace")
    assert fixed["embedding_grad_norm"] > 0


def test_rng_state_fix_is_installed_only_where_opaque_objects_are_saved():
    from torch._functorch import partitioners

    original = partitioners.functionalize_rng_ops
    try:
        installed = install_rng_state_order_fix()
        assert installed == saves_opaque_objects()
        assert getattr(partitioners.functionalize_rng_ops, "grt_titan_workaround", False) == installed
        assert install_rng_state_order_fix() is False  # idempotent
    finally:
        partitioners.functionalize_rng_ops = original


@pytest.mark.parametrize("vocab, expected", [(50257, ["weight"]), (50304, [])])
def test_uneven_tp_shards_names_only_uneven_parameters(vocab, expected):
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from grt_titan.infra.torch_workarounds import uneven_tp_shards

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        with __import__("torch").device("meta"):
            head = nn.Linear(8, vocab, bias=False)
        parallelize_module(head, init_device_mesh("cpu", (2,)), ColwiseParallel())
        assert uneven_tp_shards(head) == expected
    finally:
        dist.destroy_process_group()


def _op_sac_backward_under_autocast(cache: bool) -> str | None:
    """A tiny GRT with op SAC on its blocks, one bf16-autocast forward at r = 3 and its
    backward (as torchtitan trains on one device); the error, or None."""
    import torch
    from torchtitan.config import ActivationCheckpoint

    from grt_titan.infra.parallelize import apply_recurrence_ac
    from grt_titan.model import GRTModel, grt_flavors

    torch.manual_seed(0)
    model = GRTModel(grt_flavors["debug"].replace(vocab_size=256))
    with torch.no_grad():
        model.init_weights()
    apply_recurrence_ac(model, ActivationCheckpoint(mode="selective", selective_ac_option="op"), "block", False)
    before = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(cache)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(torch.randint(0, 256, (2, 16)), num_recurrences=3)
        logits.float().mean().backward()
    except RuntimeError as e:
        return str(e)
    finally:
        torch.set_autocast_cache_enabled(before)
    return None


def test_op_sac_of_a_weight_tied_core_under_autocast():
    """Workaround 4: with autocast's weight cache, the core's second call casts nothing in
    forward but casts in its recomputation, and SAC's replay stops; without the cache the
    same backward runs. `parallelize_grt` turns the cache off for a recurrent model with op
    SAC and no FSDP (torchtitan's bf16 is autocast there)."""
    import torch

    error = _op_sac_backward_under_autocast(cache=True)
    if torch.__version__ >= "2.13":  # torch 2.11's SAC replay does not count _to_copy: no defect there
        assert error is not None and "_to_copy" in error and "not found in storage" in error
    assert _op_sac_backward_under_autocast(cache=False) is None


def _frozen_compiled_prelude_backward(workaround: bool) -> str | None:
    """A tiny GRT trained only in its recurrence: full AC on every block, the prelude's blocks
    compiled (aot_eager_decomp_partition), one forward at r = 2 and its backward; the error,
    or None."""
    import torch
    from torchtitan.config import ActivationCheckpoint
    from torchtitan.config.job_config import Compile
    from torchtitan.models.llama3.infra.parallelize import apply_compile

    from grt_titan.infra.parallelize import apply_recurrence_ac
    from grt_titan.infra.torch_workarounds import checkpoint_only_where_gradients_flow
    from grt_titan.model import GRTModel, grt_flavors

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GRTModel(grt_flavors["debug"].replace(vocab_size=256))
    with torch.no_grad():
        model.init_weights()
    model.requires_grad_(False)
    model.recurrence.requires_grad_(True)
    apply_recurrence_ac(model, ActivationCheckpoint(mode="full"), "block", True)
    if workaround:
        assert checkpoint_only_where_gradients_flow(model) == 4  # prelude, 2 core blocks, coda
    apply_compile(model.prelude, Compile(enable=True, backend="aot_eager_decomp_partition"))
    try:
        model(torch.randint(0, 256, (2, 16)), num_recurrences=2).mean().backward()
    except Exception as e:  # dynamo wraps the backend's RuntimeError
        return str(e)
    assert model.recurrence.step.proj.weight.grad is not None
    return None


def test_compiled_checkpointed_block_that_no_gradient_reaches():
    """Workaround 5: a frozen prelude block (frozen embeddings in, nothing requiring grad) is
    compiled as an inference graph whose checkpoint tags meet the remat pass that refuses CPU
    SDPA as an RNG op; with the workaround the region runs unchecked and the recurrence trains.
    `parallelize_grt` installs it when a parameter is frozen under compile + AC."""
    import torch

    error = _frozen_compiled_prelude_backward(workaround=False)
    if torch.__version__ >= "2.13":  # torch 2.11 compiles the inference graph: no defect there
        assert error is not None and "does not support RNG ops" in error
    assert _frozen_compiled_prelude_backward(workaround=True) is None
