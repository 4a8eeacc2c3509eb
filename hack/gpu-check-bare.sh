#!/usr/bin/env bash
# The indexer kernels' GPU check on a machine that has an NVIDIA GPU and a python3 with torch, Triton and pytest,
# and nothing else: no package index, no .venv, pdfleet not installed. `make gpu-check` builds .venv first,
# which needs the index; this needs only the repository. pdfleet.kernels imports torch and Triton alone, so a
# package tree of one link makes it importable.
#
#   hack/gpu-check-bare.sh [OUT_DIR]
#
# Runs, in one go (about 5 minutes on one H200): the gpu-marked kernel tests (edge cases and moderate shapes,
# compiled for CUDA), then benchmarks/gpu_check.py, writing OUT_DIR/gpu-check.json and OUT_DIR/gpu-tests.log
# when OUT_DIR is given. The exit status is the first failure's: the tests', else the check's (2: no GPU).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
out="${1:-}"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/pdfleet"  # no __init__.py: pdfleet is a namespace package, as setup.py installs it
ln -s "$root/kernels" "$tree/pdfleet/kernels"
export PYTHONPATH="$tree:$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# 2 where no GPU is visible (as gpu_check.py says it); 1 with the traceback where torch, Triton or the kernels do
# not import.
"$python" - <<'EOF' || exit $?
import sys
import torch
import triton
import pdfleet.kernels
gpu = torch.cuda.is_available() and torch.cuda.get_device_name()
print(f"gpu-check-bare: python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, "
      f"GPU: {gpu or 'none visible'}", flush=True)
sys.exit(0 if gpu else 2)
EOF

# --noconftest: the suite's conftests need the operator's dependencies; these tests need torch and Triton alone.
# -c /dev/null: no addopts from pyproject.toml (its --strict-markers would refuse the unregistered `gpu` marker).
log="${out:+$out/gpu-tests.log}"
"$python" -m pytest -c /dev/null --rootdir "$root" --noconftest -q -p no:cacheprovider \
    -W ignore::pytest.PytestUnknownMarkWarning "$root/tests/unit/test_indexer_kernels_gpu.py" 2>&1 |
    tee "${log:-/dev/null}"
tests=${PIPESTATUS[0]}

"$python" "$root/benchmarks/gpu_check.py" ${out:+--json "$out/gpu-check.json"}
check=$?

echo "gpu-check-bare: tests exit $tests, check exit $check"
if [ "$tests" -ne 0 ]; then exit "$tests"; fi
exit "$check"
