"""`grt-titan retrofit` (grt_titan/hf/retrofit.py, docs/retrofit.md): a dense GPT-2 / Llama /
Qwen3 source split into a GRT that starts as the source (at every depth under the default
init, at r = 1 under first-loop), in float32, offline.

The sources are tiny models built with transformers' own classes (GQA and llama3 RoPE
scaling for Llama, qk-norm and an explicit head width for Qwen3, one sharded folder) beside a
tiny tokenizer.json; the reference is their own transformers forward.
"""

import copy
import json
import shutil

import pytest
import tomllib
import torch

from grt_titan.checkpoints.load import load_checkpoint, model_from_state
from grt_titan.hf.retrofit import (
    GATE_CLOSED_BIAS,
    RetrofitError,
    default_split,
    plan_layers,
    retrofit_model,
    write_retrofit,
)
from grt_titan.hf.retrofit_cli import main
from grt_titan.model.args import GRTModelArgs
from grt_titan.run_reader import load_model_args

from hf_helpers import load_hf  # (tests/hf/conftest.py imports it first: offline environment)
from tests.data.data_helpers import CHATML, make_hf_tokenizer

VOCAB = 512  # rows of the sources' embeddings; the tiny tokenizers emit ~400 ids
LAYERS = 4
# Observed <= 3.0e-7 on logits of magnitude ~1 (the same ops in the same order; RoPE as a
# complex product vs cos/sin); 1e-5 is float32 precision with headroom.
ATOL = 1e-5
# (prelude, core A:B, coda): every layer mapped, and layer 1 dropped.
ALL_MAPPED = (1, (1, 3), 1)
DROPPED = (1, (2, 3), 1)


def _source(kind: str):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed({"gpt2": 0, "llama": 1, "qwen3": 2}[kind])
    if kind == "gpt2":
        config = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=LAYERS, n_head=4, n_positions=64, bos_token_id=0)
        config.eos_token_id = 0
        model = GPT2LMHeadModel(config)
    elif kind == "llama":
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=100,  # no multiple_of rounding reaches it: the explicit ffn_dim
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,  # GQA
            max_position_embeddings=64,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(config)
    else:
        config = Qwen3Config(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,  # != 64 / 4: Qwen3's explicit head width
            max_position_embeddings=64,
            tie_word_embeddings=True,
        )
        model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # norms away from 1 / 0, so a wrong norm mapping shows
        for name, p in model.named_parameters():
            if "norm" in name or ".ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.float().eval()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """kind -> (folder, transformers model); llama's weights are sharded."""
    root = tmp_path_factory.mktemp("retrofit_sources")
    out = {}
    for kind in ("gpt2", "llama", "qwen3"):
        model = _source(kind)
        folder = root / kind
        model.save_pretrained(folder, max_shard_size="40KB" if kind == "llama" else "50GB")
        make_hf_tokenizer(folder, {"gpt2": "gpt2", "llama": "llama3", "qwen3": "qwen3"}[kind])
        out[kind] = (folder, model)
    assert (root / "llama" / "model.safetensors.index.json").is_file()
    return out


def _tokens(seq: int = 40):
    # 40 > the llama source's original_max_position_embeddings: its RoPE scaling matters.
    return torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(3))


def _without_layers(model, kind: str, kept):
    """The source with only the `kept` layers, in order (transformers' model, layers deleted)."""
    model = copy.deepcopy(model)
    if kind == "gpt2":
        model.transformer.h = torch.nn.ModuleList([model.transformer.h[i] for i in kept])
    else:
        model.model.layers = torch.nn.ModuleList([model.model.layers[i] for i in kept])
        model.config.num_hidden_layers = len(kept)
    return model


def _plan(split):
    prelude, core, coda = split
    return plan_layers(LAYERS, prelude, core, coda)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3"])
