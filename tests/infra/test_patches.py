"""Each diff in patches/ documents an upstream torchtitan bug and still applies to the installed release."""

import shutil
import subprocess
from pathlib import Path

import pytest
import torchtitan

PATCHES = sorted((Path(__file__).resolve().parents[2] / "patches").glob("*.patch"))
SITE = Path(torchtitan.__file__).resolve().parents[1]


def test_patches_exist():
    assert PATCHES


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_applies_to_installed_torchtitan(patch):
    header = patch.read_text().split("\n--- ", 1)[0]
    for field in ("Symptom:", "Reason:", "torchtitan 0.2.2"):
        assert field in header, f"{patch.name} header lacks {field}"
    assert torchtitan.__version__.startswith("0.2.2")
    proc = subprocess.run(
        ["patch", "--dry-run", "--force", "-p1", "-i", str(patch)], cwd=SITE, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
