"""Import by need: the package and its console script load no torchtitan (the tools start at
once); torchtitan 0.2.2's `custom_import = "grt_titan"` still registers the train spec."""

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_console_scripts_help_imports_no_torchtitan():
    out = _run(
        "import sys, contextlib, io\n"
        "from grt_titan import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as text: cli.main(['--help'])\n"
        "assert 'export-hf' in text.getvalue()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torchtitan', 'torchao', 'transformers'}))"
    )
    assert out == "[]"


def test_importing_grt_titan_after_torchtitan_0_2_registers_the_spec():
    """As torchtitan 0.2.2's Trainer does with `custom_import`: itself first, then us."""
    pytest.importorskip("torchtitan.protocols.train_spec", reason="torchtitan 0.2.2's train-spec registry")
    out = _run(
        "from torchtitan.protocols.train_spec import get_train_spec\n"
        "import grt_titan\n"
        "print(get_train_spec('grt').model_cls.__name__)"
    )
    assert out == "GRTModel"