@pytest.mark.parametrize("split", [ALL_MAPPED, DROPPED], ids=["all_layers", "layer_1_dropped"])
def test_every_depth_is_the_source(sources, kind, split):
    """The default init (every-depth): at every depth, past R too, the GRT's logits are the
    source's transformers forward (with a layer dropped: the source without it), in eval mode
    and in a training forward with its state and gate noise."""
    folder, source = sources[kind]
    grt, plan, _ = retrofit_model(folder, _plan(split), num_recurrences=4)
    reference = source if not plan.dropped else _without_layers(source, kind, plan.kept)
    tokens = _tokens()
    with torch.no_grad():
        expected = reference(tokens, use_cache=False).logits
        noisy = grt.train()(tokens, num_recurrences=3)
        diffs = {r: (grt.eval()(tokens, num_recurrences=r) - expected).abs().max().item() for r in (1, 2, 4, 8)}
    diffs["train r = 3"] = (noisy - expected).abs().max().item()
    assert all(d < ATOL for d in diffs.values()), f"{kind} {split}: max |logit diff| {diffs}"


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3"])
def test_first_loop_is_the_source(sources, kind):
    """--init first-loop (W_proj = [I, 0]): r = 1 is the source; loop 2 iterates the core on
    its own output, a different function (no silent no-op)."""
    folder, source = sources[kind]
    grt, _, _ = retrofit_model(folder, _plan(ALL_MAPPED), num_recurrences=4, init="first-loop")
    grt.eval()
    tokens = _tokens()
    with torch.no_grad():
        expected = source(tokens, use_cache=False).logits
        diff = (grt(tokens, num_recurrences=1) - expected).abs().max().item()
        assert diff < ATOL, f"{kind}: max |logit diff| {diff:.3g}"
        assert (grt(tokens, num_recurrences=2) - expected).abs().max().item() > 1e-3


def test_damped_init_by_hand(sources):
    """--init damped: g = 1 - 1/R everywhere, so one step is (1 - 1/R) h + (1/R) core(h),
    W_proj = [I, 0] (eq. 2-5 by hand, with the core run alone)."""
    grt, _, _ = retrofit_model(sources["llama"][0], _plan(ALL_MAPPED), num_recurrences=4, init="damped")
    grt.eval()
    with torch.no_grad():
        h_pre = grt.prelude(grt.embed(_tokens()), grt.freqs_cis)
        h = h_pre
        for _ in range(2):
            h = 0.75 * h + 0.25 * grt.recurrence.step.core(h, grt.freqs_cis, None)
        got = grt.recurrence(h_pre, grt.freqs_cis, 2).state
        gate = grt.recurrence.step.gate(h_pre, h_pre, None)
    assert (gate - 0.75).abs().max().item() < 1e-6
    assert (got - h).abs().max().item() < 1e-5


def test_describes_the_source_exactly(sources):
    gpt2 = retrofit_model(sources["gpt2"][0], _plan(ALL_MAPPED))[0].model_args
    llama = retrofit_model(sources["llama"][0], _plan(ALL_MAPPED))[0].model_args
    qwen3 = retrofit_model(sources["qwen3"][0], _plan(ALL_MAPPED))[0].model_args
    assert (gpt2.block_style, gpt2.tie_embeddings, gpt2.max_seq_len, gpt2.ffn_hidden_dim) == ("gpt2", True, 64, 256)
    assert (llama.block_style, llama.n_kv_heads, llama.ffn_hidden_dim, llama.tie_embeddings) == ("llama", 2, 100, False)
    assert llama.rope_scaling == [4.0, 1.0, 4.0, 16.0]
    assert (qwen3.block_style, qwen3.head_dim, qwen3.ffn_hidden_dim, qwen3.tie_embeddings) == ("qwen3", 32, 96, True)
    for args in (gpt2, llama, qwen3):
        assert (args.n_prelude_layers, args.n_core_layers, args.n_coda_layers, args.vocab_size) == (1, 2, 1, VOCAB)


def test_padded_vocabulary(sources):
    """`--vocab-multiple-of`: zero embedding / head rows up to padded_vocab_size (even TP
    shards); the source's columns are unchanged, the padded ones 0."""
    folder, source = sources["llama"]
    grt, _, _ = retrofit_model(folder, _plan(ALL_MAPPED), vocab_multiple_of=384)
    assert grt.model_args.padded_vocab_size == 768
    with torch.no_grad():
        logits = grt.eval()(_tokens(), num_recurrences=1)
        assert (logits[..., :VOCAB] - source(_tokens(), use_cache=False).logits).abs().max().item() < ATOL
    assert torch.all(logits[..., VOCAB:] == 0)


