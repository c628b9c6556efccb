"""Every torchtitan 0.3 command the docs print (`-m torchtitan.train --module grt_titan ...`)
parses with torchtitan 0.3's own ConfigManager: its preset, grt_titan's `--grt.*` keys and
torchtitan's flags. (The 0.2.2 lane's docs checks see only its module and preset.)"""

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan 0.3's Trainer (the 0.3 lane)")

from torchtitan.config import ConfigManager  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"-m torchtitan\.train --module grt_titan(?: [^\n`|]*)?")


def commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        for match in COMMAND.finditer(text):
            args = shlex.split(match.group(0))[2:]
            found.append((f"{path.relative_to(REPO)}: {match.group(0)}", args))
    return found


def test_the_docs_print_0_3_commands():
    assert len(commands()) >= 3


@pytest.mark.parametrize("where, args", commands(), ids=[w for w, _ in commands()])
def test_each_0_3_command_parses(where, args):
    args = [a.replace("<preset>", "grt_debug") for a in args]
    config = ConfigManager().parse_args(args)
    assert config.model_spec.name == "grt", where
