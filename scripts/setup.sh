#!/usr/bin/env bash
# One-step set-up on a fresh Debian/Ubuntu machine: installs the build and test dependencies,
# configures and builds flashattn in ./build (Release). Safe to run again.
#   FA_SETUP_NO_APT=1   skip the apt-get step (dependencies already present)
#   FA_BUILD_DIR=dir    build folder (default: build)
#   FA_SETUP_NO_GPU_TOOLS=1   do not install cuobjdump/nvdisasm (static GPU profile) when nvcc is found
#   extra arguments     passed to `meson setup` (e.g. -Dcuda=disabled)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential pkg-config meson ninja-build   # toolchain
  cmake                                          # CMake package files (meson cmake module) and their test
  libcmocka-dev librandom123-dev                 # tests: cmocka, Random123 (independent Philox)
  libopenblas-dev                                # bench: standard attention baseline
  hipcc libamdhip64-dev                          # HIP plugin (AMD), compiled only
  clang llvm libclang-rt-14-dev libomp-14-dev valgrind   # sanitizer, fuzzing, valgrind CI steps
  gnuplot-nox                                    # IO figures
  python3-dev python3-venv                       # Python package (pip install ., scripts/ci-python.sh)
  libopenmpi-dev openmpi-bin                     # src/dist: ring attention over MPI, its mpirun tests
)

if [ "${FA_SETUP_NO_APT:-0}" != 1 ]; then
  missing=()
  for p in "${packages[@]}"; do
    [[ "$p" == \#* ]] && continue
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    sudo_cmd=()
    [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
    echo "setup: installing ${missing[*]}"
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# nvcc lives outside PATH in NVIDIA's packaging; the CUDA plugin is built when it is found.
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# The static profile of the CUDA plugin (meson test sass_profile, bench/gpu/sass_profile.py) reads
# its SASS with cuobjdump and nvdisasm: NVIDIA's wheels, in a local venv the test looks in. Without
# them the test skips; a failed install only warns (e.g. no network).
if command -v nvcc >/dev/null && [ "${FA_SETUP_NO_GPU_TOOLS:-0}" != 1 ]; then
  tools_venv=.venv-gpu-tools
  if ! compgen -G "$tools_venv/lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm" >/dev/null ||
     ! compgen -G "$tools_venv/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump" >/dev/null; then
    echo "setup: installing cuobjdump and nvdisasm into $tools_venv"
    if ! { python3 -m venv "$tools_venv" &&
           "$tools_venv/bin/pip" install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; }; then
      echo "setup: warning: could not install nvidia-cuda-cuobjdump/nvidia-cuda-nvdisasm; the sass_profile test will skip" >&2
    fi
  fi
fi

build="${FA_BUILD_DIR:-build}"
if [ -f "$build/build.ninja" ]; then
  meson setup --reconfigure "$build" "$@" >/dev/null
else
  meson setup "$build" "$@"
fi
start=$(date +%s)
meson compile -C "$build"
echo "setup: built in $(( $(date +%s) - start )) s; run the tests with: meson test -C $build"
