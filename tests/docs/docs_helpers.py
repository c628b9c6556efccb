"""The code blocks of README.md, docs/*.md and an export's model card, and what tests/docs
does with them (the markers are documented in docs/training.md, "Docs that run").

Every fenced block carries a marker on the line before it:

    <!-- docs-test: run [cpu-scale="ARGS"] -->   run as printed (ARGS appended to each command)
    <!-- docs-test: check [REASON] -->           syntax, files, flags and TOML keys only
    <!-- docs-test: output [REASON] -->          not a command: output, formula, diagram

The checks use the real parsers: torchrun's, torchtitan's ConfigManager (with grt_titan's
sections), each grt-titan subcommand's argparse parser, the benchmark scripts' own
`add_argument` flags, tomllib + the job config for TOML, `compile` for Python.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import glob
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from grt_test_helpers import REPO

MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$", re.S)
KINDS = ("run", "check", "output")
SHELL_LANGS = ("bash", "sh", "shell", "console")
RUN_LANGS = SHELL_LANGS + ("python", "toml")
# Paths a command may name inside the repository (checked to exist).
REPO_DIRS = ("train_configs/", "benchmarks/", "tests/", "grt_titan/", "docs/", "patches/")
TRAIN_MODULES = ("grt_titan.train", "torchtitan.train")
# Programs a `check` block may name that are checked for syntax only (the set-up block).
SETUP_MODULES = ("venv", "pip")


def doc_files() -> list[Path]:
    """README.md, then docs/*.md in name order (the order the run test follows), the studies of
    docs/results/, benchmarks/README.md and tests/README.md."""
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "docs" / "results").glob("*.md")),
        REPO / "benchmarks" / "README.md",
        REPO / "tests" / "README.md",
    ]


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    kind: str | None  # None: no marker
    reason: str = ""
    cpu_scale: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        try:
            name = self.path.relative_to(REPO)
        except ValueError:
            name = self.path.name
        return f"{name}:{self.line}"


def parse_marker(text: str) -> tuple[str, str, list[str]]:
    """(kind, reason, cpu-scale args) of a marker comment; ValueError naming what is wrong."""
    m = MARKER.match(text.strip())
    if m is None:
        raise ValueError(f"not a docs-test marker: {text.strip()!r}")
    body = m.group("body")
    kind, _, rest = body.partition(" ")
    if kind not in KINDS:
        raise ValueError(f"docs-test marker kind {kind!r}; allowed: {', '.join(KINDS)}")
    cpu_scale: list[str] = []
    sm = re.search(r'cpu-scale="([^"]*)"', rest)
    if sm is not None:
        if kind != "run":
            raise ValueError("cpu-scale only applies to a `run` block")
        cpu_scale = shlex.split(sm.group(1))
        rest = (rest[: sm.start()] + rest[sm.end() :]).strip()
    return kind, rest.strip(), cpu_scale


def extract_blocks(path: Path, text: str | None = None) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a markdown file with their markers, and problems (unmarked or
    badly marked blocks, indented code blocks)."""
    from markdown_it import MarkdownIt

    text = path.read_text() if text is None else text
    tokens = MarkdownIt("commonmark").parse(text)
    blocks: list[Block] = []
    problems: list[str] = []
    for i, tok in enumerate(tokens):
        if tok.type == "code_block":
            problems.append(
                f"{path.name}:{tok.map[0] + 1}: an indented code block; write it as a fenced "
                "block with a docs-test marker"
            )
            continue
        if tok.type != "fence":
            continue
        block = Block(path, tok.map[0] + 1, tok.info.strip().split(" ")[0], tok.content, None)
        prev = tokens[i - 1] if i > 0 else None
        if prev is not None and prev.type == "html_block" and "docs-test:" in prev.content:
            try:
                block.kind, block.reason, block.cpu_scale = parse_marker(prev.content)
            except ValueError as e:
                problems.append(f"{block.where}: {e}")
        else:
            problems.append(f"{block.where}: no `<!-- docs-test: run|check|output -->` marker before this block")
        langs = {"run": SHELL_LANGS + ("python",), "check": RUN_LANGS}.get(block.kind or "", None)
        if langs is not None and block.lang not in langs:
            problems.append(
                f"{block.where}: a {block.kind} block needs a language of {', '.join(langs)}, "
                f"not {block.lang or 'none'!r} (a TOML block is a check: parsed as a job config)"
            )
        blocks.append(block)
    return blocks, problems


# ---- shell commands -------------------------------------------------------------------


def logical_lines(script: str) -> list[str]:
    """Lines of a shell block with `\\` continuations joined; blank and comment lines dropped."""
    joined = re.sub(r"\\\n", " ", script)
    return [line for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def commands(line: str) -> list[list[str]]:
    """The simple commands of one logical line (split at &&, ||, ;, |), as token lists."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    for tok in lexer:
        if tok in ("&&", "||", ";", "|", "&"):
            out.append([])
        else:
            out[-1].append(tok)
    return [c for c in out if c]


def _strip_env(cmd: list[str]) -> list[str]:
    i = 0
    while i < len(cmd) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", cmd[i]):
        i += 1
    return cmd[i:]


@contextlib.contextmanager
def _quiet():
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        yield out, err


def _argparse_problem(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    with _quiet() as (_, err):
        try:
            parser.parse_args(args)
        except SystemExit as e:
            if e.code:
                return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def job_config_problem(args: list[str]) -> str | None:
    """torchtitan's ConfigManager (with grt_titan's sections when the TOML loads them) and
    grt_titan's field checks on command-line arguments of the trainer."""
    return _job_config_problem(tuple(args))


@functools.lru_cache(maxsize=None)
def _job_config_problem(args: tuple[str, ...]) -> str | None:
    """Once per argument list: the docs repeat commands (52 parses, 39 distinct), and a parse
    takes torchtitan's parser about 0.4 s."""
    from grt_titan.config_checks import config_field_problems
    from grt_titan.job_config import GRTConfigManager

    with _quiet() as (_, err):
        try:
            config = GRTConfigManager().parse_args(list(args))
        except SystemExit as e:
            if e.code:
                return f"torchtitan's config parser: {err.getvalue().strip()[-400:]}"
            return None
        except Exception as e:  # noqa: BLE001  the message is the finding
            return f"torchtitan's config parser: {type(e).__name__}: {e}"
    problems = config_field_problems(config)
    return "; ".join(problems) if problems else None


@functools.lru_cache(maxsize=None)
def _flags_of_script(script: Path) -> frozenset[str]:
    """Option strings a script declares with `add_argument` (read with ast, not run), its own
    and those of the functions it imports from a module beside it (a shared helper such as
    benchmarks/retrofit_real.py's `add_source_arguments`)."""
    tree = ast.parse(script.read_text())
    flags = _added_arguments(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        sibling = script.parent / f"{node.module.rsplit('.', 1)[-1]}.py"
        if sibling.is_file():
            imported = {alias.name for alias in node.names}
            for helper in ast.parse(sibling.read_text()).body:
                if isinstance(helper, ast.FunctionDef) and helper.name in imported:
                    flags |= _added_arguments(helper)
    return frozenset(flags)


def _added_arguments(tree: ast.AST) -> set[str]:
    flags: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags |= {
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
            }
    return flags


def _git_ignored(path: str) -> bool:
    """A path a documented command writes (a git-ignored output folder), not a repository file."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0


def _subcommand_parser(name: str) -> argparse.ArgumentParser:
    from grt_titan.cli import COMMANDS

    module = importlib.import_module(COMMANDS[name][0])
    return module.build_parser()


def _pip_problem(args: list[str]) -> str | None:
    for arg in args:
        m = re.search(r"\.\[([\w,-]+)\]", arg)
        if m is None:
            continue
        extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        missing = [e for e in m.group(1).split(",") if e not in extras]
        if missing:
            return f"pip extra(s) {missing} not in pyproject.toml (has {sorted(extras)})"
    return None


# `torchft_lighthouse --help` of torchft 0.2.0 (a Rust binary: no parser to import).
LIGHTHOUSE_FLAGS = {"--min_replicas", "--bind", "--join_timeout_ms", "--quorum_tick_ms", "--heartbeat_timeout_ms"}


def host_0_3_problem(args: list[str]) -> str | None:
    """A torchtitan 0.3 command (`--module grt_titan --config NAME ...`): the module and the
    preset here; its other flags by 0.3's own parser in the 0.3 lane
    (tests/torchtitan_0_3/test_docs_commands.py)."""
    from grt_titan.torchtitan_0_3.presets import presets, unknown_preset

    module = args[args.index("--module") + 1] if args.index("--module") + 1 < len(args) else None
    if module != "grt_titan":
        return f"--module {module!r}: grt_titan's docs run --module grt_titan"
    config = args[args.index("--config") + 1] if "--config" in args[:-1] else None
    return None if config in presets() else unknown_preset(str(config))


def command_problems(cmd: list[str]) -> list[str]:
    """What is wrong with one simple command: repository paths that do not exist, flags or
    TOML keys its program does not know. Programs the docs have no business naming fail."""
    cmd = _strip_env(cmd)
    if not cmd:
        return []
    problems = []
    for tok in cmd:
        value = tok.split("=", 1)[1] if tok.startswith("--") and "=" in tok else tok
        if value.startswith(REPO_DIRS) and not glob.glob(str(REPO / value)) and not _git_ignored(value):
            problems.append(f"{value} does not exist in the repository")
    prog, args = cmd[0], cmd[1:]
    problem: str | None = None
    if prog in (".", "source", "cd", "export", "mkdir"):
        pass
    elif prog == "pip":
        problem = _pip_problem(args)
    elif prog == "torchrun":
        from torch.distributed.run import get_args_parser

        with _quiet():
            try:
                ns = get_args_parser().parse_args(args)
            except SystemExit:
                ns = None
        if ns is None:
            problem = "torchrun rejects its arguments"
        elif ns.module and ns.training_script == "torchtitan.train" and "--module" in ns.training_script_args:
            problem = host_0_3_problem(ns.training_script_args)
        elif ns.module and ns.training_script in TRAIN_MODULES:
            problem = job_config_problem(ns.training_script_args)
        else:
            problem = f"torchrun runs {ns.training_script!r}, not one of {TRAIN_MODULES} with -m"
    elif prog in ("python", "python3"):
        if args[:1] == ["-m"]:
            module, rest = args[1], args[2:]
            if module in TRAIN_MODULES:
                problem = job_config_problem(rest)
            elif module == "pytest":
                pass  # its paths are checked above
            elif module in SETUP_MODULES:
                problem = _pip_problem(rest) if module == "pip" else None
            elif importlib.util.find_spec(module.split(".")[0]) is None:
                problem = f"python -m {module}: no such module"
        elif args and args[0].endswith(".py"):
            script = REPO / args[0]
            if script.is_file():
                flags = _flags_of_script(script)  # read once per script: each read walks its tree
                unknown = [a.split("=")[0] for a in args[1:] if a.startswith("--") and a.split("=")[0] not in flags]
                if unknown:
                    problem = f"{args[0]} has no option(s) {unknown}"
        else:
            problem = f"python {' '.join(args[:2])}: expected -m MODULE or a script"
    elif prog == "pytest":
        pass
    elif prog == "grt-titan":
        from grt_titan.cli import COMMANDS

        if not args or args[0] not in COMMANDS:
            problem = f"grt-titan {args[:1]}: not a subcommand ({', '.join(COMMANDS)})"
        else:
            bad = _argparse_problem(_subcommand_parser(args[0]), args[1:])
            problem = bad
    elif prog.endswith(".sh") and (REPO / prog).is_file():  # a repository shell script
        syntax = subprocess.run(["bash", "-n", str(REPO / prog)], capture_output=True, text=True)
        declared = set(re.findall(r"(--[\w-]+)\)", (REPO / prog).read_text()))  # case "$1" in --flag)
        unknown = [a for a in args if a.startswith("--") and a not in declared]
        if syntax.returncode:
            problem = f"{prog}: bash -n: {syntax.stderr.strip()}"
        elif unknown:
            problem = f"{prog} has no option(s) {unknown} (it declares {sorted(declared)})"
    elif prog == "torchft_lighthouse":  # torchft's lighthouse (the [ft] extra): its `--help` flags
        unknown = [a.split("=")[0] for a in args if a.startswith("--") and a.split("=")[0] not in LIGHTHOUSE_FLAGS]
        if unknown or "--min_replicas" not in args:
            problem = f"torchft_lighthouse: unknown {unknown} or no --min_replicas (it has {sorted(LIGHTHOUSE_FLAGS)})"
    elif prog.startswith("--"):  # a fragment of trainer options
        problem = job_config_problem(["--job.config_file", "train_configs/grt_debug.toml", *cmd])
    else:
        problem = (
            f"unknown program {prog!r} (tests/docs/docs_helpers.py knows how to check: torchrun, "
            "python, pytest, pip, grt-titan, torchft_lighthouse, repository .sh scripts, trainer options)"
        )
    if problem:
        problems.append(problem)
    return problems


def shell_problems(script: str) -> list[str]:
    """`bash -n` syntax, then every command of the block."""
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    problems = [f"bash -n: {proc.stderr.strip()}"] if proc.returncode else []
    for line in logical_lines(script):
        try:
            cmds = commands(line)
        except ValueError as e:
            problems.append(f"{line!r}: {e}")
            continue
        problems += [f"{' '.join(c)[:100]}: {p}" for c in cmds for p in command_problems(c)]
    return problems


# ---- TOML and Python --------------------------------------------------------------------


def toml_problems(text: str, tmp_dir: Path) -> list[str]:
    """A TOML fragment parsed by tomllib, then by torchtitan's config loader with grt_titan's
    sections (unknown sections or keys, wrong types, values outside a Literal's choices)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return [f"tomllib: {e}"]
    if "custom_config_module" not in data.get("job", {}):
        # Fragments of grt_titan's sections assume the TOML loads them (docs/training.md).
        text = (
            text.replace("[job]", '[job]\ncustom_config_module = "grt_titan.job_config"', 1)
            if "job" in data
            else '[job]\ncustom_config_module = "grt_titan.job_config"\n' + text
        )
    path = tmp_dir / "fragment.toml"
    path.write_text(text)
    problem = job_config_problem(["--job.config_file", str(path)])
    return [problem] if problem else []


def python_problems(text: str) -> list[str]:
    try:
        tree = compile(text, "<block>", "exec", flags=ast.PyCF_ONLY_AST)
    except SyntaxError as e:
        return [f"python syntax: {e}"]
    problems = []
    for node in ast.walk(tree):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.module
            else []
        )
        for name in names:
            if importlib.util.find_spec(name.split(".")[0]) is None:
                problems.append(f"import {name}: not installed")
    return problems


def block_problems(block: Block, tmp_dir: Path) -> list[str]:
    """Static checks of one block (every `run` and `check` block; `$ ` lines of output)."""
    if block.kind == "output":
        lines = [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
        return shell_problems("\n".join(lines)) if lines else []
    if block.lang in SHELL_LANGS:
        return shell_problems(block.text)
    if block.lang == "toml":
        return toml_problems(block.text, tmp_dir)
    if block.lang == "python":
        return python_problems(block.text)
    return [f"nothing checks a {block.lang!r} block"]


# ---- running ----------------------------------------------------------------------------


def runnable_script(block: Block) -> str:
    """The shell script a `run` block becomes: each command as printed, plus the marker's
    cpu-scale arguments. Run blocks hold simple commands (no pipes, lists or redirections)."""
    lines = []
    for line in logical_lines(block.text):
        cmds = commands(line)
        if len(cmds) != 1 or re.search(r"[<>$`]", line.split(" #")[0]):
            raise ValueError(f"{block.where}: a run block holds one simple command per line: {line!r}")
        lines.append(shlex.join(cmds[0] + block.cpu_scale))
    return "\n".join(["set -euo pipefail", *lines]) + "\n"


def is_trainer(block: Block) -> bool:
    return any(m in block.text for m in TRAIN_MODULES)


def sys_executable_dir() -> str:
    return str(Path(sys.executable).parent)
