"""Every command in README.md, docs/*.md and the model card `export-hf` writes runs as printed
(docs/training.md, "Docs that run").

- every fenced block is marked run / check / output (no indented code blocks);
- every run and check block names only files, flags and TOML keys that exist, by the real
  parsers (tests/docs/docs_helpers.py);
- the run blocks run in document order in one scratch folder, with stdin closed and the
  marker's cpu-scale arguments, and exit 0; identical blocks run once; the model card's
  Python block runs verbatim next to the export; the trainer and `grt-titan analyze` print
  no warning.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from docs_helpers import (
    SHELL_LANGS,
    Block,
    block_problems,
    doc_files,
    extract_blocks,
    is_trainer,
    runnable_script,
    sys_executable_dir,
)
from grt_test_helpers import REPO, is_teardown_abort, job_env

# What a user's console must not show from the trainer or analyze (docs/training.md lists
# what was removed and why).
WARNING = re.compile(r"WARNING|Warning:|warnings.warn")
PROMPT = "[y/N]"
# Folders and files of the repository the commands name, linked into the scratch folder.
REPO_ENTRIES = ("train_configs", "benchmarks", "tests", "docs", "patches", "grt_titan", "pyproject.toml", "README.md")


def all_blocks() -> tuple[list[Block], list[str]]:
    blocks, problems = [], []
    for path in doc_files():
        found, bad = extract_blocks(path)
        blocks += found
        problems += bad
    return blocks, problems


def test_every_block_is_marked_and_names_only_what_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the docs' paths are relative to the repository
    blocks, problems = all_blocks()
    assert len(blocks) >= 30, len(blocks)  # the extraction finds the docs' blocks
    for block in blocks:
        if block.kind is not None:
            problems += [f"{block.where}: {p}" for p in block_problems(block, tmp_path)]
        if block.kind == "run" and block.lang in SHELL_LANGS:
            try:
                runnable_script(block)
            except ValueError as e:
                problems.append(str(e))
    assert not problems, "\n".join(problems)
    kinds = {k: sum(b.kind == k for b in blocks) for k in ("run", "check", "output")}
    print(f"\n{len(blocks)} blocks: {kinds}")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("```bash\ngrt-titan prepare x --out d\n```\n", "no `<!-- docs-test"),
        ("Text:\n\n    grt-titan prepare x --out d\n", "indented code block"),
        ("<!-- docs-test: runs -->\n```bash\nls\n```\n", "marker kind 'runs'"),
        ("<!-- docs-test: run -->\n```toml\n[grt]\n```\n", "a run block needs a language"),
        (
            "<!-- docs-test: check -->\n```bash\ngrt-titan export-hf --checkpoint c --config t.toml --out o --dtypes x\n```\n",
            "unrecognized arguments: --dtypes",
        ),
        ("<!-- docs-test: check -->\n```bash\ngrt-titan export-hf --checkpoint c --out o\n```\n", "required: --config"),
        (
            "<!-- docs-test: check -->\n```bash\ntorchrun --nproc_per_node=2 -m grt_titan.train "
            "--job.config_file train_configs/grt_debug.toml --training.stepz 3\n```\n",
            "torchtitan's config parser",
        ),
        (
            "<!-- docs-test: check -->\n```bash\ntorchrun --nproc_per_node=2 -m grt_titan.train "
            "--job.config_file train_configs/grt_nope.toml\n```\n",
            "train_configs/grt_nope.toml does not exist",
        ),
        ("<!-- docs-test: check -->\n```toml\n[grt]\nnum_recurrence = 4\n```\n", "num_recurrence"),
        ('<!-- docs-test: check -->\n```toml\n[grt]\ndepth_sampling = "random"\n```\n', "'random' is invalid"),
        (
            "<!-- docs-test: check -->\n```bash\npython benchmarks/step_time.py --devices cuda\n```\n",
            "has no option(s) ['--devices']",
        ),
        (  # --gguf and --out are declared by a helper it imports from benchmarks/retrofit_real.py
            "<!-- docs-test: check -->\n```bash\npython benchmarks/retrofit_reasoning.py --gguf m.gguf --out /tmp/r "
            "--sourcee m\n```\n",
            "has no option(s) ['--sourcee']",
        ),
        ("<!-- docs-test: check -->\n```python\nfrom transformers import AutoTokenizer\ntok = (\n```\n", "syntax"),
        ("<!-- docs-test: check -->\n```bash\ntorchft_lighthouse --bind [::]:29510\n```\n", "no --min_replicas"),
        ("<!-- docs-test: check -->\n```bash\ncurl https://example.com\n```\n", "unknown program 'curl'"),
        (
            "<!-- docs-test: check -->\n```bash\nbenchmarks/gpu/bundle.sh --pythn 3.12\n```\n",
            "has no option(s) ['--pythn']",
        ),
        (
            "<!-- docs-test: check -->\n```bash\npip install benchmarks/gpu/wheelz/*.whl\n```\n",
            "wheelz/*.whl does not exist",
        ),
        (
            "<!-- docs-test: output -->\n```\n$ python benchmarks/metrics_bench.py --step 3\nstep 3\n```\n",
            "has no option(s) ['--step']",
        ),
    ],
)
def test_a_broken_block_fails(text, expected, tmp_path, monkeypatch):
    """The checker catches each kind of doc rot it promises to (a doc change that breaks a
    block fails CI)."""
    monkeypatch.chdir(REPO)
    path = tmp_path / "page.md"
    path.write_text(text)
    blocks, problems = extract_blocks(path)
    problems += [p for b in blocks if b.kind for p in block_problems(b, tmp_path)]
    assert any(expected in p for p in problems), problems


def test_paper_suite_static_table_is_every_paper_tomls_row():
    """docs/paper_suite.md's table of every row (`paper_suite.py --static --rows '*'`) is that
    command's output now: one line per TOML of train_configs/paper/, none missing, none stale."""
    from tests.cases import paper_configs, static_table

    text = (REPO / "docs" / "paper_suite.md").read_text()
    start = text.index("| row | method | layout |")
    documented = text[start : text.index("\n\n", start)]
    rows = [line.split(" | ")[0].removeprefix("| ") for line in documented.splitlines()[2:]]
    assert rows == [p.stem for p in paper_configs()], "rows of the table != the TOMLs of train_configs/paper/"
    assert documented == static_table(paper_configs())


