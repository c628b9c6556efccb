"""The package's layer order (docs/architecture.md), read from the source with ast.

    leaves  ->  model  ->  infra, data, components  ->  config_checks  ->  spec and CLIs
    hf/ and analysis/ use only model, data and the leaves.

Every import counts, at module level or inside a function: an import moved into a
function to dodge a circle is still a circle here.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grt_titan"

# Modules that import no other part of the package except other leaves.
LEAVES = {
    "grt_titan.atomic_dir",
    "grt_titan.cpu_support",
    "grt_titan.data.config",
    "grt_titan.fake_backend",
    "grt_titan.field_checks",
    "grt_titan.quiet_imports",
    "grt_titan.job_config",
    "grt_titan.model.args",
    "grt_titan.model.depth_law",
    "grt_titan.model.methods",
    "grt_titan.plots",
    "grt_titan.run_record",
    "grt_titan.tokenizer",
}
ENTRY = {"grt_titan", "grt_titan.spec", "grt_titan.train", "grt_titan.cli"}
# Which groups each group may import (a group may always import itself).
ALLOWED = {
    "leaf": set(),
    "model": {"leaf"},
    "data": {"leaf"},
    "infra": {"leaf", "model"},
    "components": {"leaf", "model", "data"},
    "hf": {"leaf", "model", "data"},
    "analysis": {"leaf", "model", "data"},
    "config_checks": {"leaf", "model", "data", "infra", "components"},
    "entry": {"leaf", "model", "data", "infra", "components", "hf", "analysis", "config_checks"},
}


def group(module: str) -> str:
    if module in LEAVES:
        return "leaf"
    if module in ENTRY:
        return "entry"
    if module == "grt_titan.config_checks":
        return "config_checks"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ("model", "data", "infra", "components", "hf", "analysis"):
        return parts[1]
    raise AssertionError(f"{module} has no place in the layer order: add it to tests/test_layers.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """grt_titan modules imported anywhere in `path` (relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import module` imports pkg.module when that is a module.
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return {m for m in found if m == "grt_titan" or m.startswith("grt_titan.")}


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "assets" not in p.parts)
MODULES = {module_name(p) for p in SOURCES}
GRAPH = {module_name(p): imports(p) & MODULES for p in SOURCES}


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target == module:
                continue
            source_group, target_group = group(module), group(target)
            if target_group != source_group and target_group not in ALLOWED[source_group]:
                bad.append(f"{module} ({source_group}) imports {target} ({target_group})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles (depth-first search over every import, function-level included)."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target == node:
                continue
            if state.get(target) == "open":
                found.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_every_module_has_a_layer():
    for module in MODULES:
        group(module)


def test_imports_follow_the_layer_order():
    assert violations(GRAPH) == []


def test_no_import_circles():
    assert cycles(GRAPH) == []


@pytest.mark.parametrize(
    "source, target",
    [
        ("grt_titan.model.args", "grt_titan.config_checks"),  # the circle issue 12 removed
        ("grt_titan.analysis.load", "grt_titan.hf.export"),
        ("grt_titan.components.validate", "grt_titan.analysis.report"),
    ],
)
def test_a_circle_put_back_is_caught(source, target):
    graph = {module: set(targets) for module, targets in GRAPH.items()}
    graph[source].add(target)
    assert violations(graph), f"{source} -> {target} should break the order"


MODEL_MATH = ["args", "flavors", "blocks", "recurrence", "step_stats", "model"]


@pytest.mark.parametrize("name", MODEL_MATH)
def test_model_math_imports_no_parallelism(name):
    tree = ast.parse((PACKAGE / "model" / f"{name}.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not [m for m in imported if m.startswith(("torch.distributed", "torchao"))], imported
