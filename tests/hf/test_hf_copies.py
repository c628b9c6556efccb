"""The remote code (grt_titan/hf/remote/): its files, and its copies of the training model.

A function the remote code copies from grt_titan/model (it cannot import grt_titan) is marked

    # Copied from grt_titan.model.<module>.<name>[ with <old>-><new>[; <old>-><new>]]

on the line above its `def` (or `class`), and its source must be the named function's, character for
character, once the `with` replacements (documented differences) are applied to the
original: transformers' "Copied from" discipline (its utils/check_copies.py). The parity
tests check what the copies compute; this checks that they are still copies.
"""

import ast
import difflib
import importlib
import inspect
import re
import sys
import textwrap
from pathlib import Path

import pytest

from grt_titan.hf.convert import REMOTE_CODE_FILES, REMOTE_DIR

MODEL_DIR = REMOTE_DIR.parents[1] / "model"
MARKER = re.compile(r"^[ \t]*# Copied from (grt_titan\.model\.[\w.]+)(?: with (.+))?$")


def remote_sources() -> dict[str, str]:
    return {name: (REMOTE_DIR / name).read_text() for name in REMOTE_CODE_FILES}


def functions(source: str):
    """(node, its source with decorators, dedented) of every def and class in `source`, methods
    included."""
    lines = source.splitlines(keepends=True)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield node, start, textwrap.dedent("".join(lines[start - 1 : node.end_lineno]))


def resolve(path: str):
    """The object a marker names: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def marked_copies():
    """(file, line, target path, replacements, source) of every marked copy."""
    found = []
    for name, source in remote_sources().items():
        lines = source.splitlines()
        defs = {start: (node, text) for node, start, text in functions(source)}
        for index, line in enumerate(lines):
            match = MARKER.match(line)
            if match is None:
                continue
            assert index + 2 in defs, f"{name}:{index + 1}: the marker is not right above a def or class"
            replacements = [pair.split("->", 1) for pair in match.group(2).split("; ")] if match.group(2) else []
            assert all(len(pair) == 2 for pair in replacements), f"{name}:{index + 1}: a `with` pair lacks ->"
            found.append((name, index + 1, match.group(1), replacements, defs[index + 2][1]))
    return found


COPIES = marked_copies()


def test_the_remote_code_marks_its_copies():
    """The copies this test guards (a marker lost in an edit fails here, not silently)."""
    assert {path for _, _, path, _, _ in COPIES} >= {
        "grt_titan.model.recurrence.Gate.forward",
        "grt_titan.model.methods.poisson.eval_initial_state",
        "grt_titan.model.methods.rrt.lora_delta",
        "grt_titan.model.methods.ouro.ExitGate.forward",
        "grt_titan.model.methods.ouro.q_exit_steps",
    }


@pytest.mark.parametrize("copy", COPIES, ids=lambda c: f"{c[0]}:{c[1]}:{c[2]}")
def test_a_marked_copy_is_the_training_models_source(copy):
    name, line, path, replacements, source = copy
    try:
        target = resolve(path)
    except (ModuleNotFoundError, AttributeError) as e:
        raise AssertionError(f"{name}:{line}: `# Copied from {path}` names nothing ({e}); re-point the marker") from e
    expected = textwrap.dedent(inspect.getsource(target))
    for old, new in replacements:
        assert old in expected, f"{name}:{line}: the replacement {old!r} is not in {path}"
        expected = expected.replace(old, new)
    if source != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), source.splitlines(True), path, f"{name}:{line}"))
        raise AssertionError(
            f"{name}:{line} is no longer a copy of {path}; copy it again (or document the difference):\n{diff}"
        )


def test_every_copy_of_the_training_model_is_marked():
    """A remote-code function named as a top-level function of grt_titan/model, or with the
    source of any of its functions, carries the marker (an unmarked copy would drift)."""
    training, names = {}, set()  # source -> where; the top-level function names
    for path in sorted(MODEL_DIR.glob("*.py")):
        source = path.read_text()
        for node, _, text in functions(source):
            training.setdefault(text, f"{path.stem}.{node.name}")
        names |= {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    marked = {(name, line + 1) for name, line, _, _, _ in COPIES}
    unmarked = []
    for file, source in remote_sources().items():
        top_level = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
        for node, start, text in functions(source):
            if (file, start) in marked:
                continue
            if text in training or (node.name in top_level and node.name in names):
                unmarked.append(f"{file}:{start} {node.name} (grt_titan.model: {training.get(text, node.name)})")
    assert not unmarked, "copies of the training model without `# Copied from`:\n" + "\n".join(unmarked)


def test_remote_code_files_are_the_models_import_closure():
    """export-hf copies exactly the files transformers loads: the configuration, the model
    and every file they import relatively (transformers follows `from .x import`)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    needed = {"configuration_grt.py", "modeling_grt.py"}
    for name in sorted(needed):
        needed |= {Path(f).name for f in get_relative_import_files(str(REMOTE_DIR / name))}
    assert set(REMOTE_CODE_FILES) == needed


def test_a_loaded_export_runs_every_remote_file_from_its_own_copy(hf_models):
    """from_pretrained(folder, trust_remote_code=True) offline copies every remote file into
    transformers' module cache and imports the siblings from there, not from grt_titan."""
    model = hf_models["gpt2"]
    module = sys.modules[type(model).__module__]
    folder = Path(module.__file__).parent
    assert {p.name for p in folder.glob("*.py")} >= set(REMOTE_CODE_FILES)
    package = module.__name__.rsplit(".", 1)[0]
    for name in REMOTE_CODE_FILES:
        loaded = sys.modules.get(f"{package}.{Path(name).stem}")
        assert loaded is not None and Path(loaded.__file__).parent == folder, name
    assert not package.startswith("grt_titan")
