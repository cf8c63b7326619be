#!/usr/bin/env bash
# emote's checks on a lent GPU machine, from the repository's root: the gpu-marked tests, then
# cuda_bench.py. Wheels in .whl/ (benchmarks/gpu_wheels.sh) are installed first. Logs go to
# $OUT (the device tool's folder that comes back) or /tmp/gpu_checks. The tests and the
# benchmark each stop at a time limit (TESTS_S, BENCH_S seconds), so the whole run fits in one
# device call of 10 minutes with the defaults; SECTIONS, UPDATES and QUICK=1 (eager and the
# recipes' mode only, the Q networks apart and stacked, and stacked with TF32) pick
# cuda_bench's work.
set -uo pipefail
out=${OUT:-/tmp/gpu_checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"
} 2>&1 | tee "$out/machine.txt"
# Only the files that hold gpu tests: the others import peers (Ray, Minari, skrl) not there.
mapfile -t files < <(grep -rl "mark.gpu" tests | sort)
timeout "${TESTS_S:-180}" python3 -m pytest -q -p no:cacheprovider -o addopts= \
    --import-mode=importlib -rs -m gpu "${files[@]}" 2>&1 | tee "$out/gpu_tests.log"
tests=${PIPESTATUS[0]}
timeout "${BENCH_S:-360}" python3 benchmarks/cuda_bench.py ${QUICK:+--quick} \
    --sections "${SECTIONS:-updates,pendulum,sampling}" --updates "${UPDATES:-2000}" 2>&1 \
    | tee "$out/cuda_bench.log"
bench=${PIPESTATUS[0]}
echo "gpu tests exit ${tests}, cuda_bench exit ${bench}" | tee -a "$out/machine.txt"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
