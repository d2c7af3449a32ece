#!/usr/bin/env bash
# The device runs of a GPU round, one phase per call (each phase fits one 10-minute device command):
#
#   bash benchmarks/gpu_round.sh setup             # wheels from .whl/, samples from .devdata/samples
#   bash benchmarks/gpu_round.sh first-use         # cold compile of our kernels and gsplat (a fresh cache)
#   bash benchmarks/gpu_round.sh cuda-tests        # pytest -m cuda
#   bash benchmarks/gpu_round.sh export            # bench_export at the open targets' cases
#   bash benchmarks/gpu_round.sh generate          # generate, the modes, the batch, a single CLI call
#   bash benchmarks/gpu_round.sh no-compiler       # mesh, generate and reconstruct with nvcc hidden
#   bash benchmarks/gpu_round.sh startup           # the mesh CLI's wall clock split into parts
#   bash benchmarks/gpu_round.sh scenes            # the tiled scenes: CUDA tests, 4M, 10M, a per-tile bake
#   bash benchmarks/gpu_round.sh round1|round2|roundA|roundB   # phases grouped into one call each
#
# Logs and JSON go to $OUT (the device tool's output folder; ./out elsewhere). On the device there is no
# network: the packages the image lacks travel as wheels in .whl/ (installed into /tmp/site), the shared
# samples as .devdata/samples (put where the tests look for them, ../shared/samples).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/bin:$PATH
# the card in the result files' names (h100, h200), from the GPU actually lent
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE "[HAB][0-9]{2,3}" | head -1 | tr "A-Z" "a-z")
export CARD=${CARD:-gpu}

setup() {
  if [ -d .whl ] && [ ! -d /tmp/site/gsplat ]; then  # reinstalling would touch the sources: gsplat rebuilds
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || return 1
  fi
  if [ -d .devdata/samples ] && [ ! -d ../shared/samples ]; then
    mkdir -p ../shared && cp -r .devdata/samples ../shared/
  fi
  mkdir -p /tmp/bin
  printf '#!/bin/sh\nexec python3 -c "import sys; from microdreamer.cli import main; sys.exit(main())" "$@"\n' \
    >/tmp/bin/microdreamer
  chmod +x /tmp/bin/microdreamer
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
  python3 -c "import torch, gsplat, diffusers, transformers; print('torch', torch.__version__, 'gsplat', gsplat.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)"
  git log -1 --format='commit %H' 2>/dev/null || true
}

