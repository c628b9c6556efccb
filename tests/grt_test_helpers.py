"""Shared test helpers: torchrun on CPU (gloo) and the one-process entry point, torchtitan's
step lines and config, a small model."""

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import torch

from grt_titan.model.methods import table as methods

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `tests.launcher`, `tests.<folder>.<worker>` job modules
    sys.path.insert(0, str(REPO))

from tests.launcher import free_port, job_env, launch, rank_environment  # noqa: E402

DEBUG_TOML = REPO / "train_configs" / "grt_debug.toml"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.naninf]+)\s+grad_norm:\s*([0-9.naninf]+)")
MESH_LINE = re.compile(r"Building device mesh with parallelism: .*")  # torchtitan's ParallelDims
# torchtitan's registered model converters, as a config error lists them ("allowed: ...").
REGISTERED_CONVERTERS = "quantize.grouped_mm.float8, quantize.grouped_mm.mx, quantize.linear.float8, quantize.linear.mx"
# What torchao's import (by transformers) printed on a CPU torch before grt_titan/runtime/quiet_imports.py:
# CUDA libraries that cannot load, enum deprecations. Consoles of the CLI and the decoding
# benchmarks show none of it.
TORCHAO_IMPORT_NOISE = ("Failed to load", "_C_mxfp8", "_C_cutlass_90a", "register_constant()")

