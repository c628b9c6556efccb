"""The recurrence's parts in the exported model (docs/methods.md, "Recurrence parts in the Hugging Face export"):
figure 5's ladder, heavy-tail Poisson and RRT export, load as remote code and compute the
torchtitan model's logits, with and without the KV cache, and import back exactly; and the
remote parts (parts_grt.py) are the training parts' twins, one to one, row by row of the
table of methods."""

import json
import re

import pytest
import tomllib
import torch

from grt_titan.checkpoints.load import load_checkpoint
from grt_titan.cli import main as cli
from grt_titan.hf.config_map import HF_PARTS, model_args_from_hf_config
from grt_titan.hf.convert import SINGLE_FILE, ExportError, build_hf_config, write_hf_folder
from grt_titan.hf.remote.configuration_grt import MOR_REQUIRED_PARTS, PART_SETTINGS, RECURRENCE_PARTS, GRTConfig
from grt_titan.model import grt_flavors
from grt_titan.model.methods.table import GRT, METHODS, MOR, MOR_TOKEN_CHOICE
from grt_titan.run_reader import load_model_args

from grt_test_helpers import build_model
from hf_helpers import (
    ATOL,
    REPO,
    SMALL_VOCAB,
    assert_left_padded_rows_generate_alone,
    decode_logits,
    greedy,
    load_hf,
    perturb,
    prompt,
    small_args,
    static_decode_logits,
)

PAPER = REPO / "train_configs" / "paper"
STRATEGIES = ("per_step", "first", "last", "average")
# The paper's TOML of each part set, and the debug-size twin of each flavor they use.
PART_SETS = {
    "ladder": "ladder_2_recurrence.toml",
    "poisson": "small_poisson.toml",
    "rrt": "small_rrt.toml",
    "scse": "small_scse.toml",
}
DEBUG_TWIN = {"small": "debug", "small_core_only": "debug_core_only"}


def debug_twin(toml: str):
    """The TOML's `[grt]` section (its parts) on the debug-size twin of its flavor, at the
    twin's depth R (4 or 5: cheap), with a 512-token vocabulary and a non-default seed (the
    random state's table)."""
    data = tomllib.loads((PAPER / toml).read_text())
    flavor = grt_flavors[DEBUG_TWIN[data["model"]["flavor"]]]
    grt = {k: v for k, v in data["grt"].items() if k != "num_recurrences"}
    return flavor.replace(vocab_size=SMALL_VOCAB, depth_seed=7, **grt)


@pytest.fixture(scope="module", params=list(PART_SETS))
def part_set(request, module_tmp):
    """(torchtitan model in eval mode, exported folder, loaded HF model) of one part set."""
    args = debug_twin(PART_SETS[request.param])
    native = perturb(build_model(args))
    folder = module_tmp(request.param) / "hf"
    write_hf_folder(folder, native.state_dict(), args, write_tokenizer=False)
    return native, folder, load_hf(folder)


def test_logits_match_torchtitan(part_set):
    native, folder, hf = part_set
    args = native.model_args
    config = json.loads((folder / "config.json").read_text())
    assert {k: config[k] for k in HF_PARTS} == {k: getattr(args, k) for k in HF_PARTS}
    R = args.num_recurrences
    x = prompt(batch=2, seq=24, seed=3)
    with torch.no_grad():
        for r in (None, 0, 1, R):  # None: the default depth, the run's eval depth R
            diff = (hf(x, num_recurrences=r).logits - native(x, num_recurrences=r)).abs().max().item()
            assert diff < ATOL, (r, diff)
        out = hf(x, output_recurrence=True, output_step_logits=True, use_cache=False)
    assert len(out.proposals) == R and len(out.step_logits) == R + 1
    if args.update == "overwrite":  # no gate: the state is the core's output
        assert out.gate_values is None
        assert all(torch.equal(h, o) for h, o in zip(out.recurrence_states[1:], out.proposals))


def test_generation_with_the_kv_cache(part_set):
    native, _, hf = part_set
    R = native.model_args.num_recurrences
    ids = prompt(seq=16, seed=7)
    with torch.no_grad():
        # Teacher-forced decoding through the per-step cache gives torchtitan's full-sequence logits.
        cached, _ = decode_logits(hf, ids, "per_step", R)
        assert (cached - native(ids)[:, -7:]).abs().max().item() < ATOL
        for strategy in STRATEGIES:
            # per_step is exact at any depth; a compressed cache is exact at r = 1 (one step to keep).
            r = R if strategy == "per_step" else 1
            assert torch.equal(
                greedy(hf, ids[:, :6], n=5, num_recurrences=r, kv_cache_strategy=strategy),
                greedy(hf, ids[:, :6], n=5, num_recurrences=r, use_cache=False),
            ), strategy
            # The preallocated cache computes what the growing one does.
            dynamic, _ = decode_logits(hf, ids[:, :10], strategy, R, steps=3)
            static, _ = static_decode_logits(hf, ids[:, :10], strategy, prefix=7)
            assert (static - dynamic).abs().max().item() < ATOL, strategy
    # Left padding: positions (and so the random initial state's rows) restart at each row's
    # first token, and each row generates what it would alone.
    assert_left_padded_rows_generate_alone(hf, n=5)


