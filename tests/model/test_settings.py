"""The `[grt]` settings are declared once (grt_titan/model/settings.py): the `[grt]` section of
both hosts, `CONFIGURABLE_FIELDS` and the HF config map are derived from the `setting` fields
of `GRTModelArgs`, and a setting's help is written in one place."""

import dataclasses
import re
import typing

from grt_titan.hf import config_map
from grt_titan.model.args import CONFIGURABLE_FIELDS, GRT_PARTS, METHOD_SETTINGS, GRTModelArgs
from grt_titan.model.settings import declared_settings, hf_config_keys, setting
from grt_titan.sections import GRTSection, settings_section

from grt_test_helpers import REPO

PACKAGE = REPO / "grt_titan"


@dataclasses.dataclass
class WithToySetting(GRTModelArgs):
    """The args with one more setting, declared the documented way (docs/methods.md)."""

    toy_scale: float = setting(
        0.5,
        """Toy: the scale of a new part
        (default 0.5).""",
        hf="toy_scale_json",
    )


def test_a_declared_setting_reaches_the_section_the_override_list_and_the_hf_map():
    names = [f.name for f, _ in declared_settings(WithToySetting)]
    assert names == ["toy_scale", *CONFIGURABLE_FIELDS]  # a class's own settings, then its bases'
    section = settings_section(WithToySetting)
    hints = typing.get_type_hints(section, include_extras=True)
    assert typing.get_args(hints["toy_scale"])[0] == float | None and section().toy_scale is None
    assert hints["toy_scale"].__metadata__[0].documentation == "Toy: the scale of a new part\n(default 0.5)."
    assert hf_config_keys(WithToySetting)["toy_scale"] == ("toy_scale_json", False)


def test_the_args_list_their_own_settings_then_each_methods():
    """`[grt]` (--help, run records) reads as the paper does: its settings, then each method's
    from its module, in the order `GRTModelArgs` lists those bases."""
    own = [f.name for f in dataclasses.fields(GRTModelArgs) if f.name in GRTModelArgs.__dict__["__annotations__"]]
    methods = [f.name for base in METHOD_SETTINGS for f in dataclasses.fields(base)]
    assert GRTModelArgs.__bases__ == METHOD_SETTINGS
    assert set(methods) <= set(CONFIGURABLE_FIELDS) and set(methods).isdisjoint(own)
    own_settings = [name for name in own if name in CONFIGURABLE_FIELDS]
    assert list(CONFIGURABLE_FIELDS[len(own_settings) :]) == methods  # the own ones: listed_after may reorder
    assert CONFIGURABLE_FIELDS[:2] == ("block_style", "num_recurrences")
    assert {base.__module__.rsplit(".", 1)[1] for base in METHOD_SETTINGS} == {
        "mor",
        "mor_token_choice",
        "ouro",
        "rrt",
        "poisson",
        "scse",
        "step_supervision",
    }


def test_listed_after_moves_a_setting_in_the_sections_order_only():
    @dataclasses.dataclass
    class Toy:
        a: int = setting(1, "A.", listed_after="c")
        b: int = 2
        c: int = setting(3, "C.", hf=True, hf_dense=True)
        d: int = setting(4, "D.")

    assert [f.name for f, _ in declared_settings(Toy)] == ["c", "a", "d"]
    assert [f.name for f in dataclasses.fields(Toy)] == ["a", "b", "c", "d"]
    assert hf_config_keys(Toy) == {"c": ("c", True)}


def test_the_package_uses_the_declaration():
    assert CONFIGURABLE_FIELDS == tuple(f.name for f, _ in declared_settings(GRTModelArgs))
    fields = [f.name for f in dataclasses.fields(GRTSection)]
    assert fields == [*CONFIGURABLE_FIELDS, "recurrence_checkpoint", "core_reshard_after_forward"]
    hints = typing.get_type_hints(GRTSection, include_extras=True)
    for f, declared in declared_settings(GRTModelArgs):
        assert hints[f.name].__metadata__[0].documentation == declared.help, f.name  # --grt.<name>'s help
    assert config_map.HF_SETTINGS == hf_config_keys(GRTModelArgs)
    assert config_map.HF_PARTS == tuple(GRT_PARTS)
    args = GRTModelArgs(depth_seed=5, lora_scale=3.0, gate_temperature=2.0, gate_override=0.5)
    written = config_map.hf_config_kwargs(args)
    assert {key: written[key] for key, _ in config_map.HF_SETTINGS.values()} == {
        key: getattr(args, name) for name, (key, _) in config_map.HF_SETTINGS.items()
    }
    assert config_map.model_args_from_hf_config({"model_type": "grt", **written}) == args


def test_each_setting_is_spelled_once():
    """Each help text is written once in the package (the remote model, which ships alone, has
    its own); no setting is spelled out in the section or job config modules, and none that
    the HF map copies as it is in the map."""
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py") if "remote" not in p.parts}
    words = " ".join(" ".join(sources.values()).split())
    for f, declared in declared_settings(GRTModelArgs):
        assert words.count(" ".join(declared.help.split())) == 1, f.name
    own = "\n".join(sources[PACKAGE / name] for name in ("sections.py", "job_config.py"))
    assert not [name for name in CONFIGURABLE_FIELDS if spelled(name, own)]
    mapped = sources[PACKAGE / "hf" / "config_map.py"]
    copied = {*config_map.HF_SETTINGS, *(key for key, _ in config_map.HF_SETTINGS.values())} - set(GRT_PARTS)
    assert not [name for name in sorted(copied) if spelled(name, mapped)]


def spelled(name: str, source: str) -> bool:
    """`name` as a field, keyword, attribute or string key in `source` (not a word of prose)."""
    return re.search(rf"\b{name}\s*[:=]|\.{name}\b|[\"']{name}[\"']", source) is not None


def test_spelled_finds_a_field_by_field_map():
    assert spelled("lora_rank", '("lora_rank",) * 2') and spelled("lora_rank", "x=args.lora_rank")
    assert spelled("update", "    update: Update | None = None") and not spelled("update", "the update ratio")
