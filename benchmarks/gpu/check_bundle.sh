#!/usr/bin/env bash
# The bundle's install line, offline, into a node-like Python (torch and the node's stack,
# none of torchtitan/torchao/torchdata/tyro/datasets), then `import grt_titan` and one
# training step of grt_debug (on CPU through grt_titan.train; torchtitan.train on a GPU).
#
#   benchmarks/gpu/check_bundle.sh PYTHON [WHEELS]     # WHEELS: benchmarks/gpu/wheels
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${1:?usage: check_bundle.sh PYTHON [WHEELS]}"
WHEELS="${2:-benchmarks/gpu/wheels}"
SITE="$(mktemp -d)/site"
RUN="$(dirname "$SITE")/run"

for pkg in torchtitan torchao torchdata tyro datasets; do
    if "$PYTHON" -c "import $pkg" 2>/dev/null; then
        echo "check_bundle.sh: $PYTHON already imports $pkg; use an environment without it" >&2
        exit 2
    fi
done
# The line of benchmarks/gpu/bundle.sh, with the index switched off.
PIP_CONFIG_FILE=/dev/null "$PYTHON" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
export PYTHONPATH="$SITE"
cd "$(dirname "$SITE")"  # outside the repository: grt_titan comes from the bundle
"$PYTHON" -c "import grt_titan, torch, torchao, torchtitan; print('grt_titan', grt_titan.__file__, '| torch', torch.__version__, '| torchao', torchao.__version__)"
CONFIG="$OLDPWD/train_configs/grt_debug.toml"
"$PYTHON" -m torch.distributed.run --nproc_per_node=1 -m grt_titan.train --job.config_file "$CONFIG" \
    --job.dump_folder "$RUN" --training.steps 1 --training.local_batch_size 2 --training.seq_len 64 \
    --validation.no-enable --checkpoint.no-enable --metrics.no-enable-tensorboard --metrics.log_freq 1 \
    2>&1 | tee "$RUN.log" | grep -E "step: *1 " || { tail -n 40 "$RUN.log" >&2; exit 1; }
echo "check_bundle.sh: installed offline, imported, one training step"
