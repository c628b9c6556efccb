"""Known-harmless messages that torchao's import prints before `grt-titan`'s own output.

Why they appear: transformers (5.x) imports torchao whenever it is installed, to register
its TorchAo quantizer (transformers/quantizers/quantizer_torchao.py, reached from
`transformers.modeling_utils`); torchao is installed for torchtitan's float8/MX converters.
`grt-titan export-hf` verifies the written folder with the transformers model, so the
import happens there even though nothing is quantized. grt_titan itself imports torchao only
where float8 tensor parallelism is applied (grt_titan/infra/parallelize.py).

What is printed (torchao 0.18, torch 2.13), and why it does not matter to these commands:
- torchao/__init__.py: "Failed to load .../_C_mxfp8...so" and ".../_C_cutlass_90a...so".
  Both are CUDA kernel libraries (they link libtorch_cuda: MX and CUTLASS sm90a kernels)
  that cannot load on a CPU build of torch. Exporting, importing and analysing a model
  never call a torchao kernel.
- torch/utils/_pytree.py: "register_constant() on Enum subclasses is deprecated", once per
  torchao enum (KernelPreference, ScaleCalculationMode) that torchao registers at import:
  torchao's code, nothing a user can act on.

`quiet_torchao_import()` drops exactly those records (logger, message and torchao's names)
and is called by the `grt-titan` commands (grt_titan/cli.py) and the decoding benchmarks
(benchmarks/generate_bench.py, halting_bench.py). Training does not call it: there float8/MX
may use these kernels and a failed load is worth seeing.
Remove once transformers imports torchao lazily and torchao's enums stop calling
register_constant().
"""

from __future__ import annotations

import logging

# torchao's CUDA-only extension libraries, by the stem of their file name.
TORCHAO_CUDA_LIBRARIES = ("_C_mxfp8", "_C_cutlass_90a")
_TORCHAO_LOGGER = "torchao"
_PYTREE_LOGGER = "torch.utils._pytree"
_ENUM_DEPRECATION = "is an Enum subclass and is now natively supported"


class _TorchaoImportNoise(logging.Filter):
    """Drops the records listed in the module docstring; lets every other record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == _TORCHAO_LOGGER:
            message = record.getMessage()
            return not (
                message.startswith("Failed to load ") and any(name in message for name in TORCHAO_CUDA_LIBRARIES)
            )
        if record.name == _PYTREE_LOGGER and _ENUM_DEPRECATION in str(record.msg):
            cls = record.args[0] if isinstance(record.args, tuple) and record.args else None
            return not (isinstance(cls, type) and cls.__module__.split(".")[0] == "torchao")
        return True


_FILTER = _TorchaoImportNoise()


def quiet_torchao_import() -> None:
    """Install the filter on the two loggers (idempotent). Call before transformers is imported."""
    for name in (_TORCHAO_LOGGER, _PYTREE_LOGGER):
        logging.getLogger(name).addFilter(_FILTER)
