"""torchtitan's fake backend (`--comm.mode fake_backend`): dry runs whose numbers are not real.

One process plays rank 0 of `NGPU` ranks on torch's "fake" process group: every collective
returns without moving data, so an all-gather's or reduce-scatter's output holds whatever
its buffer held. Plans, shapes, compile, memory and collective counts are real; losses,
gradient norms and MFU are not, and a gradient can be NaN or inf at step 1 (dense_llama_1b
at 32 ranks, sequence 256, stopped with `NonFiniteStepError`). Under the fake backend
- the non-finite step guard (grt_titan/components/nonfinite.py) is not installed,
- the loss-spike rewind (grt_titan/components/loss_spike.py) is off,
- MFU prints as `mfu: n/a (fake backend)` and is left out of TensorBoard
  (grt_titan/components/metrics.py),
and the metrics processor's builder says so once at start-up (`NOTICE`). docs/parallelism.md
("At cluster scale without the hardware") describes these dry runs.
"""

from __future__ import annotations

import torch.distributed as dist

FAKE_BACKEND = "fake_backend"  # torchtitan's `[comm] mode`
NOTICE = (
    "fake backend: collectives move no data; losses, gradient norms and MFU are not real, "
    "the non-finite guard and loss-spike rewind are off"
)


def is_fake_backend(job_config=None) -> bool:
    """Whether this is a fake-backend dry run: `[comm] mode = "fake_backend"` of `job_config`.

    Without a job config (torchtitan hands the optimizer builder only `[optimizer]`), the
    default process group tells: that mode is what starts torch's "fake" backend.
    """
    if job_config is not None:
        return getattr(getattr(job_config, "comm", None), "mode", None) == FAKE_BACKEND
    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake"
