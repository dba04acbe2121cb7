#!/bin/sh
# Cross-builds the library for aarch64 (the NEON kernels included) and, where qemu-user and an
# arm64 cmocka are installed, runs checkasm under qemu: every NEON kernel against the reference,
# and whole problems (forward and backward, all features) with FLASHATTN_CPU_ISA=neon against ref.
#   Needs: gcc-aarch64-linux-gnu (Debian), meson, ninja.
#   Optional, to run the tests: qemu-user, and the arm64 cmocka
#     (dpkg --add-architecture arm64 && apt-get update && apt-get install libcmocka-dev:arm64).
#   --install: install all of these first (apt-get; what CI does, ~60 s on a fresh machine).
# Usage: scripts/check-neon-cross.sh [--install] [build-dir]     (default build-aarch64)
# Exit status: 0 when the build (and the tests, if run) succeeded.
# Cost: ~35 s on the 2-core CI machine (library and checkasm only; checkasm ~10 s under qemu).
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = --install ]; then
    shift
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
    $sudo_cmd dpkg --add-architecture arm64
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
        gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libcmocka-dev:arm64 >/dev/null
fi
build=${1:-build-aarch64}

command -v aarch64-linux-gnu-gcc >/dev/null || { echo "check-neon-cross: aarch64-linux-gnu-gcc not found (apt-get install gcc-aarch64-linux-gnu)"; exit 1; }

run_tests=false
if command -v qemu-aarch64 >/dev/null && [ -e /usr/lib/aarch64-linux-gnu/libcmocka.so ]; then run_tests=true; fi

# The cross file and a Random123 link (header-only: the host's copy serves the cross build, the
# tests' oracle needs it) live beside the build folder, so that `meson test -C $build` works
# again after a source change.
rm -rf "$build" "$build.cross"
mkdir -p "$build.cross"
cross="$PWD/$build.cross/aarch64.ini"
[ -d /usr/include/Random123 ] && ln -s /usr/include/Random123 "$build.cross/Random123"

cat > "$cross" <<INI
[binaries]
c = 'aarch64-linux-gnu-gcc'
ar = 'aarch64-linux-gnu-ar'
strip = 'aarch64-linux-gnu-strip'
pkgconfig = 'pkg-config'  # the key meson < 1.3 reads
exe_wrapper = ['qemu-aarch64', '-L', '/usr/aarch64-linux-gnu']

[properties]
pkg_config_libdir = '/usr/lib/aarch64-linux-gnu/pkgconfig'

[built-in options]
c_args = ['-isystem', '$PWD/$build.cross']

[host_machine]
system = 'linux'
cpu_family = 'aarch64'
cpu = 'armv8-a'
endian = 'little'
INI

meson setup "$build" --cross-file "$cross" -Dcuda=disabled -Dhip=disabled -Dbench=false -Dtests=$run_tests >/dev/null
grep -q FA_HAVE_NEON "$build/build.ninja" || { echo "check-neon-cross: the NEON kernels were not built"; exit 1; }
if ! $run_tests; then
    meson compile -C "$build"
    echo "check-neon-cross: compile only (qemu-aarch64 or the arm64 cmocka missing: NEON kernels not run)"
    exit 0
fi
# Only what checkasm needs (the library and the test), not the whole suite.
meson compile -C "$build" tests/checkasm/test_checkasm
echo "check-neon-cross: aarch64 library with NEON kernels built in $build"
# One OpenMP thread: under qemu-user, OpenMP's thread handoffs take minutes per parallel
# region (seen with qemu 7.2), while the kernels and drivers run in seconds.
OMP_NUM_THREADS=1 QEMU_LD_PREFIX=/usr/aarch64-linux-gnu LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu \
    meson test -C "$build" --no-rebuild checkasm --print-errorlogs
# On aarch64 only the neon entries of checkasm can run: an OK gemm means they did, not skipped.
grep -q "OK \] gemm" "$build/meson-logs/testlog.txt" ||
    { echo "check-neon-cross: checkasm skipped the NEON kernels"; exit 1; }
echo "check-neon-cross: NEON kernels and whole problems pass checkasm under qemu"
