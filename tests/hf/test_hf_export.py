"""`grt-titan export-hf` / `import-hf`: folder contents, round trips, sharding, bad input."""

import ast
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from grt_titan.checkpoints.load import load_checkpoint, save_checkpoint
from grt_titan.cli import main as cli
from grt_titan.hf.convert import REMOTE_CODE_FILES, REMOTE_DIR, SINGLE_FILE, write_hf_folder
from grt_titan.model.state_dict_adapter import TRAINING_ONLY_KEYS

from grt_test_helpers import TORCHAO_IMPORT_NOISE
from hf_helpers import ATOL, decode_logits, load_hf, prompt, seeded_model, small_args

# The remote code: every file of grt_titan/hf/remote/ but its __init__.py (the configuration,
# the model and the files it imports: exactly those transformers loads, tests/hf/test_hf_copies.py).
REMOTE_CODE = {p.name for p in REMOTE_DIR.iterdir() if p.is_file() and p.name != "__init__.py"}
EXPECTED_FILES = REMOTE_CODE | {
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "README.md",
}


def test_the_remote_code_is_its_folders_files():
    """export-hf copies grt_titan/hf/remote/'s file list, which holds the remote code and
    nothing else (no stray file, no subfolder)."""
    assert set(REMOTE_CODE_FILES) == REMOTE_CODE and len(REMOTE_CODE_FILES) == len(REMOTE_CODE)
    assert all(name.endswith("_grt.py") for name in REMOTE_CODE), sorted(REMOTE_CODE)
    assert not [p.name for p in REMOTE_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"]


def test_export_folder(debug_export, debug_checkpoint):
    assert {p.name for p in debug_export.iterdir()} == EXPECTED_FILES
    for name in REMOTE_CODE:  # verbatim: the folder's bytes
        assert (debug_export / name).read_bytes() == (REMOTE_DIR / name).read_bytes(), name
    config = json.loads((debug_export / "config.json").read_text())
    assert config["model_type"] == "grt"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_grt.GRTConfig",
        "AutoModelForCausalLM": "modeling_grt.GRTForCausalLM",
    }
    assert config["architectures"] == ["GRTForCausalLM"]
    assert (config["num_prelude_layers"], config["num_core_layers"], config["num_coda_layers"]) == (1, 2, 1)
    assert config["num_recurrences"] == 4 and config["tie_word_embeddings"] is True
    # R and the default depth under the training args' names (None: R); no old key.
    assert config["eval_recurrences"] is None and "train_recurrences" not in config
    # BOS / EOS / pad: the tokenizer's <|endoftext|> (gpt2_4k.tiktoken's: 4096).
    generation = json.loads((debug_export / "generation_config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == 4096
    assert generation["bos_token_id"] == generation["eos_token_id"] == generation["pad_token_id"] == 4096
    siblings = {name.removesuffix(".py") for name in REMOTE_CODE}
    for name in REMOTE_CODE:  # self-contained remote code: torch, transformers and each other
        tree = ast.parse((debug_export / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert {m.split(".")[0] for m in imported} <= {
            "__future__",
            "math",
            "dataclasses",
            "torch",
            "transformers",
        } | siblings, imported
    card = (debug_export / "README.md").read_text()
    assert "1 + 2x4 + 1" in card and "training steps: 60" in card
    assert "training tokens: 61,440 (train_state" in card and "validation loss: 5.2500" in card
    # Exported from absolute paths: the card shows none (checkpoint: its last two parts).
    assert str(debug_export.parent) not in card and str(debug_checkpoint[0].parent) not in card
    assert "checkpoint: checkpoint/step-60" in card
    # The snippet loads the folder by name, the tokenizer with the flag that avoids the prompt
    # (it runs verbatim in tests/docs).
    assert 'AutoTokenizer.from_pretrained("grt_debug", trust_remote_code=True)' in card
    _, native = debug_checkpoint
    stored = sum(p.numel() for p in native.parameters())
    assert f"{stored / 1e6:.2f}M" in card


def test_qwen3_blocks_export_and_compute_torchtitans_logits(tmp_path):
    """A GRT of qwen3 blocks (a retrofitted Qwen3's, or a Qwen3-style run's: qk-norm, a head
    width other than d / heads, GQA, rotate-half RoPE) exports as model_type "grt": its logits
    at r = 1 and R + 2 and its cached decoding are the torchtitan model's, and import reads the
    args back."""
    from grt_titan.hf.config_map import model_args_from_hf_config

    args = small_args("qwen3")
    native = seeded_model(args)
    out = write_hf_folder(tmp_path / "qwen3", native.state_dict(), args, write_tokenizer=False)
    config = json.loads((out / "config.json").read_text())
    assert (config["block_style"], config["head_dim"], config["num_key_value_heads"]) == ("qwen3", 48, 2)
    assert model_args_from_hf_config(config) == args
    hf = load_hf(out)
    x, R = prompt(batch=2, seq=24, seed=3), args.num_recurrences
    with torch.no_grad():
        for r in (1, R + 2):
            diff = (hf(x, num_recurrences=r).logits - native(x, num_recurrences=r)).abs().max().item()
            assert diff < ATOL, f"r = {r}: {diff:.3g}"
        # The KV cache across recurrences keeps the qk-normed, rotated keys: decoding = the forward.
        cached, _ = decode_logits(hf, x[:1], "per_step", r=R)
        diff = (cached - native(x[:1], num_recurrences=R)[:, -cached.shape[1] :]).abs().max().item()
    assert diff < ATOL, f"cached decoding: {diff:.3g}"


def test_exported_model_loads_and_matches(debug_export, debug_checkpoint):
    _, native = debug_checkpoint
    hf = load_hf(debug_export)
    x = torch.randint(0, 4097, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(x).logits - native(x)).abs().max().item() < 1e-4


def test_export_import_export_round_trip(debug_export, debug_checkpoint, debug_config, tmp_path):
    folder, native = debug_checkpoint
    ckpt = tmp_path / "ft" / "checkpoint" / "step-0"
    assert cli(["import-hf", "--hf-dir", str(debug_export), "--out", str(ckpt), "--config", str(debug_config)]) == 0
    # import is exact, and gives torchtitan a complete model state (draws restarts at 0).
    args = native.model_args
    imported, _ = load_checkpoint(ckpt, args)
    original = native.state_dict()
    assert set(imported) == set(original)
    for key, value in original.items():
        if key in TRAINING_ONLY_KEYS:
            assert int(imported[key]) == 0
        else:
            assert torch.equal(imported[key], value), key
    again = tmp_path / "again"
    assert cli(["export-hf", "--checkpoint", str(ckpt), "--config", str(debug_config), "--out", str(again)]) == 0
    assert (again / SINGLE_FILE).read_bytes() == (debug_export / SINGLE_FILE).read_bytes()


def test_eos_is_the_export_tokenizers(tmp_path):
    """A `.tiktoken` of N ranks has `<|endoftext|>` = N: config.json, generation_config.json and
    the tokenizer files all say N (not GPT-2's 50256); a vocabulary without the id gets none."""
    from transformers import AutoTokenizer

    from grt_titan.model import grt_flavors
    from grt_titan.tokenizer import GPT2_TIKTOKEN_PATH

    ranks = tmp_path / "small.tiktoken"  # GPT-2's first 1000 ranks: a byte-level BPE of its own
    ranks.write_bytes(b"".join(GPT2_TIKTOKEN_PATH.read_bytes().splitlines(keepends=True)[:1000]))
    args = grt_flavors["debug"].replace(vocab_size=1001)
    out = write_hf_folder(tmp_path / "small", seeded_model(args).state_dict(), args, tokenizer_path=ranks)
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == 1000
    assert generation["bos_token_id"] == generation["eos_token_id"] == generation["pad_token_id"] == 1000
    assert AutoTokenizer.from_pretrained(str(out)).eos_token_id == 1000

    small = small_args("gpt2")  # 512 ids: no <|endoftext|> of the shipped tokenizer
    out = write_hf_folder(tmp_path / "none", seeded_model(small).state_dict(), small, write_tokenizer=False)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] is None
    assert "eos_token_id" not in json.loads((out / "generation_config.json").read_text())


def test_model_only_checkpoint_and_hf_format_checkpoint(debug_checkpoint, debug_config, tmp_path):
    """The layouts torchtitan writes with last_save_model_only and with last_save_in_hf."""
    from grt_titan.model.state_dict_adapter import GRTStateDictAdapter

    _, native = debug_checkpoint
    model_only = tmp_path / "checkpoint" / "step-7"
    save_checkpoint(model_only, native.state_dict())
    state, facts = load_checkpoint(model_only, native.model_args)
    assert facts == {"step": 7, "tokens_seen": None}
    hf_step = tmp_path / "hf" / "step-9"
    hf_step.mkdir(parents=True)
    from safetensors.torch import save_file

    adapter = GRTStateDictAdapter(native.model_args, None)
    save_file(
        {k: v.contiguous() for k, v in adapter.to_hf(native.state_dict()).items()},
        str(hf_step / "model-00001-of-00001.safetensors"),
    )
    out = tmp_path / "from_hf_step"
    assert (
        cli(
            ["export-hf", "--checkpoint", str(hf_step), "--config", str(debug_config), "--out", str(out), "--no-verify"]
        )
        == 0
    )
    from safetensors.torch import load_file

    exported = load_file(str(out / SINGLE_FILE))
    assert all(torch.equal(exported[k], v) for k, v in adapter.to_hf(state).items())
    assert "training steps: 9" in (out / "README.md").read_text()


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_sharded_weights(style, native_models, tmp_path):
    model = native_models[style]
    out = write_hf_folder(
        tmp_path / "sharded", model.state_dict(), model.model_args, write_tokenizer=False, max_shard_size="200KB"
    )
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 3 and not (out / SINGLE_FILE).exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    hf = load_hf(out)
    x = torch.randint(0, 512, (1, 8))
    with torch.no_grad():
        assert (hf(x).logits - model(x)).abs().max().item() < 1e-4
    # torchtitan's adapter reads the same index to lay out its own HF saves.
    from grt_titan.model.state_dict_adapter import GRTStateDictAdapter

    mapping = GRTStateDictAdapter(model.model_args, str(out)).fqn_to_index_mapping
    assert set(mapping.values()) == set(range(1, len(shards) + 1))


def test_bfloat16_export(native_models, tmp_path):
    model = native_models["llama"]
    out = write_hf_folder(
        tmp_path / "bf16", model.state_dict(), model.model_args, write_tokenizer=False, dtype="bfloat16"
    )
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    hf = load_hf(out, dtype=torch.bfloat16)
    assert next(hf.parameters()).dtype == torch.bfloat16


# ---- bad input: a clear error, and nothing left behind --------------------------------


def _assert_nothing_written(parent):
    assert [p.name for p in parent.iterdir()] == []


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao prints nothing if absent")
def test_export_console_shows_only_the_commands_output(debug_checkpoint, debug_config, tmp_path):
    """A new user's `grt-titan export-hf`, in a fresh interpreter: torchao is imported (by
    transformers) yet none of its import messages reach the console."""
    folder, _ = debug_checkpoint
    from hf_helpers import REPO

    out = tmp_path / "export"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grt_titan.cli",
            "export-hf",
            "--checkpoint",
            str(folder),
            "--config",
            str(debug_config),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"exported {folder} -> {out}"
    for text in TORCHAO_IMPORT_NOISE:
        assert text not in proc.stderr, proc.stderr


def test_checkpoint_that_does_not_match_the_config(debug_checkpoint, tmp_path, capsys):
    folder, _ = debug_checkpoint
    from hf_helpers import REPO

    out_parent = tmp_path / "out"
    out_parent.mkdir()
    rc = cli(
        [
            "export-hf",
            "--checkpoint",
            str(folder),
            "--config",
            str(REPO / "train_configs" / "dense_debug.toml"),
            "--out",
            str(out_parent / "x"),
        ]
    )
    assert rc == 1
    err = capsys.readouterr().err
    assert "does not match the config" in err and "recurrence.step.proj.weight" in err
    _assert_nothing_written(out_parent)


def test_missing_files(debug_config, tmp_path, capsys):
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    assert (
        cli(
            [
                "export-hf",
                "--checkpoint",
                str(tmp_path / "nope"),
                "--config",
                str(debug_config),
                "--out",
                str(out_parent / "x"),
            ]
        )
        == 1
    )
    assert "does not exist" in capsys.readouterr().err
    assert (
        cli(
            [
                "export-hf",
                "--checkpoint",
                str(tmp_path),
                "--config",
                str(tmp_path / "missing.toml"),
                "--out",
                str(out_parent / "x"),
            ]
        )
        == 1
    )
    assert "missing.toml does not exist" in capsys.readouterr().err
    empty = tmp_path / "empty_step"
    empty.mkdir()
    assert (
        cli(["export-hf", "--checkpoint", str(empty), "--config", str(debug_config), "--out", str(out_parent / "x")])
        == 1
    )
    assert "not a torchtitan checkpoint" in capsys.readouterr().err
    assert cli(["import-hf", "--hf-dir", str(empty), "--out", str(out_parent / "y")]) == 1
    assert "no config.json" in capsys.readouterr().err
    _assert_nothing_written(out_parent)


def test_missing_weight_file_on_import(debug_export, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(debug_export, broken)
    (broken / SINGLE_FILE).unlink()
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    assert cli(["import-hf", "--hf-dir", str(broken), "--out", str(out_parent / "step-0")]) == 1
    assert "no model.safetensors" in capsys.readouterr().err
    _assert_nothing_written(out_parent)


def test_dtypes_that_cannot_be_represented(tmp_path):
    from grt_titan.hf.convert import ExportError

    args = small_args("gpt2")
    model = seeded_model(args)
    with torch.no_grad():
        model.coda.layers["0"].feed_forward.w1.weight[0, 0] = 1e6  # > float16's 65504
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    with pytest.raises(ExportError, match=r"coda\.0\.mlp\.up_proj\.weight.*cannot be represented in float16"):
        write_hf_folder(out_parent / "fp16", model.state_dict(), args, write_tokenizer=False, dtype="float16")
    with pytest.raises(
        ExportError, match=r"dtype = 'int8' cannot be exported; allowed: \['bfloat16', 'float16', 'float32'\]"
    ):
        write_hf_folder(out_parent / "i8", model.state_dict(), args, write_tokenizer=False, dtype="int8")
    _assert_nothing_written(out_parent)
    # bfloat16 has float32's range: fine.
    write_hf_folder(out_parent / "bf16", model.state_dict(), args, write_tokenizer=False, dtype="bfloat16")


def test_existing_output_and_failure_mid_write(native_models, tmp_path, monkeypatch):
    from grt_titan.hf import convert
    from grt_titan.hf.convert import ExportError

    model = native_models["gpt2"]
    out = tmp_path / "o"
    out.mkdir()
    with pytest.raises(ExportError, match="already exists"):
        write_hf_folder(out, model.state_dict(), model.model_args, write_tokenizer=False)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(convert, "_write_generation_config", boom)
    with pytest.raises(OSError, match="disk full"):
        write_hf_folder(tmp_path / "p", model.state_dict(), model.model_args, write_tokenizer=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]  # no partial folder


def test_validation_loss_read_from_the_runs_tensorboard_logs(debug_checkpoint, debug_config, tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    folder, _ = debug_checkpoint  # <dump>/checkpoint/step-60; grt_debug.toml logs to <dump>/tb
    writer = SummaryWriter(str(folder.parent.parent / "tb" / "20261129-0000"))
    for step, loss in ((30, 5.5), (60, 5.0), (90, 4.0)):
        writer.add_scalar("validation_metrics/loss", loss, step)
        writer.add_scalar("n_tokens_seen", 2048 * step, step)  # torchtitan's, over all ranks
    writer.close()
    out = tmp_path / "exports" / "card"  # parents are created
    # The checkpoint folder selects its latest step (step-60).
    assert (
        cli(
            [
                "export-hf",
                "--checkpoint",
                str(folder.parent),
                "--config",
                str(debug_config),
                "--out",
                str(out),
                "--no-verify",
            ]
        )
        == 0
    )
    card = (out / "README.md").read_text()
    assert "validation loss: 5.0000 at step 60" in card
    assert "training tokens: 122,880 (n_tokens_seen in the run's TensorBoard log)" in card


def test_mixture_of_recursions_is_exported():
    """modeling_grt.py routes MoR (tests/hf/test_hf_mor.py): the export's check lets it through."""
    from grt_titan.hf.convert import build_hf_config
    from grt_titan.run_reader import load_model_args

    from grt_test_helpers import REPO

    args, _ = load_model_args(REPO / "train_configs" / "paper" / "small_mor.toml")
    config = build_hf_config(args)
    assert (config.router, config.router_inference, config.num_recurrences) == ("expert_choice", "threshold", 10)


@pytest.mark.slow
def test_a_run_trained_with_overrides_exports_with_them_or_its_record(tmp_path, capsys):
    """A run trained with command-line overrides (`--grt.num_recurrences 3`: the exported R,
    and a depth curriculum) exports with the same overrides after export-hf's own options, or
    from the config its run record holds; the TOML alone describes another model. Keys that
    only shape training are not checked at export: a dense model's curriculum in its TOML,
    which a training command line turned off, exports (benchmarks/retrofit_real.py's source arm)."""
    from grt_titan.run_reader import CheckpointError, load_model_args

    from grt_test_helpers import DEBUG_TOML, step_losses, torchrun

    overrides = ["--grt.num_recurrences", "3", "--grt.depth_curriculum_steps", "2"]
    run = tmp_path / "run"
    train = [
        *("--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(run), "--training.steps", "2"),
        *overrides,
    ]
    train += ["--training.seq_len", "32", "--metrics.log_freq", "1", "--validation.no-enable"]
    train += ["--checkpoint.enable", "--checkpoint.interval", "2"]
    proc = torchrun(1, [*train, "--parallelism.data_parallel_shard_degree", "1"], tmp_path)
    assert proc.returncode == 0 and sorted(step_losses(proc.stdout + proc.stderr)) == [1, 2], proc.stderr[-3000:]
    checkpoint = run / "checkpoint" / "step-2"

    def export(name: str, *config: str) -> dict:
        argv = ["export-hf", "--checkpoint", str(checkpoint), "--out", str(tmp_path / name), *config]
        assert cli(argv) == 0, capsys.readouterr().err
        return json.loads((tmp_path / name / "config.json").read_text())

    with_overrides = export("overrides", "--config", str(DEBUG_TOML), *overrides)
    recorded = export("record", "--config", str(run / "grt_run.json"))
    assert with_overrides["num_recurrences"] == recorded["num_recurrences"] == 3
    assert with_overrides == recorded
    assert export("toml_alone", "--config", str(DEBUG_TOML))["num_recurrences"] == 4
    # A misspelt override is named by torchtitan's parser, a stray argument by export-hf's.
    assert cli(["export-hf", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "x"), "--config", str(DEBUG_TOML), "--grt.num_recurence", "3"]) == 1  # fmt: skip
    assert "num_recurence" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["export-hf", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "y"), "--config", str(DEBUG_TOML), "--dtypes", "x"])  # fmt: skip
    assert "unrecognized arguments: --dtypes x" in capsys.readouterr().err
    # The curriculum is a training schedule: dropped where a trained model is read.
    dense = ["--model.flavor", "dense_debug", "--grt.depth_curriculum_steps", "5000"]
    assert not load_model_args(DEBUG_TOML, dense)[0].is_recurrent
    with pytest.raises(CheckpointError, match="no depth to ramp"):
        load_model_args(DEBUG_TOML, dense, training_schedule=True)