def _scratch(tmp_path):
    """A folder where the docs' relative paths resolve: the repository's files linked in,
    everything the commands write (outputs/, exports/, analysis/) created fresh."""
    root = tmp_path / "user"
    root.mkdir()
    for name in REPO_ENTRIES:
        (root / name).symlink_to(REPO / name)
    return root


def _env() -> dict:
    """The user's environment: grt_titan importable, console scripts on PATH, no hub; torchrun's
    rendezvous on a free port (PET_* are torchrun's own environment defaults)."""
    return job_env(
        {
            "PATH": sys_executable_dir() + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": "localhost:0",
        }
    )


def _served_console(tmp_path, env: dict) -> dict:
    """`grt-titan` and `torchrun` on the PATH as shims that have the launcher's fork server run
    the command with its arguments, working directory and environment (tests/launcher.py
    `call`): `grt_titan.cli`, the console script's module, and a one-node torchrun's ranks with
    torchrun's rank environment, every rank's output shown (`served_torchrun`; any other
    torchrun runs as printed). Each console command would otherwise be an interpreter start
    importing torchtitan (about 4.5 s of CPU), each torchrun three. python commands run as
    printed; GRT_TEST_LAUNCH_SERVER=0 runs every command as printed."""
    from tests.launcher import _SERVER, SOCKET_ENV, served

    if not served("docs' console commands", [], env):
        return env
    path = _SERVER.socket_path()
    shims = tmp_path / "console"
    shims.mkdir()
    for name, command in (("grt-titan", "call grt_titan.cli"), ("torchrun", "torchrun")):
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.launcher {command} "$@"\n')
        shim.chmod(0o755)
    return {**env, SOCKET_ENV: path, "PATH": str(shims) + os.pathsep + env["PATH"]}


