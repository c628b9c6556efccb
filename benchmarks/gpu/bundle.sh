#!/usr/bin/env bash
# Wheels for an offline GPU node whose preinstalled stack has torch (2.11-2.15), triton,
# transformers, tiktoken, safetensors, tensorboard, matplotlib and numpy, but not what
# grt_titan needs beyond it: torchtitan, torchao, torchdata, tyro, datasets (torchtitan's
# trainer imports it) and their pure-Python or prebuilt dependencies, plus our own wheel.
# Needs the package registry here; the node needs none (docs/benchmarks.md, "The GPU suite").
#
#   benchmarks/gpu/bundle.sh [--python 3.12] [--torch 2.11] [--out benchmarks/gpu/wheels] [--no-smoke]
#
# First it runs the suite at debug size on this CPU (`suite.py --cpu-smoke` through its test,
# tests/benchmarks/test_gpu_suite.py, marker gpu_prep: about a minute on 2 cores), so that a
# part that would fail on the node fails here, not on the session's minutes; CI deselects that
# test. --no-smoke skips it (a rebundle of code the smoke already passed).
#
# then on the node, from the repository root (no network):
#
#   pip install --no-index --no-deps --target .gpu_site benchmarks/gpu/wheels/*.whl
#   PYTHONPATH=.gpu_site python benchmarks/gpu/suite.py
#
# benchmarks/gpu/check_bundle.sh runs that install line and one training step here.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=3.12
TORCH=2.11
OUT=benchmarks/gpu/wheels
SMOKE=1
LIMIT=$((64 * 1024 * 1024))  # the device machine carries at most 64 MiB of ignored files
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY="$2"; shift 2 ;;
        --torch) TORCH="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --no-smoke) SMOKE=0; shift ;;
        *) echo "bundle.sh: unknown argument '$1'; allowed: --python X.Y, --torch X.Y, --out DIR, --no-smoke" >&2; exit 2 ;;
    esac
done

# One torchao per torch (README, "Supported versions"): 0.18 loads its kernels on torch >= 2.11.
case "$TORCH" in
    2.11|2.12|2.13|2.14|2.15) TORCHAO=0.18.0 ;;
    *) echo "bundle.sh: --torch $TORCH is outside the supported range; allowed: 2.11 to 2.15" >&2; exit 2 ;;
esac
case "$PY" in
    3.10|3.11|3.12|3.13) ;;
    *) echo "bundle.sh: --python $PY; allowed: 3.10 to 3.13" >&2; exit 2 ;;
esac

# datasets 4.0 and pyarrow 19 rather than the newest (pyarrow 24+ alone is 49 MB): torchtitan
# only imports datasets here (grt_titan reads its own token shards), and these fit 64 MiB.
PACKAGES=(
    "torchtitan==0.2.2" "torchao==$TORCHAO" "torchdata==0.11.0"
    "tyro==1.0.17" "docstring-parser==0.18.0" "typeguard==4.6.1"
    "datasets==4.0.0" "pyarrow==19.0.1" "pandas==3.1.1" "dill==0.3.8" "multiprocess==0.70.16" "xxhash==4.1.0"
    "requests==2.32.5" "urllib3==2.5.0" "idna==3.10" "charset-normalizer==3.4.3" "certifi==2025.8.3"
)

if [ "$SMOKE" = 1 ]; then
    python3 -m pytest tests/benchmarks/test_gpu_suite.py -m gpu_prep -q -p no:cacheprovider
fi

rm -rf "$OUT"
mkdir -p "$OUT"
python3 -m pip wheel -q --no-deps -w "$OUT" .
python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$PY" --implementation cp --abi "cp${PY/./}" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT" "${PACKAGES[@]}"

bytes=$(du -cb "$OUT"/*.whl | tail -n 1 | cut -f1)
ls -l "$OUT"
echo "bundle: $(ls "$OUT"/*.whl | wc -l) wheels, $((bytes / 1024)) KiB, for Python $PY and torch $TORCH (torchao $TORCHAO)"
if [ "$bytes" -gt "$LIMIT" ]; then
    echo "bundle.sh: $OUT holds $bytes bytes, over the 64 MiB limit" >&2
    exit 1
fi
