"""grt_titan/teacher.py's start-up checks of `[distill]`: one line per problem, naming the key
(in process, on grt_debug's config as the student)."""

from __future__ import annotations

import pytest
from torchtitan.protocols.train_spec import get_train_spec

import grt_titan.spec  # noqa: F401  registers the spec
from grt_titan.config_checks import check_job_config
from grt_titan.teacher import teacher_problems
from grt_titan.tokenizer import GPT2_4K_TIKTOKEN_PATH, load_tokenizer

from grt_test_helpers import REPO, parse_config

DENSE_TOML = REPO / "train_configs" / "dense_debug.toml"


def student(config):
    """The student's args (the config's flavor and `[grt]`; its `[distill]` is what is checked)."""
    args = get_train_spec("grt").model_args[config.model.flavor].replace()
    distill = config.distill
    config.distill = type(distill)()  # update_from_config runs the whole start-up check
    args.update_from_config(config)
    config.distill = distill
    return args


@pytest.fixture
def teacher_folder(tmp_path):
    """A folder that looks like a DCP step (its weights are never read by the checks)."""
    step = tmp_path / "teacher" / "step-5"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    return step.parent


def problems(*overrides, shards=None, device_bytes=None, tokenizer=None):
    config = parse_config(*overrides)
    return teacher_problems(config, student(config), shards, device_bytes, tokenizer)


def test_no_teacher_no_problem():
    assert problems("--distill.alpha", "7") == []


def test_alpha_and_temperature_are_named(teacher_folder):
    lines = problems(
        "--distill.teacher", str(teacher_folder), "--distill.teacher_config", str(DENSE_TOML),
        "--distill.alpha", "1.5", "--distill.temperature", "0",
    )  # fmt: skip
    assert lines == [
        "[distill] alpha = 1.5 is invalid; allowed: [0, 1]",
        "[distill] temperature = 0.0 is invalid; allowed: > 0",
    ]


@pytest.mark.parametrize(
    "where, extra, expected",
    [
        ("missing", [], "[distill] teacher = '{path}' does not exist"),
        ("empty", [], "is neither a Hugging Face folder (config.json) nor a torchtitan checkpoint"),
        ("checkpoint", [], "[distill] teacher_config is empty"),
        ("checkpoint", ["--distill.teacher_config", "nowhere.toml"], "[distill] teacher_config: config file"),
        ("bad_json", [], "[distill] teacher: {path}/config.json cannot be read"),
    ],
)
def test_unreadable_teacher_is_named(where, extra, expected, teacher_folder, tmp_path):
    path = {"missing": tmp_path / "nothing", "checkpoint": teacher_folder}.get(where, tmp_path / where)
    if where in ("empty", "bad_json"):
        path.mkdir()
    if where == "bad_json":
        (path / "config.json").write_text("{not json")
    (line,) = problems("--distill.teacher", str(path), *extra)
    assert expected.format(path=path) in line


def test_vocabulary_tokenizer_tp_and_memory_are_named(teacher_folder, tmp_path):
    base = ["--distill.teacher", str(teacher_folder), "--distill.teacher_config", str(DENSE_TOML)]
    assert (
        problems(*base, shards=2, device_bytes=2**40, tokenizer=load_tokenizer(GPT2_4K_TIKTOKEN_PATH)) == []
    )  # grt_debug's
    # Another vocabulary padding than the student's.
    (line,) = problems(*base, "--grt.vocab_multiple_of", "128")
    assert line.startswith("[distill] teacher: vocabulary 4097 (padded to 4097) differs from the student's 4097")
    assert "(padded to 4224)" in line and "vocab_multiple_of" in line

    class OtherTokenizer:  # same size, other ids
        path = "other.tiktoken"

        def get_vocab_size(self):
            return 4097

        def encode(self, text, **kwargs):
            return [0]

    (line,) = problems(*base, tokenizer=OtherTokenizer())
    assert line.startswith("[distill] teacher: its tokenizer") and "[model] hf_assets_path" in line
    # A teacher TP cannot split (student args from the config before TP is set, which the student's own check refuses).
    config = parse_config(*base, "--parallelism.tensor_parallel_degree", "3")
    (line,) = teacher_problems(config, student(parse_config()), None, None)
    assert line.startswith("[distill] teacher: n_heads = 4") and "tensor_parallel_degree = 3" in line
    (line,) = problems(*base, shards=2, device_bytes=2**20)
    assert line.startswith(f"[distill] teacher = '{teacher_folder}': 2,638,464 parameters need about")
    assert "data_parallel_shard_degree" in line


def test_checks_run_at_start_up(tmp_path):
    config = parse_config("--distill.teacher", str(tmp_path / "nothing"), "--distill.alpha", "-1")
    with pytest.raises(ValueError) as e:
        check_job_config(config, student(config))
    assert "[distill] alpha = -1.0 is invalid" in str(e.value) and "[distill] teacher = " in str(e.value)


@pytest.fixture
def dense_teacher():
    """(args, model, state) of a seeded dense_debug model in eval mode, torchtitan pointed at
    the CPU as grt_titan.train points it here."""
    from grt_titan.run_reader import load_model_args
    from grt_titan.runtime.cpu_support import enable_cpu_training

    from grt_test_helpers import build_model

    enable_cpu_training()
    args = load_model_args(DENSE_TOML)[0]
    dense = build_model(args, seed=4).eval()
    return args, dense, {k: v.detach().clone() for k, v in dense.state_dict().items()}