@pytest.mark.parametrize("init", ["every-depth", "first-loop"])
def test_gate_closed_but_trainable(sources, init):
    grt, _, _ = retrofit_model(sources["llama"][0], _plan(ALL_MAPPED), num_recurrences=2, init=init)
    gate = grt.recurrence.step.gate
    assert torch.all(gate.w_out.weight == 0) and torch.all(gate.w_out.bias == -GATE_CLOSED_BIAS)
    assert torch.sigmoid(torch.tensor(-GATE_CLOSED_BIAS)).item() < 2**-24  # 1 - g within one fp32 ulp of 1
    proj = grt.recurrence.step.proj.weight
    identity, zero = (proj[:, 64:], proj[:, :64]) if init == "every-depth" else (proj[:, :64], proj[:, 64:])
    assert torch.equal(identity, torch.eye(64)) and torch.all(zero == 0)
    grt.train()
    logits = grt(_tokens(16), num_recurrences=2)
    logits.float().logsumexp(-1).mean().backward()
    # Adam moves every weight with a nonzero gradient by about lr: the gate can open, and the
    # zero half of W_proj (h's under every-depth: what lets later loops differ) is learned.
    assert gate.w_out.weight.grad.abs().max().item() > 0
    zero_grad = proj.grad[:, :64] if init == "every-depth" else proj.grad[:, 64:]
    assert zero_grad.abs().max().item() > 0


def test_default_split_keeps_every_layer():
    """Every source layer kept, a core of McLeish et al.'s 2p layers (p = L // 8) mid-stack."""
    assert default_split(4) == (1, (1, 3), 1)
    assert default_split(30) == (12, (12, 18), 12)  # SmolLM2-135M
    assert default_split(28) == (11, (11, 17), 11)  # Qwen3-0.6B
    plan = plan_layers(16, None, None, None)
    assert (plan.prelude, plan.core, plan.coda) == (tuple(range(6)), (6, 7, 8, 9), tuple(range(10, 16)))
    assert plan.dropped == ()
    with pytest.raises(RetrofitError, match="num_hidden_layers = 2"):
        default_split(2)


@pytest.fixture(scope="module")
def written(sources, tmp_path_factory):
    out = tmp_path_factory.mktemp("retrofit_out") / "llama_grt"
    prelude, core, coda = ALL_MAPPED
    return write_retrofit(sources["llama"][0], out, prelude=prelude, core=core, coda=coda, num_recurrences=3)


def test_writes_checkpoint_and_toml(sources, written):
    assert sorted(p.name for p in written.iterdir()) == ["model", "model_args.json", "retrofit.json", "train.toml"]
    args, job_config = load_model_args(written / "train.toml")
    assert job_config.checkpoint.initial_load_path == str(written / "model")
    assert job_config.checkpoint.initial_load_model_only is True
    assert job_config.model.hf_assets_path == str(sources["llama"][0])
    assert "continued training" in (written / "train.toml").read_text()
    assert (args.block_style, args.num_recurrences, args.n_kv_heads, args.ffn_dim) == ("llama", 3, 2, 100)
    state, _ = load_checkpoint(written / "model", args)
    grt = model_from_state(state, args).eval()
    folder, source = sources["llama"]
    with torch.no_grad():
        diff = (grt(_tokens(), num_recurrences=1) - source(_tokens(), use_cache=False).logits).abs().max().item()
    assert diff < ATOL
    record = json.loads((written / "retrofit.json").read_text())
    assert (record["prelude"], record["core"], record["coda"], record["init"]) == ([0], [1, 2], [3], "every-depth")