def test_export_import_export_round_trip(part_set, tmp_path):
    native, folder, _ = part_set
    args = native.model_args
    assert model_args_from_hf_config(json.loads((folder / "config.json").read_text())) == args
    ckpt = tmp_path / "checkpoint" / "step-0"
    assert cli(["import-hf", "--hf-dir", str(folder), "--out", str(ckpt)]) == 0
    state, _ = load_checkpoint(ckpt, args)
    (tmp_path / "again").mkdir()  # the same folder name: the model card's snippet names it
    again = write_hf_folder(tmp_path / "again" / folder.name, state, args, write_tokenizer=False)
    for name in (SINGLE_FILE, "config.json", "README.md"):
        assert (again / name).read_bytes() == (folder / name).read_bytes(), name


def test_import_checks_the_parts_against_the_config():
    from grt_titan.hf.importer import _check_against_config

    with pytest.raises(
        ExportError,
        match="does not describe this model: .*injection: HF 'none' vs config 'proj'.*"
        "step_adapter: HF 'lora' vs config 'none'",
    ):
        _check_against_config(
            debug_twin("small_rrt.toml").replace(vocab_size=50257), REPO / "train_configs" / "grt_debug.toml"
        )


def test_every_paper_config_exports_with_its_parts():
    for toml in sorted(PAPER.glob("*.toml")):
        args, _ = load_model_args(toml)
        if args.router == "token_choice":  # MoR token choice: refused by name
            with pytest.raises(ExportError, match=re.escape(args.method_name) + " .*cannot be exported"):
                build_hf_config(args)
            continue
        config = build_hf_config(args).to_dict()
        if args.is_recurrent:
            assert {k: config.get(k, RECURRENCE_PARTS[k][0]) for k in HF_PARTS} == {
                k: getattr(args, k) for k in HF_PARTS
            }, toml.name
            assert config.get("lora_rank") == (args.lora_rank if args.step_adapter == "lora" else None)
            assert config.get("exit_threshold") == (args.exit_threshold if args.per_step_readout else None)


def test_the_self_contained_config_copies_the_table_of_methods():
    """configuration_grt.py cannot import grt_titan (remote code): its copies of rows of
    grt_titan/model/methods/table.py (GRT's parts as the first choices, MoR's fixed parts) agree."""
    assert {name: choices[0] for name, choices in RECURRENCE_PARTS.items()} == {
        name: GRT.parts[name] for name in RECURRENCE_PARTS
    }
    mor = {**GRT.parts, **MOR.parts}
    assert {k: v for k, v in MOR_REQUIRED_PARTS.items() if k != "block_style"} == {
        k: mor[k] for k in MOR_REQUIRED_PARTS if k != "block_style"
    }


@pytest.mark.parametrize("row", METHODS, ids=lambda row: f"{row.config}:{row.name}")
def test_every_row_of_the_table_exports_with_its_parts(row):
    args = small_args("gpt2").replace(**row.parts)
    if row is MOR_TOKEN_CHOICE:  # the one row modeling_grt.py does not implement: refused by name
        with pytest.raises(ExportError, match=re.escape(row.name) + " .*cannot be exported"):
            build_hf_config(args)
        return
    config = build_hf_config(args)
    if args.is_recurrent:
        assert {k: getattr(config, k) for k in HF_PARTS} == {k: {**GRT.parts, **row.parts}[k] for k in HF_PARTS}


def test_grt_config_json_has_no_part_fields_and_loads_as_grt():
    config = build_hf_config(small_args("gpt2")).to_dict()
    fields = set(RECURRENCE_PARTS).union(*PART_SETTINGS.values())
    assert not fields & set(config)  # GRT's config.json is what it was before the parts
    loaded = GRTConfig.from_dict(config)  # a config.json without the fields: GRT
    assert loaded.has_grt_parts and loaded.injection == "proj" and loaded.update == "gate"
    poisson = build_hf_config(debug_twin("small_poisson.toml")).to_dict()
    assert poisson["initial_state"] == "random" and poisson["initial_state_seed"] == 7
    assert "lora_rank" not in poisson  # settings of parts the model does not use are left out


