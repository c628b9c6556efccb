"""grt_titan/runtime/quiet_imports.py: only torchao's known import messages are dropped."""

import enum
import logging

from grt_titan.runtime.quiet_imports import _FILTER

PYTREE_MESSAGE = (
    "%s is an Enum subclass and is now natively supported by torch.compile as an "
    "opaque value type. Calling register_constant() on Enum subclasses is deprecated "
    "and will be an error in a future release."
)


def record(name: str, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def enum_from(module: str) -> type:
    cls = enum.Enum("KernelPreference", "AUTO TORCH")
    cls.__module__ = module
    return cls


def test_torchao_cuda_library_failures_are_dropped():
    for name in ("_C_mxfp8.cpython-310-x86_64-linux-gnu.so", "_C_cutlass_90a.abi3.so"):
        msg = f"Failed to load /venv/torchao/{name}: Could not load this library: /venv/torchao/{name}"
        assert not _FILTER.filter(record("torchao", msg))


def test_other_torchao_messages_pass():
    assert _FILTER.filter(record("torchao", "Failed to load /venv/torchao/_C.abi3.so: undefined symbol"))
    assert _FILTER.filter(record("torchao", "Skipping import of cpp extensions due to incompatible torch version."))
    # The same text from another logger is not torchao's import.
    assert _FILTER.filter(record("grt_titan", "Failed to load /venv/torchao/_C_mxfp8.so: x"))


def test_only_torchao_enum_deprecations_are_dropped():
    assert not _FILTER.filter(
        record(
            "torch.utils._pytree", PYTREE_MESSAGE, enum_from("torchao.quantization.quantize_.common.kernel_preference")
        )
    )
    assert _FILTER.filter(record("torch.utils._pytree", PYTREE_MESSAGE, enum_from("my_package.enums")))
    assert _FILTER.filter(record("torch.utils._pytree", "some other pytree warning %s", enum_from("torchao")))
