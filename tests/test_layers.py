"""The package's layer order (docs/architecture.md), read from the source with ast.

    leaves  ->  model  ->  io  ->  infra, data, components  ->  (teacher)  ->  config_checks  ->  spec and CLIs
    hf/ and analysis/ use only model, io, data and the leaves; teacher (the distillation
    teacher: read by io and hf's readers, sharded by infra) sits above them.

io is the one-process I/O that every reader of a trained GRT shares: checkpoint_io
(training TOMLs, checkpoint folders, the latest complete step, resume inspection) and
hf.config_map (args <-> an export's config.json), so that analysis reads an export without
importing hf's commands.

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
    "grt_titan.model.flops",
    "grt_titan.model.methods",
    "grt_titan.model.part",
    "grt_titan.plots",
    "grt_titan.run_record",
    "grt_titan.tokenizer",
}
IO = {"grt_titan.checkpoint_io", "grt_titan.hf.config_map"}
ENTRY = {"grt_titan", "grt_titan.spec", "grt_titan.train", "grt_titan.cli"}
TEACHER = {"grt_titan.teacher"}
# Which groups each group may import (a group may always import itself).
ALLOWED = {
    "leaf": set(),
    "model": {"leaf"},
    "data": {"leaf"},
    "io": {"leaf", "model"},
    "infra": {"leaf", "model"},
    "components": {"leaf", "model", "io", "data"},
    "hf": {"leaf", "model", "io", "data"},
    "analysis": {"leaf", "model", "io", "data"},
    "teacher": {"leaf", "model", "io", "data", "infra", "components", "hf"},
    "config_checks": {"leaf", "model", "io", "data", "infra", "components", "teacher"},
    "entry": {"leaf", "model", "io", "data", "infra", "components", "hf", "analysis", "teacher", "config_checks"},
}


def group(module: str) -> str:
    if module in LEAVES:
        return "leaf"
    if module in IO:
        return "io"
    if module in ENTRY:
        return "entry"
    if module in TEACHER:
        return "teacher"
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


# The model package is single-device: no parallelism, no torchtitan config parsing. Every
# file of model/, none excepted (checkpoint I/O lives in grt_titan/checkpoint_io.py, the
# DTensor side of the HF adapter in grt_titan/components/checkpoint.py).
MODEL_FILES = sorted(str(p.relative_to(PACKAGE / "model")) for p in (PACKAGE / "model").rglob("*.py"))
FORBIDDEN_IN_MODEL = ("torch.distributed", "torchao", "torchtitan.config.manager", "torchtitan.config.ConfigManager")


def external_imports(path: Path) -> set[str]:
    """Every module (and `module.name` of a from-import) that `path` imports, at module level
    or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


@pytest.mark.parametrize("name", MODEL_FILES)
def test_model_imports_no_parallelism_nor_config_manager(name):
    imported = external_imports(PACKAGE / "model" / name)
    assert not [m for m in imported if m.startswith(FORBIDDEN_IN_MODEL)], imported


def test_a_forbidden_model_import_is_caught(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from torchtitan.config import ConfigManager\n\ndef load():\n    from torch import distributed\n")
    assert sorted(m for m in external_imports(bad) if m.startswith(FORBIDDEN_IN_MODEL)) == [
        "torch.distributed",
        "torchtitan.config.ConfigManager",
    ]