def test_rrt_refuses_depths_without_adapters():
    args = debug_twin("small_rrt.toml")
    R = args.num_recurrences
    with pytest.raises(ExportError, match=f"eval_recurrences = {R + 1} is invalid with step_adapter = 'lora'"):
        build_hf_config(args.replace(eval_recurrences=R + 1))
    from grt_titan.hf.remote.modeling_grt import GRTForCausalLM

    hf = GRTForCausalLM(build_hf_config(args)).eval()
    with pytest.raises(ValueError, match=f"one adapter per step up to R = {R}"):
        hf(prompt(), num_recurrences=R + 1)


def test_random_initial_state_is_grt_titans_table_bit_for_bit():
    from grt_titan.hf.remote.modeling_grt import eval_initial_state as hf_table
    from grt_titan.model.methods.poisson import eval_initial_state

    assert torch.equal(hf_table(7, 64, 32, 0.3), eval_initial_state(7, 64, 32, 0.3))


# Training parts without a remote twin, each with its reason: the depth laws are how training
# draws r (an exported model runs the depth a call asks for), and per-step supervision is a
# training loss (its model's inference is the plain final readout); MoR's token choice is
# refused by the export by name (modeling_grt.py has no token-choice routing).
TRAINING_ONLY_KEYS = {"depth_sampling", "step_supervision"}
NOT_EXPORTED = {("router", "token_choice")}


def twins(parts) -> dict[tuple[str, str], str]:
    """(key, choice) -> class name of each part."""
    return {(part.key, part.choice): type(part).__name__ for part in parts}


def test_every_training_part_has_its_remote_twin():
    """grt_titan/model/part_table.py and the remote parts_grt.py list the same parts, by key, choice
    and name, in the same order, but those with a reason above: a new part without its HF twin
    (or its refusal) fails here."""
    from grt_titan.hf.remote import parts_grt
    from grt_titan.model.part_table import PARTS

    exported = [p for p in PARTS if p.key not in TRAINING_ONLY_KEYS and (p.key, p.choice) not in NOT_EXPORTED]
    assert list(twins(parts_grt.PARTS).items()) == list(twins(exported).items())
    for remote, training in zip(parts_grt.PARTS, exported):
        # A module per step (no depth above R) and a readout of every step, on both sides.
        assert remote.per_step == training.per_step, remote.label
        reads = type(remote).reads_every_step is not parts_grt.RemotePart.reads_every_step
        assert reads == training.reads_every_step, remote.label


@pytest.mark.parametrize("row", METHODS, ids=lambda row: f"{row.config}:{row.name}")
def test_every_row_has_the_same_parts_in_its_export(row):
    """Row by row of the table of methods: the remote parts of the exported config (and of the
    config.json it writes) are the training args' parts, and the HF model holds exactly their
    modules (`model.<module_name>`)."""
    from grt_titan.hf.remote.modeling_grt import GRTModel as HFModel
    from grt_titan.hf.remote.parts_grt import PARTS as REMOTE_PARTS
    from grt_titan.hf.remote.parts_grt import active_parts

    args = small_args("gpt2").replace(**row.parts)
    training = [p for p in args.active_parts if p.key not in TRAINING_ONLY_KEYS]
    if {(p.key, p.choice) for p in training} & NOT_EXPORTED:
        with pytest.raises(ExportError, match="cannot be exported"):
            build_hf_config(args)
        return
    config = build_hf_config(args)
    remote = active_parts(config)
    assert twins(remote) == twins(training)
    assert twins(active_parts(GRTConfig.from_dict(config.to_dict()))) == twins(training)
    model = HFModel(config)
    names = {p.module_name for p in REMOTE_PARTS} - {None}
    held = {name for name in names if getattr(model, name) is not None}
    assert held == {p.module_name for p in remote} - {None}


def test_a_model_built_from_a_config_gets_each_parts_init():
    """`GRTForCausalLM(config)` (transformers' from_config: weights not from a checkpoint) starts
    as grt_titan does: the gate's last bias at +4 (g ~ 0.98) and RRT's LoRA as PEFT starts it (A
    Kaiming-uniform, B = 0: every adapter a no-op). transformers 5 skips remote code's modules
    that hold no parameters of their own, so each init runs on the module holding its weights;
    before, the bias stayed 0 and the factors were uninitialised memory."""
    from grt_titan.hf.remote.modeling_grt import GRTForCausalLM

    args = grt_flavors["debug"].replace(step_adapter="lora", lora_rank=4)
    state = GRTForCausalLM(build_hf_config(args)).state_dict()
    assert torch.equal(state["model.gate.w_out.bias"], torch.full((args.dim,), 4.0))
    factors = {k: v for k, v in state.items() if k.startswith("model.adapters.")}
    assert len(factors) == 8
    for name, value in factors.items():
        if ".b." in name:
            assert torch.equal(value, torch.zeros_like(value)), name
        else:
            bound = 1 / value.shape[-1] ** 0.5
            assert torch.isfinite(value).all() and 0 < value.abs().max() <= bound, name
