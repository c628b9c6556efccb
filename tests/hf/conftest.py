"""Fixtures of the Hugging Face export tests: seeded GRT models and exported folders."""

import pytest

from hf_helpers import REPO, load_hf, seeded_model, small_args  # noqa: F401  (sets offline env first)


@pytest.fixture(scope="session")
def native_models():
    return {style: seeded_model(small_args(style)) for style in ("gpt2", "llama")}


@pytest.fixture(scope="session")
def exported(native_models, tmp_path_factory):
    """Folders written by write_hf_folder (no tokenizer: the vocabulary is 512)."""
    from grt_titan.hf.convert import write_hf_folder

    root = tmp_path_factory.mktemp("exported")
    out = {}
    for style, model in native_models.items():
        out[style] = write_hf_folder(root / style, model.state_dict(), model.model_args, write_tokenizer=False)
    return out


@pytest.fixture(scope="session")
def hf_models(exported):
    return {style: load_hf(folder) for style, folder in exported.items()}


@pytest.fixture(scope="session")
def debug_config():
    return REPO / "train_configs" / "grt_debug.toml"


@pytest.fixture(scope="session")
def debug_checkpoint(debug_config, tmp_path_factory):
    """A torchtitan-layout DCP step folder of the `debug` flavor (full GPT-2 vocabulary),
    as a full save: model FQNs at the top level plus train_state."""
    from grt_titan.checkpoints.load import save_checkpoint
    from grt_titan.run_reader import load_model_args

    args, _ = load_model_args(debug_config)
    model = seeded_model(args, seed=1)
    folder = tmp_path_factory.mktemp("run") / "checkpoint" / "step-60"
    state = dict(model.state_dict())
    state["train_state"] = {"step": 60, "ntokens_seen": 61440}
    save_checkpoint(folder, state)
    return folder, model


@pytest.fixture(scope="session")
def debug_export(debug_checkpoint, debug_config, tmp_path_factory):
    """`grt-titan export-hf` of the debug checkpoint, tokenizer included."""
    from grt_titan.cli import main

    folder, _ = debug_checkpoint
    out = tmp_path_factory.mktemp("export") / "grt_debug"
    rc = main(
        [
            "export-hf",
            "--checkpoint",
            str(folder),
            "--config",
            str(debug_config),
            "--out",
            str(out),
            "--validation-loss",
            "5.25",
        ]
    )
    assert rc == 0
    return out
