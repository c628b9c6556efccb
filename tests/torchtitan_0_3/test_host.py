"""The 0.3 adapter's version check (grt_titan/torchtitan_0_3/host.py): pure, on any host."""

import pytest

from grt_titan.torchtitan_0_3.host import host_problem


def test_a_fitting_host_passes():
    assert host_problem((3, 11), "2.14.1+cpu", "0.3.0") is None
    assert host_problem((3, 12), "2.15.0", "0.3.2") is None


@pytest.mark.parametrize(
    "python, torch_version, torchtitan_version, named",
    [
        ((3, 11), "2.14.1", "0.2.2", "torchtitan 0.2.2 is installed"),
        ((3, 10), "2.14.1", "0.3.0", "Python >= 3.11; this is Python 3.10"),
        ((3, 11), "2.13.0+cpu", "0.3.0", "torch >= 2.14 (its FSDP fails on older torch); this is torch 2.13.0+cpu"),
    ],
)
def test_a_bad_combination_is_named_in_one_line(python, torch_version, torchtitan_version, named):
    problem = host_problem(python, torch_version, torchtitan_version)
    assert named in problem and "\n" not in problem


def test_the_0_2_2_launcher_names_the_0_3_command():
    """`-m grt_titan.train` under torchtitan 0.3: one line with the command that works there."""
    import subprocess
    import sys
    from importlib.metadata import version

    if version("torchtitan").startswith("0.2"):
        pytest.skip("torchtitan 0.2.2 runs grt_titan.train")
    done = subprocess.run(
        [sys.executable, "-m", "grt_titan.train", "--job.config_file", "train_configs/grt_debug.toml"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"grt_titan.train is the launcher of torchtitan 0.2.2, and torchtitan {version('torchtitan')} is installed: "
        "run `torchrun ... -m torchtitan.train --module grt_titan --config <preset>` (docs/training.md)"
    )