first_use() {
  # a user's first `microdreamer mesh` on a GPU: both compiles in one process, then the same command warm
  local cache=/tmp/ext_cold
  rm -rf "$cache" /tmp/fu
  mkdir -p /tmp/fu
  local ply=../shared/samples/splats/dg_ghost_amd_17k.ply
  for run in cold warm; do
    local t0=$(date +%s.%N)
    TORCH_EXTENSIONS_DIR=$cache microdreamer -v mesh "$ply" -o /tmp/fu/ghost_$run.glb --device cuda \
      >"$OUT/first_use_$run.log" 2>&1
    local rc=$?
    local t1=$(date +%s.%N)
    echo "first-use $run: rc $rc wall $(python3 -c "print(round($t1 - $t0, 2))") s"
    grep -E "built the microdreamer|gsplat: CUDA extension|Setting up CUDA|error" "$OUT/first_use_$run.log" | head -5
  done
  du -sh "$cache"/* 2>/dev/null
}

cuda_tests() {
  python3 -m pytest -m cuda -q -p no:cacheprovider -rfE "$@" 2>&1 | tee "$OUT/cuda_tests.log" | tail -40
}

export_bench() {
  python3 benchmarks/bench_export.py --device cuda --cases "${CASES:-ghost@128,guitar@256,synth1M@512}" \
    --repeat 3 --cli-repeat 2 --chart guitar@256 --out "$OUT/export_${CARD}.json" 2>&1 | tail -40
}

generate_bench() {
  # generate at its defaults (3 runs after one model build), the text and image+text modes, the batch's
  # steady state and single CLI calls (start-up included), all on full-size random weights
  python3 benchmarks/bench_generate.py --random-weights full --iters "${ITERS:-21}" --repeats 3 --out /tmp/bg \
    --json "$OUT/generate_${CARD}.json" 2>&1 | tail -25
  python3 benchmarks/bench_modes.py --random-weights full --repeats 3 --out /tmp/bm --json "$OUT/modes_${CARD}.json" \
    2>&1 | tail -15
  python3 benchmarks/bench_batch.py --random-weights full --inputs 6 --singles 2 --no-probes --out /tmp/bb \
    --json "$OUT/batch_${CARD}.json" 2>&1 | tail -20
}

mesh_startup() {
  # where a mesh CLI call's wall clock goes on the GPU (parts in fresh processes, -X importtime)
  python3 benchmarks/bench_mesh_startup.py ../shared/samples/splats/pc_guitar_91k_sh0.decoded.ply --device cuda \
    --reps 3 --json "$OUT/mesh_startup_${CARD}.json" 2>&1 | tail -30
}

scenes() {
  # the tiled scene path on the GPU: its CUDA tests (the per-tile bake's among them: gsplat builds here), the
  # 4M and 10M scenes of guitar copies (tiles serial and on 4 threads), and the per-tile UV bake of a 1M scene
  timeout 240 python3 -m pytest tests/test_field_gather.py tests/test_scene.py tests/test_scene_texture.py \
    tests/test_tileset.py -q -m cuda -p no:cacheprovider -rfE 2>&1 | tail -6 | tee "$OUT/scene_cuda_tests.log"
  timeout 120 python3 benchmarks/bench_scene.py --gaussians 4000000 --modes tiles --device cuda --max-rss 60 \
    --tile-threads 1,4 --out "$OUT/scene_4000k_${CARD}.json" 2>&1 | tail -24
  timeout 200 python3 benchmarks/bench_scene.py --gaussians 10000000 --modes tiles --device cuda --max-rss 60 \
    --tile-threads 1,4 --out "$OUT/scene_10000k_${CARD}.json" 2>&1 | tail -24
  timeout 60 python3 benchmarks/bench_scene.py --gaussians 1000000 --modes tiles --device cuda --max-rss 60 \
    --keep /tmp/k1 --out "$OUT/scene_1000k_${CARD}.json" 2>&1 | tail -3
  local t0=$(date +%s.%N)
  timeout 150 microdreamer mesh /tmp/k1/scene_1000000.ply -o /tmp/k1/baked.glb --tiles auto --tile-texture bake \
    --device cuda --overwrite 2>&1 | grep -v "iso-level pass\|] tile " | tail -12 | tee "$OUT/scene_bake_1000k.log"
  echo "bake CLI wall: $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s" | tee -a "$OUT/scene_bake_1000k.log"
}

no_compiler() {
  # a GPU with no CUDA compiler: nvcc off PATH, CUDA_HOME pointing at no toolkit, an empty extensions cache
  local path
  path=$(echo "$PATH" | tr ':' '\n' | while read -r d; do [ -x "$d/nvcc" ] || echo "$d"; done | paste -sd:)
  local ply=../shared/samples/splats
  rm -rf /tmp/nc /tmp/ext_none && mkdir -p /tmp/nc
  env PATH="$path" CUDA_HOME=/nonexistent TORCH_EXTENSIONS_DIR=/tmp/ext_none bash -c '
    echo "nvcc: $(command -v nvcc || echo none)"
    python3 -c "from microdreamer.kernels import _backend; print(\"toolkit:\", _backend.toolkit())"
    for case in dg_ghost_amd_17k pc_guitar_91k_sh0.decoded; do
      for run in 1 2; do
        t0=$(date +%s.%N)
        microdreamer mesh '"$ply"'/$case.ply -o /tmp/nc/$case.glb --overwrite --device cuda 2>&1 | grep -v "^  "
        echo "no-compiler mesh $case run $run: wall $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s"
      done
    done
    t0=$(date +%s.%N)
    microdreamer generate ../shared/samples/images/ghost_rgba.png -o /tmp/nc/gen --random-weights full 2>&1 | tail -6
    echo "no-compiler generate: wall $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s"
    microdreamer render-views ../shared/samples/meshes/spot/spot_triangulated.obj \
      --texture ../shared/samples/meshes/spot/spot_texture.png -o /tmp/nc/spot --views 16 >/dev/null 2>&1
    t0=$(date +%s.%N)
    microdreamer reconstruct /tmp/nc/spot -o /tmp/nc/rec --iters 300 2>&1 | tail -4
    echo "no-compiler reconstruct (300 iters): wall $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s"
  ' 2>&1 | tee "$OUT/no_compiler.log"
}

phase=${1:-}
shift || true
case "$phase" in
  setup) setup ;;
  first-use) setup && first_use ;;
  cuda-tests) setup && cuda_tests "$@" ;;
  export) setup && export_bench ;;
  generate) setup && generate_bench ;;
  no-compiler) setup && no_compiler ;;
  startup) setup && mesh_startup ;;
  scenes) setup && TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext_cold} scenes ;;
  roundA)  # one call: the cold compile, the CUDA tests on its build, the mesh CLI's start-up
    setup || exit 1
    first_use
    export TORCH_EXTENSIONS_DIR=/tmp/ext_cold
    timeout 420 bash -c "$(declare -f cuda_tests); cuda_tests"
    timeout 90 bash -c "$(declare -f mesh_startup); mesh_startup" ;;
  roundB)  # one call on the warm machine: export and generate timings
    setup || exit 1
    export TORCH_EXTENSIONS_DIR=/tmp/ext_cold
    timeout 140 bash -c "$(declare -f export_bench); export_bench"
    timeout 420 bash -c "$(declare -f generate_bench); generate_bench" ;;
  round2)  # one call: generate's timings
    setup || exit 1
    generate_bench ;;
  round1)  # one call: the cold compile, the CUDA tests on its build, the export timings, no compiler
    setup || exit 1
    first_use
    export TORCH_EXTENSIONS_DIR=/tmp/ext_cold
    timeout 420 bash -c "$(declare -f cuda_tests); cuda_tests"
    timeout 130 bash -c "$(declare -f export_bench); export_bench"
    timeout 120 bash -c "$(declare -f no_compiler); no_compiler" ;;
  *) echo "usage: $0 setup|first-use|cuda-tests|export|generate|no-compiler|startup|scenes|round1|round2|roundA|roundB" >&2; exit 2 ;;
esac