def _written(cwd: Path) -> set[Path]:
    """What the commands wrote, two levels down (`outputs/<run>`), never through the links to
    the repository's files."""
    top = {p for p in cwd.iterdir()}
    return top | {p for d in top if d.is_dir() and not d.is_symlink() for p in d.iterdir()}


def _run(block: Block, cwd, env, log) -> str:
    """Run one block as printed (plus cpu-scale), stdin closed; its output, or a failure."""
    if block.lang == "python":
        script, argv = block.text, [sys.executable, "-"]
    else:
        script, argv = runnable_script(block), ["bash", "-"]
    before = _written(cwd)
    for attempt in (1, 2):
        t0 = time.perf_counter()
        # The script goes in as a file: the command's own stdin is closed (no prompt can wait).
        script_file = cwd.parent / f"block_{block.line}.{'py' if block.lang == 'python' else 'sh'}"
        script_file.write_text(script)
        proc = subprocess.run(
            [argv[0], str(script_file)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,
        )
        output = proc.stdout + proc.stderr
        log.write(
            f"\n===== {block.where} ({attempt}, {time.perf_counter() - t0:.1f} s, rc {proc.returncode})\n"
            f"{script}\n----- output\n{output}"
        )
        if proc.returncode == 0 or attempt == 2 or not is_teardown_abort(output):
            break
        for path in sorted(_written(cwd) - before):  # a gloo teardown abort (pytorch#179291): once more
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    assert PROMPT not in output, f"{block.where} waits for an answer on stdin:\n{output[-3000:]}"
    assert proc.returncode == 0, f"{block.where} failed (rc {proc.returncode}):\n{script}\n{output[-5000:]}"
    return output


@pytest.mark.slow
def test_documented_commands_run(tmp_path):
    blocks, problems = all_blocks()
    assert not problems, "\n".join(problems)
    root, env = _scratch(tmp_path), _served_console(tmp_path, _env())
    done: dict[tuple, str] = {}
    ran, timings = [], []
    with open(tmp_path / "docs_run.log", "w") as log:
        for block in blocks:
            if block.kind != "run":
                continue  # check and output blocks: the static test
            key = (block.lang, block.text, tuple(block.cpu_scale))
            if key in done:
                ran.append(f"{block.where}: same block as {done[key]}")
                continue
            t0 = time.perf_counter()
            output = _run(block, root, env, log)
            timings.append(f"{block.where}: {time.perf_counter() - t0:.1f} s")
            done[key] = block.where
            if is_trainer(block) or "grt-titan analyze" in block.text:
                noisy = [line for line in output.splitlines() if WARNING.search(line)]
                assert not noisy, f"{block.where} prints warnings:\n" + "\n".join(noisy[:20])
            ran.append(f"{block.where}: ran")

        # The model card of every export the docs made: its Python blocks, verbatim, from the
        # folder holding the export (as the card says).
        cards = sorted(root.glob("exports/*/README.md"))
        assert cards, "no docs block exported a model (docs/hf_export.md)"
        for card in cards:
            text = card.read_text()
            assert str(tmp_path) not in text and not re.search(r"(^|[\s(`\"'])/(tmp|home|work|root|Users)/", text), (
                f"absolute path in {card}:\n{text}"
            )
            assert re.search(r"training tokens: [\d,]+ \(", text), text
            assert re.search(r"validation loss: \d+\.\d+ at step \d+", text), text
            card_blocks, _ = extract_blocks(card)
            python = [b for b in card_blocks if b.lang == "python"]
            assert python, f"{card}: no Python block"
            for block in python:
                block.kind = "run"
                _run(block, card.parent.parent, env, log)
                ran.append(f"{block.where} (model card of {card.parent.name}): ran")
    print("\n" + "\n".join(ran + timings))
