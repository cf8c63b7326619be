#!/usr/bin/env bash
# Fetches into .whl/ (ignored by git) the wheels that emote's GPU checks need and the lent GPU
# machines lack: they run Python 3.12 with PyTorch, onnx, onnxruntime, typer, rich and
# tensorboard already installed, and reach no package index. Run it here, where pip reaches PyPI,
# then run benchmarks/gpu_checks.sh there with `.whl` carried along (26 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=.git/info/exclude
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
platforms=()
for platform in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 \
    manylinux1 manylinux_2_31 manylinux_2_34; do
    platforms+=(--platform "${platform}_x86_64")
done
# The versions the dev environment was measured with; Box2D provides gymnasium's box2d module
# (LunarLander) as a wheel, where the box2d extra's box2d-py needs a compiler and swig.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" --platform any --dest .whl \
    gymnasium==1.4.0 farama-notifications==0.0.6 Box2D==2.3.10 \
    zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 crc32c==2.9.post0 \
    zarrs==0.2.3 zlib-ng==1.1.0 stable-baselines3==2.9.2
ls .whl
