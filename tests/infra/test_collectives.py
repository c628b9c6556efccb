"""FSDP gathers the shared core once per forward-backward, whatever the depth r, for the GRT
and for every baseline method (its recurrence is one FSDP unit too)."""

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
    methods = {key.split(":")[0] for key in results}
    assert methods == {"grt", "poisson", "rrt", "ouro", "mor", "mor_token_choice"}
    for method in methods:  # counts and bytes independent of r (depths 1, R and, where allowed, 2R)
        runs = [v for k, v in results.items() if k.startswith(f"{method}:True:")]
        assert len(runs) >= 2, (method, runs)
        if method == "ouro":
            # Ouro reads every step out through the coda (T coda calls per forward): each coda
            # block is gathered twice more (forward, backward) per extra step; the core and
            # every other unit still once, and every gradient is reduced once.
            by_depth = {int(k.rsplit(":", 1)[1]): v for k, v in results.items() if k.startswith("ouro:True:")}
            base = by_depth[1]["counts"]
            for depth, run in by_depth.items():
                assert run["counts"] == {
                    "all_gather": base["all_gather"] + 2 * args.n_coda_layers * (depth - 1),
                    "reduce_scatter": base["reduce_scatter"],
                }, (depth, run)
        elif method.startswith("mor"):
            # The routers of steps a shallow forward does not reach get no gradient, so FSDP
            # reduces fewer bytes at r < R: at most all R routers' fp32 weights (R x d each),
            # as the counter sees them on 2 ranks; the counts and the gathers do not change.
            assert all(run["counts"] == runs[0]["counts"] for run in runs), (method, runs)
            assert all(run["bytes"]["all_gather"] == runs[0]["bytes"]["all_gather"] for run in runs), (method, runs)
            scattered = [run["bytes"]["reduce_scatter"] for run in runs]
            assert max(scattered) - min(scattered) <= 2 * 4 * args.num_recurrences * args.dim, (method, scattered)
        else:
            assert all(run == runs[0] for run in runs), (method, runs)
        # The same FSDP units as the GRT's: each method's own weights (W_proj, adapters,
        # routers) live in the recurrence's unit, Ouro's exit gate in the root's.
        assert runs[0]["counts"]["reduce_scatter"] == prelude_coda + 2, (method, runs[0])
    for core_reshard in ("False", "True"):
        runs = [v for k, v in results.items() if k.startswith(f"grt:{core_reshard}:")]
        assert len(runs) == 3  # r = 1, R, 2R
        assert all(run == runs[0] for run in runs), runs  # counts and bytes independent of r
        counts = runs[0]["counts"]
        # Forward: one gather per prelude/coda block, one for the whole recurrence, one for the
        # root; backward re-gathers the resharded blocks (and the core if it was resharded).
        extra = 1 if core_reshard == "True" else 0
        assert counts["all_gather"] == 2 * prelude_coda + 2 + extra
        # One reduce-scatter per FSDP unit: the core's gradients are reduced once, not r times.
        assert counts["reduce_scatter"] == prelude_coda + 2
