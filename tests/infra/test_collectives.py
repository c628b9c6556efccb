"""FSDP gathers the shared core once per forward-backward, whatever the depth r."""

import json

import pytest

from grt_titan.model import grt_flavors


@pytest.mark.slow
def test_fsdp_collectives_do_not_grow_with_depth(run_torchrun, tmp_path):
    out = tmp_path / "collectives.json"
    proc = run_torchrun(2, [str(out)], tmp_path, timeout=300, module="tests.infra.collective_worker")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    args = grt_flavors["debug"]
    prelude_coda = args.n_prelude_layers + args.n_coda_layers
    for core_reshard in ("False", "True"):
        runs = [v for k, v in results.items() if k.startswith(core_reshard + ":")]
        assert len(runs) == 3  # r = 1, R, 2R
        assert all(run == runs[0] for run in runs), runs  # counts and bytes independent of r
        counts = runs[0]["counts"]
        # Forward: one gather per prelude/coda block, one for the whole recurrence, one for the
        # root; backward re-gathers the resharded blocks (and the core if it was resharded).
        extra = 1 if core_reshard == "True" else 0
        assert counts["all_gather"] == 2 * prelude_coda + 2 + extra
        # One reduce-scatter per FSDP unit: the core's gradients are reduced once, not r times.
        assert counts["reduce_scatter"] == prelude_coda + 2
