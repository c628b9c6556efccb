"""benchmarks/gpu/suite.py cannot rot between GPU runs: its --cpu-smoke runs every part here.
The decoding benchmarks (generate_bench, which it reuses, and halting_bench) quiet torchao's
import noise before anything imports it."""

import ast
import importlib.util
import json
import math
import subprocess
import sys

import pytest

from grt_test_helpers import REPO

SUITE = REPO / "benchmarks" / "gpu" / "suite.py"


def run_suite(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, str(SUITE), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def load_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_plan_fits_the_five_minute_window(capsys):
    suite = load_suite()
    assert suite.main(["--plan"]) == 0
    total = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| total")]
    assert total and float(total[0].split("|")[-2]) <= 300
    # Compute is seconds; the budget is the compiled models (10 on a GPU).
    assert sum(compiles for _, compiles, _ in suite.plan(suite.GPU)) == 10


def test_unknown_part_is_named():
    with pytest.raises(SystemExit, match="--parts mfu: unknown; allowed: train, float8, generate, halting"):
        load_suite().main(["--cpu-smoke", "--parts", "train,mfu"])


def test_generation_models_have_positions_for_the_whole_decode():
    """Table 3's decode (prompt 1024 + 128 new tokens) runs past a preset's 1024 learned
    positions: the GPU run's first generate part stopped at position 1024."""
    suite = load_suite()
    size = suite.GPU
    assert (size.gen_prompt, size.gen_new_tokens) == (1024, 128)
    for flavor in (size.gen_grt, size.gen_dense):
        assert suite.flavor_args(flavor, size).max_seq_len < 1152  # what made it fail
        assert suite.generation_args(flavor, size).max_seq_len == 1152


def test_a_failing_part_is_recorded_and_the_parts_after_it_run(tmp_path, monkeypatch, capsys):
    suite = load_suite()

    def broken(size, device):
        raise RuntimeError("no setter")

    monkeypatch.setattr(suite, "PARTS", {"train": broken, "float8": lambda size, device: {"rows": []}})
    assert suite.main(["--cpu-smoke", "--parts", "train,float8", "--out", str(tmp_path)]) == 1
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["train"] == {"failed": "RuntimeError: no setter"}
    assert results["float8"] == {"rows": []} and set(results["seconds"]) == {"train", "float8", "total"}
    captured = capsys.readouterr()
    assert "| train | | failed: RuntimeError: no setter | |" in captured.out
    assert "failed parts: train" in captured.err


@pytest.mark.slow
@pytest.mark.gpu_prep
def test_cpu_smoke_runs_every_part(tmp_path):
    """Every part of the suite at debug size on the CPU. Run where it protects a GPU session's
    minutes: benchmarks/gpu/bundle.sh runs it before gathering the wheels, and CI, which the
    suite's results never reach, deselects it (`-m "not gpu_prep"`; 80 of CI's worker seconds)."""
    proc = run_suite("--cpu-smoke", "--out", str(tmp_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["seconds"]) == {"train", "float8", "generate", "halting", "total"}
    (train,) = results["train"]["rows"]
    # Sampled r and one compiled step graph: no recompilation once warm.
    assert train["recompiles_after_warmup"] == 0
    grt_runs = [r for r in train["runs"] if r["model"] == "grt"]
    assert all(r["sampled_r"] for r in grt_runs)
    for key in ("mfu_ratio", "compiled_over_eager_grt", "compiled_over_eager_dense"):
        assert math.isfinite(train[key]) and train[key] > 0
    assert all(math.isfinite(r["loss"]) for r in train["runs"])
    (float8,) = results["float8"]["rows"]  # --cpu-smoke: the wide run is the debug one
    assert float8["float8"]["float8"] and float8["float8_over_bf16"] > 0
    gen = results["generate"]
    assert {m["strategy"] for m in gen["memory"]} == {"per_step", "first", "last", "average"}
    assert {m["batch"] for m in gen["memory"]} == {1, 2}
    # Fewer cached core layers than per_step: first/last/average keep one step's KV.
    by = {(m["batch"], m["strategy"]): m["ratio"] for m in gen["memory"]}
    assert by[(2, "average")] < by[(2, "per_step")]
    # Every halting rule decoded, every token at depth R (the suite asserts it).
    halting = results["halting"]
    assert [r["rule"] for r in halting["rules"]] == ["state", "gate", "kl", "entropy", "argmax"]
    assert all(math.isfinite(r["over_fixed_eager"]) and r["over_fixed_eager"] > 0 for r in halting["rules"])
    assert "| MFU GRT / dense" in proc.stdout and "seconds per part:" in proc.stdout
    assert "| halting decode latency / fixed r = R eager, kl never halting" in proc.stdout


def test_the_bundle_runs_the_cpu_smoke_that_ci_leaves_out():
    """The smoke is marked gpu_prep, bundle.sh runs that marker before gathering the wheels,
    and CI's suite deselects it: it runs once before each GPU session, not in every CI run."""
    marks = {mark.name for mark in test_cpu_smoke_runs_every_part.pytestmark}
    assert {"slow", "gpu_prep"} <= marks
    bundle = (REPO / "benchmarks" / "gpu" / "bundle.sh").read_text()
    smoke = bundle.index("-m pytest tests/benchmarks/test_gpu_suite.py -m gpu_prep")
    assert smoke < bundle.index("pip wheel"), "the smoke runs before the wheels are gathered"
    assert 'pytest tests -m "not gpu_prep"' in (REPO / ".ci" / "run").read_text()


def test_halting_decode_records_each_tokens_depth():
    """The halting part's check that no token halted reads these depths (not the tokens: in
    bf16 on the H200 a never-halting decode's tokens differed from the fixed decode's)."""
    from types import SimpleNamespace

    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    import generate_bench as gb

    suite = load_suite()
    model = gb.build_model(suite.generation_args("debug", suite.CPU_SMOKE), torch.float32, "cpu")
    depth = model.config.eval_depth
    opts = SimpleNamespace(device="cpu", prompt=8, new_tokens=4, warmup=0, repeats=1)
    never = gb.measure(model, "per_step", False, opts, 2, halting={"halting": "state", "halting_threshold": 0.0})
    always = gb.measure(model, "per_step", False, opts, 2, halting={"halting": "state", "halting_threshold": 1e9})
    assert never["depth_range"] == (depth, depth)
    assert always["depth_range"] == (1, 1) and depth > 1
    assert "depth_range" not in gb.measure(model, "per_step", False, opts, 2)


@pytest.mark.parametrize("benchmark", ["generate_bench", "halting_bench"])
def test_decoding_benchmark_quiets_torchao_before_anything_imports_it(benchmark):
    """The decoding benchmarks load the HF model, whose transformers import pulls in torchao:
    each calls quiet_torchao_import() (grt_titan/runtime/quiet_imports.py) at module level
    before any import that can reach torchao, so its known CPU import messages stay out of the
    printed table. That the call keeps them out is shown in a fresh interpreter by
    tests/hf/test_hf_export.py's console check; here, that each script makes it first."""
    body = ast.parse((REPO / "benchmarks" / f"{benchmark}.py").read_text()).body
    calls = [
        i
        for i, node in enumerate(body)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "quiet_torchao_import"
    ]
    assert calls, f"benchmarks/{benchmark}.py never calls quiet_torchao_import() at module level"
    before = []
    for node in body[: calls[0]]:
        if isinstance(node, ast.Import):
            before += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            before.append(node.module)
    reach_no_torchao = {"__future__", "torch", "grt_titan.runtime.quiet_imports"}
    assert [m for m in before if m not in reach_no_torchao and m.split(".")[0] not in sys.stdlib_module_names] == []