def test_written_toml_heals(written):
    """The recipe for continued training: a depth curriculum over a quarter of the steps, a short
    warm-up, validation on the training data's val split at every depth (not torchtitan's c4)."""
    _, job_config = load_model_args(written / "train.toml")
    steps = job_config.training.steps
    assert job_config.grt.depth_curriculum_steps == steps // 4 > 0
    assert job_config.lr_scheduler.warmup_steps == max(1, steps // 50)
    assert job_config.validation.enable and job_config.validation.dataset == job_config.training.dataset
    assert job_config.grt_metrics.validation_depths
    text = (written / "train.toml").read_text()
    assert f"over the first {steps // 4} steps" in text and "--init every-depth" in text


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3"])
def test_retrofit_exports_to_transformers(sources, kind, tmp_path):
    """The retrofitted GRT's Hugging Face export (modeling_grt.py; qwen3: qk-norm and Qwen3's
    head width) computes its logits, under the default init the source's at r = 1, 2, 4 and 8."""
    from grt_titan.hf.convert import write_hf_folder

    folder, source = sources[kind]
    grt, _, _ = retrofit_model(folder, _plan(DROPPED))
    out = write_hf_folder(tmp_path / "export", grt.state_dict(), grt.model_args, tokenizer_path=folder, verify=True)
    hf = load_hf(out)
    grt.eval()
    tokens = _tokens()
    # The default init's export is the source (less its dropped layer) at every depth.
    reference = _without_layers(source, kind, _plan(DROPPED).kept)
    with torch.no_grad():
        expected = reference(tokens, use_cache=False).logits
        for r in (1, 2, 4, 8):
            logits = hf(tokens, num_recurrences=r).logits
            diff = (logits - grt(tokens, num_recurrences=r)).abs().max().item()
            assert diff < 1e-4, f"r = {r}: {diff:.3g}"
            assert (logits - expected).abs().max().item() < ATOL, f"r = {r}: the export is not the source"
    # import-hf reads it back: the same args (explicit sizes, RoPE scaling, tying) and weights.
    from grt_titan.hf.config_map import model_args_from_hf_config
    from grt_titan.hf.importer import import_hf

    args = model_args_from_hf_config(json.loads((out / "config.json").read_text()))
    assert args == grt.model_args
    state, _ = load_checkpoint(import_hf(out, tmp_path / "imported"), args)
    assert all(torch.equal(state[k], v) for k, v in grt.state_dict().items() if k in state)


def test_closed_gate_comes_from_the_checkpoint(sources, written):
    """The written args and TOML carry the flavors' gate init, not the closed gate: a run
    without `initial_load_path` is a GRT from scratch. Built from them and loaded the way
    training loads `initial_load_path` (model only: torchtitan's ModelWrapper state dict,
    DCP, set_model_state_dict), the GRT has the checkpoint's closed gate and is the source at
    r = 1."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpoint import ModelWrapper

    from grt_titan.checkpoints.load import single_process_dcp
    from grt_titan.model import GRTModel

    assert "gate_bias_init" not in tomllib.loads((written / "train.toml").read_text())["grt"]
    assert json.loads((written / "model_args.json").read_text())["gate_bias_init"] == GRTModelArgs().gate_bias_init
    args, job_config = load_model_args(written / "train.toml")
    grt = GRTModel(args)
    with torch.no_grad():
        grt.init_weights()
    gate = grt.recurrence.step.gate
    assert torch.all(gate.w_out.bias == GRTModelArgs().gate_bias_init)  # the normal init (+4)
    wrapper = ModelWrapper(grt)
    state = wrapper.state_dict()
    with single_process_dcp():
        dcp.load(state, checkpoint_id=job_config.checkpoint.initial_load_path)
    wrapper.load_state_dict(state)
    assert torch.all(gate.w_out.bias == -GATE_CLOSED_BIAS) and torch.all(gate.w_out.weight == 0)
    with torch.no_grad():
        got = grt.eval()(_tokens(), num_recurrences=1)
        diff = (got - sources["llama"][1](_tokens(), use_cache=False).logits).abs().max().item()
    assert diff < ATOL


def test_flavor_file(sources, tmp_path):
    """A flavor may be a JSON file of GRTModelArgs fields (the written model_args.json)."""
    from grt_titan.config_checks import Flavors, UnknownFlavorError
    from grt_titan.model import grt_flavors

    out = write_retrofit(sources["gpt2"][0], tmp_path / "grt", prelude=1, core=(1, 3), coda=1)
    table = Flavors(grt_flavors)
    args = table[str(out / "model_args.json")]
    assert (args.dim, args.n_core_layers, args.gate_bias_init) == (64, 2, GRTModelArgs().gate_bias_init)
    assert table[str(out / "model_args.json")] is not args  # a fresh copy per lookup
    with pytest.raises(UnknownFlavorError, match="no such file"):
        table[str(tmp_path / "missing.json")]
    (tmp_path / "bad.json").write_text(json.dumps({"dim": 64, "width": 3}))
    with pytest.raises(UnknownFlavorError, match="unknown GRTModelArgs field 'width'"):
        table[str(tmp_path / "bad.json")]


def test_tied_source_checkpoint_loads(sources, tmp_path):
    """A tied source (Qwen3 here) writes the head's key too, as torchtitan's load asks for
    every key of the model; it loads tied and computes the source."""
    out = write_retrofit(sources["qwen3"][0], tmp_path / "qwen3_grt", prelude=1, core=(1, 3), coda=1)
    args, _ = load_model_args(out / "train.toml")
    state, _ = load_checkpoint(out / "model", args)  # checks output.weight == tok_embeddings.weight
    assert args.tie_embeddings and "output.weight" in state
    grt = model_from_state(state, args).eval()
    with torch.no_grad():
        diff = (grt(_tokens(), num_recurrences=1) - sources["qwen3"][1](_tokens(), use_cache=False).logits).abs().max()
    assert diff.item() < ATOL


# ---- bad input: one line naming the key, nothing left behind ------------------------------------


def _copy_source(folder, dest):
    import shutil

    shutil.copytree(folder, dest)
    return dest


def _refused(capsys, tmp_path, src, *options) -> str:
    out = tmp_path / "out"
    assert main([str(src), "--out", str(out), *options]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # no temporary folder
    return err


def test_refuses_unsupported_model_type(sources, tmp_path, capsys):
    src = _copy_source(sources["gpt2"][0], tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    assert "model_type = 'mistral'" in _refused(capsys, tmp_path, src)


@pytest.mark.parametrize(
    "options, key",
    [
        (["--prelude", "2", "--core", "1:3", "--coda", "1"], "overlaps the prelude"),
        (["--prelude", "1", "--core", "1:4", "--coda", "1"], "overlaps the coda"),
        (["--core", "2:9"], "--core 2:9 is out of range"),
        (["--prelude", "7"], "--prelude 7 is out of range"),
        (["--core", "2:2"], "--core 2:2 is out of range"),
    ],
)
def test_refuses_bad_layers(sources, tmp_path, capsys, options, key):
    assert key in _refused(capsys, tmp_path, sources["qwen3"][0], *options)


def test_refuses_missing_weight_files(sources, tmp_path, capsys):
    src = _copy_source(sources["llama"][0], tmp_path / "src")
    shard = sorted(src.glob("model-*.safetensors"))[-1]
    shard.unlink()
    assert shard.name in _refused(capsys, tmp_path, src)
    for name in ("model.safetensors.index.json", *(p.name for p in src.glob("*.safetensors"))):
        (src / name).unlink()
    assert "model.safetensors" in _refused(capsys, tmp_path, src)


def test_refuses_tokenizer_beyond_the_embeddings(sources, tmp_path, capsys):
    src = _copy_source(sources["gpt2"][0], tmp_path / "src")
    make_hf_tokenizer(src, "gpt2", vocab_size=VOCAB + 100)
    err = _refused(capsys, tmp_path, src)
    assert "tokenizer.json" in err and "vocab_size = 512" in err


def test_refuses_existing_out(sources, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert main([str(sources["gpt2"][0]), "--out", str(tmp_path / "out")]) == 1
    assert "already exists" in capsys.readouterr().err


@pytest.mark.slow
def test_qwen3_blocks_under_tensor_parallelism(sources, run_torchrun, tmp_path):
    """torchtitan's qwen3 TP plan on the GRT's qwen3 blocks (q_norm / k_norm included): TP 2
    computes the single-device logits at r = 1 and r = 3."""
    out = tmp_path / "tp.json"
    proc = run_torchrun(
        2, [str(sources["qwen3"][0]), str(out)], tmp_path, timeout=300, module="tests.hf.retrofit_tp_worker"
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(out.read_text())
    assert all(diff < 1e-5 for diff in result["diffs"].values()), result["diffs"]
    for name in ("attention.wq.weight", "attention.wk.weight", "feed_forward.w3.weight"):
        assert f"prelude.layers.0.{name}" in result["sharded"]
    # q_norm / k_norm: replicated weights on head shards (SequenceParallel over dim 2).
    assert "recurrence.step.core.layers.0.attention.q_norm.weight" not in result["sharded"]


@pytest.mark.slow
def test_retrofit_trains_exports_and_generates(sources, run_torchrun, tmp_path):
    """The documented path: retrofit -> 2-rank FSDP training from the written TOML (a few
    steps) -> export-hf (verified: HF logits = torchtitan's) -> transformers generates with
    the source's tokenizer."""
    from transformers import AutoTokenizer

    from grt_titan.hf.export import export_checkpoint

    folder = sources["llama"][0]
    out = write_retrofit(folder, tmp_path / "grt", prelude=1, core=(1, 3), coda=1)
    toml = out / "train.toml"
    proc = run_torchrun(
        2, ["--job.config_file", str(toml), "--training.steps", "3", "--validation.no-enable"], tmp_path
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert f"Loading the checkpoint from {out / 'model'}" in log  # the retrofitted weights
    exported = export_checkpoint(out / "outputs" / "checkpoint", toml, tmp_path / "export", verify=True)
    hf = load_hf(exported)
    tokenizer = AutoTokenizer.from_pretrained(str(exported))
    ids = tokenizer("The recurrence", return_tensors="pt").input_ids
    generated = hf.generate(ids, max_new_tokens=5, do_sample=False, num_recurrences=2)
    assert generated.shape[1] == ids.shape[1] + 5
    assert isinstance(tokenizer.decode(generated[0]), str)


def test_task_recipe_trains_loop_by_loop_then_answers_and_scores_by_depth(sources, run_torchrun, tmp_path, capsys):
    """`--task-recipe`'s task.toml on 2 ranks: chat records of `grt-titan task --chat` rendered
    by the source's chat template, per-step supervision then answers alone, the recurrent
    block alone trained; eval-task scores the checkpoint on chat records by depth."""
    from grt_titan.analysis import task_eval
    from grt_titan.data import tasks
    from grt_titan.data.prepare import prepare

    src = tmp_path / "src"
    shutil.copytree(sources["qwen3"][0], src)
    config = json.loads((src / "tokenizer_config.json").read_text())
    (src / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    out = write_retrofit(src, tmp_path / "grt", prelude=1, core=(1, 3), coda=1, num_recurrences=3, task_recipe=True)
    recipe = tomllib.loads((out / "task.toml").read_text())
    assert recipe["training"]["trainable"] == ["recurrent"] and recipe["grt"]["step_supervision"] is True
    steps = recipe["training"]["steps"]
    assert recipe["grt"]["step_supervision_steps"] == steps - steps // 4  # then a quarter answers alone
    for split, n in (("train", 48), ("test", 12)):  # 6 symbols: a problem fits the source's 64 positions
        rows = tasks.generate("iterated-function", range(1, 4), n, seed=0, split=split, symbols=6)
        (out / "task").mkdir(exist_ok=True)
        (out / "task" / f"{split}.jsonl").write_text("".join(json.dumps(tasks.as_chat(r)) + "\n" for r in rows))
    prepare([out / "task" / "train.jsonl"], out / "task" / "data", tokenizer_path=src, val_fraction=0.1, progress=False)
    toml = out / "task.toml"
    short = ["--training.steps", "4", "--grt.step_supervision_steps", "3", "--training.local_batch_size", "2"]
    proc = run_torchrun(2, ["--job.config_file", str(toml), *short, "--validation.no-enable"], tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert (
        "per-step supervision for the first 3 optimizer steps" in log and "[training] trainable = ['recurrent']" in log
    )
    checkpoint = out / "task_outputs" / "checkpoint"
    argv = [str(checkpoint), "--config", str(toml), "--data", str(out / "task" / "test.jsonl"), "--no-progress"]
    assert task_eval.main([*argv, "--json", str(tmp_path / "eval.json")]) == 0
    result = json.loads((tmp_path / "eval.json").read_text())
    assert set(result["accuracy"]) == {"1", "2", "3"} and list(result["accuracy"]["1"]) == [str(r) for r in range(7)]


# ---- --plan: candidate splits measured, nothing written ----------------------------------------


def test_plan_prints_and_writes_json(sources, tmp_path, capsys):
    """`--plan`: one row per candidate with its loss at r = 1..R, the same numbers in the JSON,
    nothing else written. Under --init first-loop the default split's r = 1 is the source's
    loss by hand (its transformers forward on the same sample), and its deeper rows differ."""
    from grt_titan.hf.retrofit_plan import candidate_splits, sample_batches

    folder, source = sources["llama"]
    plan_json = tmp_path / "plan.json"
    args = ["--plan", "--init", "first-loop", "--tokens", "128", "--recurrences", "2"]
    assert main([str(folder), *args, "--plan-json", str(plan_json), "--prelude", "1", "--core", "2:3"]) == 0
    printed = capsys.readouterr().out
    record = json.loads(plan_json.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
    rows = {row["name"]: row for row in record["splits"]}
    assert set(rows) == set(candidate_splits(LAYERS, (1, (2, 3), 1)))
    for row in rows.values():
        assert f"| {row['name']} | --prelude {row['prelude']} --core {row['core']} --coda {row['coda']} |" in printed
        assert len(row["loss"]) == 2
    assert rows["yours"]["dropped"] == 1 and rows["default"]["dropped"] == 0
    assert rows["yours"]["stored_params"] < rows["default"]["stored_params"]
    (batch,) = sample_batches(folder, "grt_default", 128, record["seq_len"])
    with torch.no_grad():
        logits = source(batch[:, :-1], use_cache=False).logits
        expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()
    assert rows["default"]["loss"][0] == pytest.approx(expected, abs=1e-5)
    assert abs(rows["default"]["loss"][1] - expected) > 1e-3


def test_plan_under_the_exact_init_says_its_losses_cannot_rank_and_heal_steps_make_rows_differ(
    sources, tmp_path, capsys
):
    """Under --init every-depth the kept-all splits read the same loss at every r (the init is
    exact), so the table is ordered by FLOPs and parameters and its header says the losses
    cannot rank them. `--heal-steps 3` trains each candidate on the train split and scores it
    again: the healed rows differ, and the table is ordered by the healed loss at R."""
    folder, _ = sources["llama"]
    keeps_all = ["--prelude", "1", "--core", "1:2", "--coda", "2"]  # a second kept-all split beside the default
    base = [str(folder), "--plan", *keeps_all, "--tokens", "128", "--recurrences", "2", "--plan-json"]
    assert main([*base, str(tmp_path / "init.json")]) == 0
    printed = capsys.readouterr().out
    assert "ordered by FLOPs, then parameters; at --init every-depth" in printed.splitlines()[0]
    rows = json.loads((tmp_path / "init.json").read_text())["splits"]
    kept_all = [row for row in rows if row["dropped"] == 0]
    assert len(kept_all) >= 2 and len({tuple(row["loss"]) for row in kept_all}) == 1  # equal by construction
    order = [(row["forward_flops_per_token"], row["stored_params"]) for row in rows]
    assert order == sorted(order)
    assert all(row["healed_loss"] is None for row in rows)

    assert main([*base, str(tmp_path / "healed.json"), "--heal-steps", "3"]) == 0
    printed = capsys.readouterr().out
    assert "ordered by the healed loss at r = 2 after 3 steps on the train split" in printed.splitlines()[0]
    assert "| healed r = 1 | healed r = 2 |" in printed
    healed = json.loads((tmp_path / "healed.json").read_text())
    assert healed["heal_steps"] == 3
    by_name = {row["name"]: row for row in healed["splits"]}
    assert {name: row["loss"] for name, row in by_name.items()} == {row["name"]: row["loss"] for row in rows}
    kept_all = [by_name[row["name"]] for row in kept_all]
    assert len({tuple(row["healed_loss"]) for row in kept_all}) == len(kept_all)  # training tells them apart
    assert all(row["healed_loss"] != row["loss"] for row in kept_all)
    at_r = [row["healed_loss"][-1] for row in healed["splits"]]
    assert at_r == sorted(at_r)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--core", "0:3"], "--core 0:3 overlaps the prelude"),
        (["--out", "x"], "--plan writes nothing, so --out x is not used"),
        (["--tokens", "10"], "--tokens 10 is below one sequence"),
        (["--heal-steps", "-1"], "--heal-steps -1: allowed: >= 0"),
        (["--task-recipe"], "--task-recipe writes task.toml beside a retrofit's --out; --plan writes nothing"),
    ],
)
def test_plan_refuses_in_one_line(sources, tmp_path, capsys, monkeypatch, options, message):
    monkeypatch.chdir(tmp_path)
    assert main([str(sources["llama"][0]), "--plan", *options]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []
