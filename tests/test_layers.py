"""The package's layer order (docs/architecture.md), read from the source with ast.

    leaves  ->  model  ->  config  ->  io  ->  infra, data, components  ->  (teacher)  ->  config_checks  ->  spec and CLIs
    torchtitan 0.3's adapter (torchtitan_0_3/, config_registry) sits above config_checks: it uses
    model, io, data, infra, components and config_checks' shared checks, and nothing imports it.
    hf/ and analysis/ use only model, io, data and the leaves (and hf/remote/, the exported
    model, which analysis decodes with: eval-task --wall-clock); teacher (the distillation
    teacher: read by io and hf's readers, sharded by infra) sits above them.
    hf/remote/ (the model every Hugging Face export ships) imports nothing of grt_titan: only
    torch, transformers, the standard library and its siblings.

io is the one-process I/O that every reader of a trained GRT shares: run_reader (training
TOMLs and run records, on either host), the checkpoints package (checkpoint folders, the latest
complete step, resume and initial-load inspection, HF weights, loading) and hf.config_map (args <-> an export's config.json), so that
analysis reads an export without importing hf's commands.

Every import counts, at module level or inside a function: an import moved into a
function to dodge a circle is still a circle here. An import under `if TYPE_CHECKING:` names a
type for annotations and runs nothing: it must follow the layer order, and it may close a
circle (a method's part is annotated with the args that hold its settings,
grt_titan/model/methods/).

And no function of the package is longer than `MAX_FUNCTION_LINES`: a reader holds one on a
screen (split a longer one into named steps).
"""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grt_titan"

# Modules that import no other part of the package except other leaves.
LEAVES = {
    "grt_titan.runtime.atomic_dir",
    "grt_titan.runtime.cpu_support",
    "grt_titan.data.config",
    "grt_titan.runtime.fake_backend",
    "grt_titan.field_checks",
    "grt_titan.runtime.quiet_imports",
    "grt_titan.model.depth_law",
    "grt_titan.model.flops",
    "grt_titan.model.methods.table",
    "grt_titan.model.part",
    "grt_titan.model.settings",
    "grt_titan.plots",
    "grt_titan.runtime",
    "grt_titan.tokenizer",
}
# What the model args make for a job: the `[grt]` section, the job config, run records.
CONFIG = {"grt_titan.sections", "grt_titan.job_config", "grt_titan.run_record"}
IO = {
    "grt_titan.checkpoints",
    "grt_titan.checkpoints.folders",
    "grt_titan.checkpoints.hf_weights",
    "grt_titan.checkpoints.job_files",
    "grt_titan.checkpoints.load",
    "grt_titan.checkpoints.start_load",
    "grt_titan.run_reader",
    "grt_titan.hf.config_map",
}
# The remote model: copied verbatim into every export, run where grt_titan is not installed.
REMOTE = "grt_titan.hf.remote"
ENTRY = {"grt_titan", "grt_titan.spec", "grt_titan.train", "grt_titan.cli"}
TEACHER = {"grt_titan.teacher"}
# Which groups each group may import (a group may always import itself).
ALLOWED = {
    "remote": set(),
    "leaf": set(),
    "model": {"leaf"},
    "config": {"leaf", "model"},
    "data": {"leaf"},
    "io": {"leaf", "model", "config"},
    "infra": {"leaf", "model", "config"},
    "components": {"leaf", "model", "config", "io", "data"},
    "hf": {"leaf", "model", "config", "io", "data", "remote"},
    "analysis": {"leaf", "model", "config", "io", "data", "remote"},
    "teacher": {"leaf", "model", "config", "io", "data", "infra", "components", "hf", "remote"},
    "config_checks": {"leaf", "model", "config", "io", "data", "infra", "components", "teacher"},
    "host_0_3": {"leaf", "model", "config", "io", "data", "infra", "components", "config_checks"},
    "entry": {
        "leaf",
        "model",
        "config",
        "io",
        "data",
        "infra",
        "components",
        "hf",
        "remote",
        "analysis",
        "teacher",
        "config_checks",
    },
}