def built_teacher_and_logits(dense_teacher, *overrides):
    """`build_teacher` on one rank with the `[distill]` `overrides`, float32, and the logits of
    the teacher and of the written model on the same tokens."""
    import torch

    from grt_titan.teacher import build_teacher

    from grt_test_helpers import one_rank_dims

    args, dense, _ = dense_teacher
    teacher = build_teacher(parse_config(*overrides, "--training.mixed_precision_param", "float32"), one_rank_dims())
    tokens = torch.randint(0, args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return teacher, teacher(tokens), dense(tokens)


@pytest.mark.parametrize("kind", ["checkpoint", "grt_export", "stock_gpt2"])
def test_every_source_builds_the_teacher_it_holds(kind, dense_teacher, tmp_path):
    """`build_teacher` on one rank from each source `[distill] teacher` takes: a torchtitan
    checkpoint with its TOML, our Hugging Face export (config.json + remote code) and a stock
    GPT-2 folder (`--format stock`): frozen, in eval mode, and its logits are the written
    model's (float32)."""
    import torch

    from grt_titan.checkpoints.load import save_checkpoint
    from grt_titan.hf.convert import write_hf_folder
    from grt_titan.hf.stock_folders import write_stock_folder

    args, _, state = dense_teacher
    if kind == "checkpoint":
        save_checkpoint(tmp_path / "teacher" / "step-3", state)
        source = ["--distill.teacher", str(tmp_path / "teacher"), "--distill.teacher_config", str(DENSE_TOML)]
    else:
        write = write_hf_folder if kind == "grt_export" else write_stock_folder
        write(tmp_path / "teacher", state, args, tokenizer_path=GPT2_4K_TIKTOKEN_PATH)
        source = ["--distill.teacher", str(tmp_path / "teacher")]
    teacher, got, want = built_teacher_and_logits(dense_teacher, *source)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    assert torch.equal(got, want)


def test_the_students_float8_converter_converts_the_teacher(dense_teacher, tmp_path):
    """With `quantize.linear.float8` among the student's converters the teacher's linears
    compute in float8 too (emulated here), all but its LM head, from the same weights: its
    logits stay close to the float32 teacher's."""
    import torch
    from torchao.float8.float8_linear import Float8Linear

    from grt_titan.checkpoints.load import save_checkpoint

    save_checkpoint(tmp_path / "teacher" / "step-3", dense_teacher[2])
    source = ["--distill.teacher", str(tmp_path / "teacher"), "--distill.teacher_config", str(DENSE_TOML)]
    float8 = ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate"]
    config = parse_config(*source, *float8)
    check_job_config(config, student(config))  # the teacher's widths are multiples of 16
    teacher, got, want = built_teacher_and_logits(dense_teacher, *source, *float8)
    converted = {name for name, m in teacher.named_modules() if isinstance(m, Float8Linear)}
    linears = {name for name, m in teacher.named_modules() if isinstance(m, torch.nn.Linear)}
    assert converted == linears - {"output"} and converted
    assert not torch.equal(got, want)  # float8 matmuls
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.99


def test_fsdp_times_tp_loads_the_tp_shards_then_shards_them(dense_teacher, tmp_path):
    """FSDP 2 x TP 2 (rank 0 of 4 on the fake process group): the teacher builds, every
    parameter a 2-D DTensor (FSDP over TP) holding this rank's shape of the written weight.
    Loading the same full state dict into FSDP's strided shards over TP shards stops inside
    torch (the defect `parallelize_teacher` orders around: TP, load, then FSDP); when torch
    loads it, this test says the order can go. The values need real collectives (the fake
    backend's scatter moves no data): tests/infra/test_parallel_parity.py's distilled FSDP 2 x
    TP 2 run equals one rank."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed import ParallelDims

    from grt_titan.hf.stock_folders import write_stock_folder
    from grt_titan.infra.parallelize import apply_tp, shard_data_parallel
    from grt_titan.model.model import build_meta_model
    from grt_titan.teacher import build_teacher

    args, _, state = dense_teacher
    # A stock GPT-2 folder: read without collectives (DCP's load plans over the process group,
    # whose pickled objects the fake backend does not move on torch 2.11).
    write_stock_folder(tmp_path / "teacher", state, args, tokenizer_path=GPT2_4K_TIKTOKEN_PATH)
    config = parse_config(
        "--distill.teacher",
        str(tmp_path / "teacher"),
        *("--parallelism.tensor_parallel_degree", "2", "--training.mixed_precision_param", "float32"),
    )
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        dims = ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1, world_size=4)
        dims.build_mesh()
        teacher = build_teacher(config, dims)
        sharded = {}
        for name, param in teacher.state_dict().items():
            assert isinstance(param, DTensor) and param.device_mesh.ndim == 2, name  # FSDP x TP
            shape, _ = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
            assert param.shape == state[name].shape and param.to_local().shape == torch.Size(shape), name
            sharded[name] = tuple(param.placements) != (param.placements[0],) * 2  # split on some mesh dim
        assert sharded["prelude.layers.0.attention.wq.weight"] and sharded["tok_embeddings.weight"]

        with torch.device("meta"):
            model = build_meta_model(args)
        apply_tp(model, dims.get_mesh("tp"), loss_parallel=True, enable_float8_tensorwise_tp=False)
        shard_data_parallel(model, dims, config, pp_enabled=False, reshard_after_forward_policy="always")
        model.to_empty(device="cpu")
        with pytest.raises(AssertionError):
            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    finally:
        dist.destroy_process_group()