# torch 2.13's torchrun reuses one rendezvous TCPStore across restarts, and restarted workers
# can read the previous attempt's addresses (gloo/NCCL "connection refused"; pytorch#135712,
# #167288). Every launch with --max-restarts needs this (docs/reliability.md).
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun_command(
    nproc: int, args: list[str], module: str = "grt_titan.train", max_restarts: int | None = None
) -> list[str]:
    """`torchrun --nproc_per_node=nproc [--max-restarts=N] -m module args`: rank 0's output, or
    with restarts every rank's. A rank that raises makes the agent stop the others, so the rank
    that prints why (a spike's rewind, a planted failure) may be stopped first if it is rank 0:
    seen once in CI, a rewind test missing rank 0's message."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
    ]
    if max_restarts is None:
        cmd.append("--local-ranks-filter=0")
    else:
        cmd.append(f"--max-restarts={max_restarts}")
    return [*cmd, "-m", module, *args]


def restart_command(nproc: int, args: list[str], module: str, max_restarts: int, env: dict) -> tuple[list[str], dict]:
    """torchrun's own agent with `--max-restarts`, as (command, environment). Each rank it
    starts (and restarts) is `python -m tests.launcher call MODULE ARGS`: a rank forked by the
    launcher's server in the agent's rank environment, its exit (a signal's too) the agent's to
    see, the agent's SIGTERM passed on (tests/launcher.py `call`). A rank would otherwise be an
    interpreter start importing torchtitan, about 9 s of CPU on CI's cores, four per run.
    Without the server (GRT_TEST_LAUNCH_SERVER=0, or an environment it cannot fork for) the
    agent starts `python -m MODULE` itself."""
    from tests.launcher import _SERVER, SOCKET_ENV, served

    env = job_env({**RESTART_ENV, **env})
    if not served(module, args, env):
        return torchrun_command(nproc, args, module, max_restarts), env
    command = torchrun_command(nproc, ["call", module, *args], "tests.launcher", max_restarts)
    return command, {**env, SOCKET_ENV: _SERVER.socket_path()}


# Relative tolerance between the grad norms that torchtitan logs for two layouts (or 1 and 2
# ranks) of one run on CPU. torch's CPU float32 L2 norm keeps one float32 accumulator per tensor
# (pytorch#169237, still open in 2.13), so its error grows with the tensor and differs between a
# whole tensor and its shard: on 50257 x 128 random values (GPT-2's LM head at d = 128) it is
# 1.8e-4 relative, on a quarter of them 2.2e-5. Measured between layouts
# (tests/infra/test_parallel_parity.py): 1e-6 at step 1 and up to 5.0e-4 (FSDP2 x TP2 against 1
# rank, step 4) while the losses agree to 1e-7. A missing or doubled shard moves the norm by
# more than 1e-2; the gradients themselves are compared in float64 there, to 1e-5.
LOGGED_GRAD_NORM_REL = 2e-3


# A short grt_debug training run: sequence 64, every step logged, no validation. Tests add
# their steps, layout and options.
SHORT_DEBUG_RUN = [
    "--job.config_file",
    "train_configs/grt_debug.toml",
    "--training.seq_len",
    "64",
    "--metrics.log_freq",
    "1",
    "--validation.no-enable",
]


def parts_overrides(parts: dict) -> list[str]:
    """A parts dict as `[grt]` command-line overrides (`--grt.key value ...`)."""
    return [item for key, value in parts.items() for item in (f"--grt.{key}", str(value))]


# The baselines' and ladder's parts at debug size: their rows' parts in the table of methods
# (grt_titan/model/methods/table.py; docs/architecture.md, "Methods as parts"), without the rows' paper
# settings (no truncated backprop for Poisson, MoR's default delta update), RRT at LoRA rank 3.
LADDER_PARTS = dict(methods.paper_method("ladder_3_prelude_coda").parts)
POISSON_PARTS = dict(methods.POISSON.parts)
RRT_PARTS = dict(methods.RRT.parts, lora_rank=3)
# Mixture-of-Recursions: routed steps, no re-injection, no gate, no noise, fixed depth R.
MOR_PARTS = dict(methods.MOR.parts)
MOR_OVERRIDES = parts_overrides(MOR_PARTS)
OURO_PARTS = dict(methods.OURO.parts)
SCSE_PARTS = dict(methods.SCSE.parts, block_style="llama")  # its paper's bias-free core


# A gloo rank of a finished job can abort (SIGABRT) while the process tears down, after
# torchtitan's rank 0 has left the training loop (pytorch#179291: gloo worker threads outlive
# the interpreter's finalization). Seen once (rank 1, exit code -6, all 20 steps logged) in a
# full CI run on 2 busy cores. Such a run is repeated once from the same starting files; any other failure is not.
# Also seen (docs/tasks.md's run, 2026-12-04): rank 1 aborting with C++'s "terminate called
# without an active exception" right after the last step's validation, before rank 0 logged
# its sleep.
TEARDOWN_ABORT = ("Sleeping 2 seconds for other ranks to complete", "(SIGABRT)")
THREAD_TERMINATE = "terminate called without an active exception"


def is_teardown_abort(output: str) -> bool:
    """The gloo teardown abort above: SIGABRT after training ended, by either signature."""
    # torchrun's agent: "Signal 6 (SIGABRT)", "exitcode: -6"; tests/launcher.py: "exit code -6
    # (signal 6, SIGABRT)", which "(SIGABRT)" alone never matched, so no forked run was repeated.
    aborted = "SIGABRT)" in output or "exitcode: -6" in output
    return aborted and (TEARDOWN_ABORT[0] in output or THREAD_TERMINATE in output)


def _dump_folder(args: list[str]) -> Path | None:
    if "--job.dump_folder" not in args:
        return None
    folder = Path(args[args.index("--job.dump_folder") + 1])
    return folder if folder.is_absolute() else REPO / folder


def torchrun(
    nproc: int,
    args: list[str],
    tmp_path: Path,
    timeout: int = 600,
    module: str = "grt_titan.train",
    env: dict | None = None,
    max_restarts: int | None = None,
    log_name: str = "torchrun.log",
) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=nproc -m module args` from the repo root; output appended to
    tmp_path / log_name. Repeated once after a TEARDOWN_ABORT, from a copy of the dump folder
    as it was before (a resumed run resumes from the same checkpoint again).

    The ranks are forked by tests/launcher.py (same ranks, environment and output as torchrun,
    a fraction of the CPU of a small run on CI); with `max_restarts`, torchrun's real agent,
    which restarts need (RESTART_ENV set), its ranks forked by the server too (restart_command)."""
    dump = _dump_folder(args)
    backup = None
    if dump is not None and dump.exists():
        backup = Path(tempfile.mkdtemp(prefix="grt-dump-backup-")) / "dump"  # not inside the dump
        shutil.copytree(dump, backup)
    tmp_path.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):
        if max_restarts is not None:
            command, restart_env = restart_command(nproc, args, module, max_restarts, env or {})
            proc = subprocess.run(
                command,
                cwd=REPO,
                env=restart_env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        else:
            proc = launch(module, args, job_env(env), timeout, nproc=nproc)
        output = proc.stdout + proc.stderr
        with open(tmp_path / log_name, "a") as f:
            f.write(output)
        if proc.returncode == 0 or attempt == 2 or not is_teardown_abort(output):
            break
        with open(tmp_path / log_name, "a") as f:
            f.write("\n[grt_test_helpers] a rank aborted in teardown (pytorch#179291); running once more\n")
        if dump is not None:
            shutil.rmtree(dump, ignore_errors=True)
            if backup is not None:
                shutil.copytree(backup, dump)
    if backup is not None:
        shutil.rmtree(backup.parent, ignore_errors=True)
    return proc


def one_process(
    args: list[str], env: dict | None = None, timeout: int = 120, module: str = "grt_titan.train"
) -> subprocess.CompletedProcess:
    """`python -m module args` from the repo root as rank 0 of a one-process job, no torchrun
    (`env` may set NGPU and WORLD_SIZE for a fake-backend world)."""
    return launch(module, args, job_env({**rank_environment(0, 1, free_port()), **(env or {})}), timeout)


def worker_env(test_file: str) -> dict[str, str]:
    """The environment of a test's own torchrun worker module: it imports from the test's
    folder (its helpers) and from tests/ (grt_test_helpers)."""
    here = os.path.dirname(os.path.abspath(test_file))
    return {"PYTHONPATH": os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])}


def worker_result(test_file: str, module: str, tmp_path: Path, nproc: int = 2):
    """Runs a test's own worker `module` (beside `test_file`) on `nproc` gloo ranks, its one
    argument the JSON file it writes; that JSON, once the run exits 0."""
    out = tmp_path / f"{module}.json"
    proc = torchrun(nproc, [str(out)], tmp_path, timeout=300, module=module, env=worker_env(test_file))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(out.read_text())


def recompiles_after_step_1(output: str) -> list[str]:
    """`TORCH_LOGS=recompiles` lines logged after step 1 finished.

    The first step compiles every distinct module once. torchtitan's checkpoint wrapper is
    one code object for every wrapped module, so the second module it wraps (with another
    arity) is logged as a recompile of it; that happens inside step 1. Later steps sample
    other depths r and must compile nothing.
    """
    step_1 = re.search(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ .*step:\s+1\s", output)
    assert step_1, output[-2000:]
    done = datetime.strptime(step_1.group(1), "%Y-%m-%d %H:%M:%S")
    late = []
    for match in re.finditer(r"[VWI](\d{2})(\d{2}) (\d\d:\d\d:\d\d)\.\d+ .*Recompiling function.*", output):
        month, day, clock = match.groups()
        when = datetime.strptime(f"{done.year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S")
        if when > done:
            late.append(match.group(0))
    return late


def mesh_degrees(output: str) -> dict[str, int] | None:
    """The parallel degrees torchtitan built its device mesh with (pp, dp_replicate, dp_shard,
    cp, tp, ep, etp), from a job's output; None if it logged no mesh."""
    mesh = MESH_LINE.search(output)
    return None if mesh is None else {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", mesh.group(0))}


def step_losses(output: str) -> dict[int, float]:
    output = ANSI.sub("", output)
    return {int(m.group(1)): float(m.group(2)) for m in STEP_LINE.finditer(output)}


def parse_config(*overrides: str, path: Path = DEBUG_TOML):
    """torchtitan's JobConfig of a TOML (default grt_debug) with command-line overrides: a copy
    of the parse of that TOML's text and those overrides, parsed once per session (a parse
    takes torchtitan's parser about 0.4 s; the fast tests asked for 186 parses, 144 distinct)."""
    return copy.deepcopy(_parsed(str(path), Path(path).read_text(), overrides))


@functools.lru_cache(maxsize=None)
def _parsed(path: str, text: str, overrides: tuple[str, ...]):
    from grt_titan.job_config import GRTConfigManager

    del text  # in the key: a TOML rewritten under the same path is parsed again
    return GRTConfigManager().parse_args(["--job.config_file", path, *overrides])


def one_rank_dims():
    """torchtitan's ParallelDims of a single rank (no parallelism)."""
    from torchtitan.distributed import ParallelDims

    return ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)


def build_model(flavor="debug", seed: int = 0, *, before_init=None, **changes):
    """A GRT model from a flavor name or a GRTModelArgs, with `changes`: built on meta by the
    package's build_meta_model, `before_init(model)` applied there (converters, FSDP), then
    materialised on CPU, initialised from `seed` and returned in train mode."""
    from grt_titan.model import grt_flavors
    from grt_titan.model.model import build_meta_model

    model = build_meta_model((grt_flavors[flavor] if isinstance(flavor, str) else flavor).replace(**changes))
    if before_init is not None:
        before_init(model)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights()
    return model.train()


def nonzero_biases(module: torch.nn.Module, std: float = 0.1) -> None:
    """Give `module`'s biases a trained model's nonzero values (GPT-2 blocks start them at 0,
    where the core still maps 0 to 0; trained, G(0) != 0)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, std)


def flip_byte(file, where: float = 0.5) -> None:
    """Invert one byte of a file at the fraction `where` of its length (a silent disk corruption)."""
    n = os.path.getsize(file)
    with open(file, "r+b") as f:
        f.seek(int(n * where))
        b = f.read(1)
        f.seek(int(n * where))
        f.write(bytes([b[0] ^ 0xFF]))


def matmul_flops(model, tokens, **forward_kwargs) -> int:
    """FLOPs of one forward's matmuls as torch's FlopCounterMode counts them (the CPU SDPA
    kernel is not counted: compare with eq. 1 minus its attention terms)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(tokens, **forward_kwargs)
    return sum(v for k, v in counter.get_flop_counts()["Global"].items() if "mm" in str(k))


def same_values(a: dict, b: dict) -> bool:
    """Two flat dicts (state dicts, optimizer states) hold the same keys and equal values."""
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def write_token_dataset(root: Path, tokenizer, splits: dict, shard_tokens: int, val_fraction: float) -> Path:
    """A prepared dataset (shards + manifest, as `grt-titan prepare` writes) holding the given
    token arrays per split, for tests that need exact control of the tokens."""
    from grt_titan.data import shards as sh

    root.mkdir(parents=True, exist_ok=True)
    dtype = sh.dtype_for_vocab(tokenizer.get_vocab_size())
    written = {}
    for split, tokens in splits.items():
        writer = sh.ShardWriter(root, split, shard_tokens, dtype)
        writer.write(tokens)
        written[split] = writer.close()
    sh.write_manifest(
        root,
        {
            "format": sh.FORMAT_NAME,
            "version": sh.FORMAT_VERSION,
            "tokenizer": {
                "name": tokenizer.name,
                "sha256": tokenizer.sha256,
                "vocab_size": tokenizer.get_vocab_size(),
                "eot_id": tokenizer.eos_id,
            },
            "dtype": dtype.name,
            "document_separator": "eot_after_each_document",
            "inputs": ["synthetic"],
            "text_field": "text",
            "val_fraction": val_fraction,
            "shard_tokens": shard_tokens,
            "documents": 1,
            "skipped_documents": {"invalid_utf8": 0, "empty": 0},
            "splits": written,
        },
    )
    return root


# ---- retrofit presets: a stand-in for the source folder CI does not hold ----------------------

# The source folder's name (the last part of the preset's hf_assets_path) -> its tokenizer's
# (byte-level BPE tokens, added tokens). Qwen3: 151,643 + 26 = 151,669 ids, fewer than its
# 151,936 embedding rows (the source's own layout, docs/retrofit.md).
SOURCE_TOKENIZERS = {"Qwen3-0.6B": (151_643, 26)}


# `grt-titan task vocab`'s folder (docs/tasks.md), which grt_task_loops reads: CI writes it
# with the same command (`task_recipe_args`), so it needs no stand-in.
TASK_VOCAB = "data/tasks/vocab"


def source_tokenizer(path: Path) -> tuple[int, int] | None:
    """The tokenizer shape of the source a retrofit preset reads; None for other presets (their
    tokenizer, if they name one, ships in grt_titan/assets)."""
    import tomli

    from grt_titan.tokenizer import ASSETS_DIR

    hf_assets_path = tomli.loads(path.read_text()).get("model", {}).get("hf_assets_path")
    if hf_assets_path in (None, TASK_VOCAB) or Path(hf_assets_path).parent == ASSETS_DIR.relative_to(REPO):
        return None
    name = Path(hf_assets_path).name
    assert name in SOURCE_TOKENIZERS, f"{path.name}: add the tokenizer of {name} to SOURCE_TOKENIZERS"
    return SOURCE_TOKENIZERS[name]


def write_stand_in_tokenizer(folder: Path, bpe_tokens: int, added_tokens: int) -> Path:
    """A Hugging Face tokenizer folder with `bpe_tokens + added_tokens` ids: a byte-level BPE
    without merges (the 256 byte symbols, then unused tokens) and the added tokens after it,
    `<|endoftext|>` (the EOS) first, as Qwen3's. Built in well under a second."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({f"<unused_{i}>": i for i in range(len(vocab), bpe_tokens)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    added = ["<|endoftext|>", *(f"<|added_{i}|>" for i in range(1, added_tokens))]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in added])
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}) + "\n")
    return folder


STAND_IN_TEACHER_CONFIG = REPO / "train_configs" / "dense_debug.toml"


def distill_teacher(path: Path) -> str | None:
    """The preset's `[distill] teacher`; None for a preset without distillation."""
    import tomli

    return tomli.loads(path.read_text()).get("distill", {}).get("teacher") or None


def teaches_its_retrofit(path: Path) -> bool:
    """A retrofit preset distilled from its own source: `[distill] teacher` is the folder its
    `[model] hf_assets_path` names (the source's tokenizer and weights)."""
    import tomli

    teacher = distill_teacher(path)
    return teacher is not None and teacher == tomli.loads(path.read_text()).get("model", {}).get("hf_assets_path")


def stand_in_source_tokenizer(path: Path, tmp: Path) -> Path:
    """A retrofit preset's stand-in tokenizer (`write_stand_in_tokenizer`, the source
    tokenizer's size) in `tmp`, written once however many stand-ins ask for it."""
    folder = tmp / f"{path.stem}-tokenizer"
    return folder if folder.is_dir() else write_stand_in_tokenizer(folder, *source_tokenizer(path))


def stand_in_teacher_args(path: Path, tmp: Path) -> list[str]:
    """For a distillation preset, a teacher in place of the one the preset names: for a
    retrofit preset distilled from its source, a stock folder of the source's kind and
    vocabulary with the stand-in tokenizer (one small layer, random weights: the preset's
    source architecture at d = 64); otherwise a dense_debug teacher (random weights; a step
    folder as tests/components/test_distill.py writes it)."""
    if distill_teacher(path) is None:
        return []
    if teaches_its_retrofit(path):
        import tomli

        from grt_titan.hf.stock_folders import write_stock_folder
        from grt_titan.model.flavors import flavor_from_file

        folder = tmp / f"{path.stem}-teacher"
        if not folder.is_dir():
            source = flavor_from_file(str(REPO / tomli.loads(path.read_text())["model"]["flavor"]))
            args = source.replace(
                **dict(dim=64, n_heads=2, n_kv_heads=2, attention_head_dim=32, ffn_dim=128),
                **dict(n_prelude_layers=1, n_core_layers=0, n_coda_layers=0),
            )
            state = build_model(args, seed=3).state_dict()
            write_stock_folder(folder, state, args, tokenizer_path=stand_in_source_tokenizer(path, tmp))
        return ["--distill.teacher", str(folder)]
    return dense_teacher_args(tmp / f"{path.stem}-teacher", preset_vocab_size(path))


def preset_vocab_size(path: Path) -> int:
    """The vocabulary of a preset's named flavor (its tokenizer's ids)."""
    import tomli

    from grt_titan.model import grt_flavors

    return grt_flavors[tomli.loads(path.read_text())["model"]["flavor"]].vocab_size


def dense_teacher_args(folder: Path, vocab_size: int | None = None) -> list[str]:
    """A dense_debug teacher (random weights, seed 3) written to `folder` as a torchtitan step
    folder, and the `[distill]` arguments that name it with its TOML. `vocab_size`: a student's
    other than dense_debug's (gpt2_4k.tiktoken's), e.g. GPT-2's: the teacher's TOML then names a
    flavor file of dense_debug's args over that vocabulary, and the GPT-2 tokenizer."""
    import dataclasses
    import json

    from grt_titan.checkpoints.load import save_checkpoint
    from grt_titan.model import grt_flavors

    args, config = grt_flavors["dense_debug"], STAND_IN_TEACHER_CONFIG
    if vocab_size not in (None, args.vocab_size):
        args = args.replace(vocab_size=vocab_size)
        folder.mkdir(parents=True, exist_ok=True)
        flavor = folder / "model_args.json"
        flavor.write_text(json.dumps({f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}))
        lines = [line for line in config.read_text().splitlines() if not line.startswith("hf_assets_path")]
        config = folder / "teacher.toml"
        config.write_text("\n".join(lines).replace('flavor = "dense_debug"', f'flavor = "{flavor}"') + "\n")
    save_checkpoint(folder / "step-0", build_model(args, seed=3).state_dict())
    return ["--distill.teacher", str(folder), "--distill.teacher_config", str(config)]


def no_initial_weights_args(path: Path) -> list[str]:
    """For a preset that starts from weights its user makes (a retrofit preset's `[checkpoint]
    initial_load_path`: `grt-titan retrofit`'s output), none: CI holds no such folder, and a
    start that would load a missing one stops, with checkpointing off too
    (grt_titan.checkpoints.start_load.initial_load_problems). Empty for the other presets."""
    import tomli

    initial = tomli.loads(path.read_text()).get("checkpoint", {}).get("initial_load_path")
    return ["--checkpoint.initial_load_path", ""] if initial else []


def stand_in_dataset_args(path: Path, tmp: Path) -> list[str]:
    """For a preset that trains on a prepared folder of its own (grt_task_debug's task data,
    which its docs make with `grt-titan task` and `prepare`, docs/tasks.md): a token dataset of
    GPT-2 ids in its place (the layout is what runs here; the task data's own path, packed
    records and masked loss, is tests/analysis/test_task_eval.py's and the docs' run). A preset
    over the task's word vocabulary gets its docs' data instead (`task_recipe_args`)."""
    import tomli

    config = tomli.loads(path.read_text())
    if config["training"].get("dataset", "grt_default") == "grt_default" or source_tokenizer(path) is not None:
        return []
    if config["model"].get("hf_assets_path") == TASK_VOCAB:
        return task_recipe_args(path, tmp)
    from grt_titan.tokenizer import GPT2Tokenizer

    tokenizer = GPT2Tokenizer()
    import numpy as np

    tokens = np.arange(1 << 12, dtype=np.int64) * 7919 % tokenizer.get_vocab_size()
    splits = {"train": tokens, "val": tokens[:512]}
    data = write_token_dataset(tmp / f"{path.stem}-data", tokenizer, splits, shard_tokens=1 << 13, val_fraction=0.0)
    return ["--training.dataset", str(data), "--validation.dataset", str(data)]


def task_recipe_args(path: Path, tmp: Path) -> list[str]:
    """For a preset over the task's word vocabulary (grt_task_loops): its docs' data at a small
    size, made by the same commands (`grt-titan task vocab`, `task iterated-function`,
    `prepare`), so per-step supervision has its targets."""
    from grt_titan.cli import main

    folder = tmp / f"{path.stem}-data"
    vocab, records = folder / "vocab", folder / "train.jsonl"
    if not (folder / "data").is_dir():
        assert main(["task", "vocab", "--out", str(vocab)]) == 0
        task = ["--symbols", "10", "--depths", "8-8", "--table", "edges", "--depth-given", "loops"]  # fits seq_len 16
        assert main(["task", "iterated-function", *task, "--n", "64", "--out", str(records)]) == 0
        prepare = ["prepare", str(records), "--tokenizer", str(vocab), "--out", str(folder / "data")]
        assert main([*prepare, "--val-fraction", "0.1"]) == 0
    return ["--model.hf_assets_path", str(vocab), "--training.dataset", str(folder / "data")]


def stand_in_overrides(path: Path, tmp: Path) -> list[str]:
    """Command-line overrides that let a shipped TOML start here: a retrofit preset's source
    tokenizer (a stand-in of its size, `stand_in_source_tokenizer`) without its retrofitted
    weights (`no_initial_weights_args`), and a distillation preset's teacher
    (`stand_in_teacher_args`), a preset's own prepared dataset (`stand_in_dataset_args`);
    none for the others."""
    tokenizer = (
        [] if source_tokenizer(path) is None else ["--model.hf_assets_path", str(stand_in_source_tokenizer(path, tmp))]
    )
    return [
        *tokenizer,
        *no_initial_weights_args(path),
        *stand_in_teacher_args(path, tmp),
        *stand_in_dataset_args(path, tmp),
    ]


def import_benchmark(monkeypatch, name: str):
    """A script of benchmarks/ imported as a module, for a test fixture to `yield from`: the
    import path is the test's, and the module is forgotten after it."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    yield importlib.import_module(name)
    sys.modules.pop(name, None)