def group(module: str) -> str:
    if module == REMOTE or module.startswith(REMOTE + "."):
        return "remote"
    if module in LEAVES:
        return "leaf"
    if module in CONFIG:
        return "config"
    if module in IO:
        return "io"
    if module in ENTRY:
        return "entry"
    if module in TEACHER:
        return "teacher"
    if module == "grt_titan.config_checks":
        return "config_checks"
    if module == "grt_titan.config_registry" or module.startswith("grt_titan.torchtitan_0_3"):
        return "host_0_3"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ("model", "data", "infra", "components", "hf", "analysis"):
        return parts[1]
    raise AssertionError(f"{module} has no place in the layer order: add it to tests/test_layers.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_nodes(tree: ast.Module) -> set[ast.AST]:
    """The nodes under `if TYPE_CHECKING:`: annotations' imports, which never run."""
    blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    return {node for block in blocks for statement in block.body for node in ast.walk(statement)}


def imports(path: Path, *, type_checking: bool = True) -> set[str]:
    """grt_titan modules imported anywhere in `path` (relative imports resolved), those under
    `if TYPE_CHECKING:` included unless `type_checking` is False."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text())
    skipped = set() if type_checking else type_checking_nodes(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
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
RUNTIME_GRAPH = {module_name(p): imports(p, type_checking=False) & MODULES for p in SOURCES}


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
    assert cycles(RUNTIME_GRAPH) == []


def test_only_annotations_close_a_circle():
    """The args' bases are the methods' settings; the methods' parts name the args only in
    annotations: that circle is a type's, and an import that runs would make it real."""
    assert "grt_titan.model.args" in GRAPH["grt_titan.model.methods.scse"]
    assert "grt_titan.model.args" not in RUNTIME_GRAPH["grt_titan.model.methods.scse"]
    assert [
        "grt_titan.model.args",
        "grt_titan.model.methods",
        "grt_titan.model.methods.mor",
        "grt_titan.model.args",
    ] in cycles(GRAPH)


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
# file of model/, none excepted (checkpoint I/O lives in grt_titan/checkpoints/, the
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


# ---- the remote model: hf/remote/ imports torch, transformers, the standard library and its siblings

REMOTE_DIR = PACKAGE / "hf" / "remote"
REMOTE_FILES = sorted(p.name for p in REMOTE_DIR.glob("*.py"))
REMOTE_MAY_IMPORT = {"torch", "transformers"} | set(sys.stdlib_module_names)


def remote_problems(path: Path) -> list[str]:
    """Each import of `path` (at module level or inside a function) that is not torch,
    transformers, the standard library or a sibling of the same folder (`from .x import`)."""
    siblings = {p.stem for p in path.parent.glob("*.py")}
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] not in REMOTE_MAY_IMPORT]
        elif isinstance(node, ast.ImportFrom) and node.level:
            # one level up is the folder itself; `from . import x` names the sibling x
            names = [node.module] if node.module else [a.name for a in node.names]
            if node.level != 1 or any(n.split(".")[0] not in siblings for n in names):
                bad.append("." * node.level + (node.module or ", ".join(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom) and node.module.split(".")[0] not in REMOTE_MAY_IMPORT:
            bad.append(node.module)
    return [f"{path.name}:{name}" for name in bad]


def test_the_remote_model_has_its_folder():
    assert "modeling_grt.py" in REMOTE_FILES and "configuration_grt.py" in REMOTE_FILES, REMOTE_FILES


@pytest.mark.parametrize("name", REMOTE_FILES)
def test_the_remote_model_imports_only_torch_transformers_and_its_siblings(name):
    assert remote_problems(REMOTE_DIR / name) == []


def test_a_grt_titan_import_in_the_remote_model_is_caught(tmp_path):
    (tmp_path / "sibling_grt.py").write_text("")
    bad = tmp_path / "bad_grt.py"
    bad.write_text(
        "import math\nimport torch.nn.functional as F\nfrom transformers import PretrainedConfig\n"
        "from .sibling_grt import x\nfrom . import sibling_grt\n\n"
        "def load():\n    from grt_titan.model.args import GRTModelArgs\n    import grt_titan\n"
        "    from ..model import args\n    from .missing import y\n    import numpy\n"
    )
    assert remote_problems(bad) == [
        "bad_grt.py:grt_titan.model.args",
        "bad_grt.py:grt_titan",
        "bad_grt.py:..model",
        "bad_grt.py:.missing",
        "bad_grt.py:numpy",
    ]


# ---- no function longer than a screen ------------------------------------------------------

MAX_FUNCTION_LINES = 100


def long_functions(path: Path, root: Path = PACKAGE.parent, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`file:line name (n lines)` of each function or method of `path` longer than `limit`
    lines, from its first decorator (or `def`) to its last line, docstring included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - start + 1
            if length > limit:
                found.append(f"{path.relative_to(root)}:{start} {node.name} ({length} lines)")
    return found


def test_no_function_is_longer_than_a_screen():
    too_long = [entry for path in SOURCES for entry in long_functions(path)]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n" + "\n".join(
        too_long
    )


def test_a_long_function_is_caught(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    # A method of MAX_FUNCTION_LINES lines, and one more with its decorator.
    source = f"class A:\n    def fits(self):\n{body}\n\n    @property\n    def long(self):\n{body}\n"
    (tmp_path / "bad.py").write_text(source)
    start = MAX_FUNCTION_LINES + 3
    assert long_functions(tmp_path / "bad.py", root=tmp_path) == [
        f"bad.py:{start} long ({MAX_FUNCTION_LINES + 1} lines)"
    ]
