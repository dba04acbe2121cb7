#!/bin/sh
# Cross-builds the library for aarch64 (the NEON kernels included) and, where qemu-user and an
# arm64 cmocka are installed, runs checkasm under qemu: every NEON kernel against the reference,
# and whole problems (forward and backward, all features) with FLASHATTN_CPU_ISA=neon against ref.
#   Needs: gcc-aarch64-linux-gnu (Debian), meson, ninja.
#   Optional, to run the tests: qemu-user, and the arm64 cmocka
#     (dpkg --add-architecture arm64 && apt-get update && apt-get install libcmocka-dev:arm64).
# Usage: scripts/check-neon-cross.sh [build-dir]     (default build-aarch64)
# Exit status: 0 when the build (and the tests, if run) succeeded.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build-aarch64}
cross=$(mktemp)
trap 'rm -f "$cross"' EXIT

command -v aarch64-linux-gnu-gcc >/dev/null || { echo "check-neon-cross: aarch64-linux-gnu-gcc not found (apt-get install gcc-aarch64-linux-gnu)"; exit 1; }

run_tests=false
if command -v qemu-aarch64 >/dev/null && [ -e /usr/lib/aarch64-linux-gnu/libcmocka.so ]; then run_tests=true; fi

# Random123 is header-only: the host's copy serves the cross build (the tests' oracle needs it).
r123_dir=$(mktemp -d)
trap 'rm -f "$cross"; rm -rf "$r123_dir"' EXIT
[ -d /usr/include/Random123 ] && ln -s /usr/include/Random123 "$r123_dir/Random123"

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
c_args = ['-isystem', '$r123_dir']

[host_machine]
system = 'linux'
cpu_family = 'aarch64'
cpu = 'armv8-a'
endian = 'little'
INI

rm -rf "$build"
meson setup "$build" --cross-file "$cross" -Dcuda=disabled -Dhip=disabled -Dbench=false -Dtests=$run_tests >/dev/null
meson compile -C "$build" -j 1
grep -q FA_HAVE_NEON "$build/build.ninja" || { echo "check-neon-cross: the NEON kernels were not built"; exit 1; }
echo "check-neon-cross: aarch64 library with NEON kernels built in $build"
if $run_tests; then
    # One OpenMP thread: under qemu-user, OpenMP's thread handoffs take minutes per parallel
    # region (seen with qemu 7.2), while the kernels and drivers run in seconds.
    OMP_NUM_THREADS=1 QEMU_LD_PREFIX=/usr/aarch64-linux-gnu LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu \
        meson test -C "$build" checkasm --print-errorlogs
    # On aarch64 only the neon entries of checkasm can run: an OK gemm means they did, not skipped.
    grep -q "OK \] gemm" "$build/meson-logs/testlog.txt" ||
        { echo "check-neon-cross: checkasm skipped the NEON kernels"; exit 1; }
    echo "check-neon-cross: NEON kernels and whole problems pass checkasm under qemu"
else
    echo "check-neon-cross: compile only (qemu-aarch64 or the arm64 cmocka missing: NEON kernels not run)"
fi
