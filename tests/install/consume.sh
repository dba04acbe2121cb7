#!/bin/sh
# Builds and runs one client (tests/core/test_client.c: prints the backends available, then a
# forward and backward checked against closed forms, and an IO-model estimate) against flashattn
# and libflashattn_io (which brings flashattn) in one of three ways:
#   pkgconfig  install into a temporary DESTDIR, compile with pkg-config's flags (flashattn_io)
#   cmake      install, add the fake plugin as the CUDA plugin, MOVE the installed tree, then
#              find_package(flashattn COMPONENTS io) from the moved tree; the client must load the plugin from
#              the moved tree, and from FLASHATTN_PLUGIN_DIR when that is set
#   meson      a parent Meson project with this repository as subprojects/flashattn and
#              dependency('flashattn') and dependency('flashattn_io') (forced to the subproject
#              even if one is installed); the
#              plugin is found beside the library in the build tree
# The fake plugin (tests/plugin/fake_plugin.c) reports no devices, naming the file it was loaded from, so the
# client's "cuda:" line says which copy the registry opened.
# With FA_DIST_CLIENT set (libflashattn_dist built, mpirun found), each way also builds that MPI
# client (examples/ring_attention.c) against flashattn_dist.pc, the CMake component dist
# (flashattn::flashattn_dist) or dependency('flashattn_dist'), and runs it on 2 ranks.
# Environment (set by tests/install/meson.build): FA_MESON FA_BUILD FA_PREFIX FA_LIBDIR FA_CC
# FA_CLIENT FA_SANITIZE FA_FAKE_PLUGIN FA_SOURCE FA_VERSION FA_INCOMPATIBLE_VERSIONS FA_HERE, and
# FA_DIST_CLIENT FA_MPIRUN, and FA_SKIP_REASON (non-empty: this way cannot be tested here; exit 77, skipped)
set -eu
way=$1
if [ -n "${FA_SKIP_REASON:-}" ]; then
    echo "consume $way: skipped: $FA_SKIP_REASON"
    exit 77
fi
case $FA_LIBDIR in /*) libdir=$FA_LIBDIR ;; *) libdir=$FA_PREFIX/$FA_LIBDIR ;; esac
stage=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-$way.XXXXXX")
trap 'rm -rf "$stage"' EXIT INT TERM
fail() { echo "consume $way: $*"; exit 1; }
sanitize_flags=
case $FA_SANITIZE in none | "") ;; *) sanitize_flags="-fsanitize=$FA_SANITIZE" ;; esac

install_tree() { # into $stage/dest, the DESTDIR root
    "$FA_MESON" install -C "$FA_BUILD" --destdir "$stage/dest" --no-rebuild --quiet >"$stage/install.log" 2>&1 || {
        cat "$stage/install.log"; fail "meson install failed"; }
    headers="flashattn.h flashattn_io.h"
    if [ -n "${FA_DIST_CLIENT:-}" ]; then headers="$headers flashattn_dist.h"; fi
    for header in $headers; do
        test -f "$stage/dest$FA_PREFIX/include/$header" || fail "$header not installed"
    done
}

# Runs the client ($1, with the rest as environment), shows its output, and requires the forward
# and backward to pass and the fake plugin to be reported at the given path ($plugin_at).
run_client() {
    client=$1; shift
    env "$@" "$client" >"$stage/run.log" 2>&1 || { cat "$stage/run.log"; fail "client failed"; }
    sed 's/^/  | /' "$stage/run.log"
    grep -q "forward and backward match" "$stage/run.log" || fail "client did not check its results"
    if [ -n "${plugin_at:-}" ]; then
        grep -qF "fake test plugin at $plugin_at," "$stage/run.log" || fail "the plugin was not loaded from $plugin_at"
    fi
}

# Runs the MPI client ($1, with the rest as environment) on 2 ranks; it checks the gathered ring
# output against one fa_forward and says so.
run_dist_client() {
    client=$1; shift
    env "$@" "$FA_MPIRUN" -np 2 --oversubscribe "$client" >"$stage/dist.log" 2>&1 || { cat "$stage/dist.log"; fail "MPI client failed"; }
    sed 's/^/  | /' "$stage/dist.log"
    grep -q "max |ring - single process|" "$stage/dist.log" || fail "the MPI client did not check its results"
}

case $way in
pkgconfig)
    install_tree
    test -f "$stage/dest$libdir/pkgconfig/flashattn.pc" || fail "flashattn.pc not installed"
    test -f "$stage/dest$libdir/pkgconfig/flashattn_io.pc" || fail "flashattn_io.pc not installed"
    export PKG_CONFIG_PATH="$stage/dest$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$stage/dest"
    unset PKG_CONFIG_LIBDIR || true
    pkg-config --print-requires flashattn_io | grep -q "^flashattn = $FA_VERSION\$" || fail "flashattn_io.pc does not require flashattn = $FA_VERSION"
    flags=$(pkg-config --cflags --libs flashattn_io)
    echo "pkg-config: $flags"
    # shellcheck disable=SC2086 # flags are lists of words; a sanitized library needs its runtime first
    "$FA_CC" -std=c11 -Wall -Werror -o "$stage/client" "$FA_CLIENT" $sanitize_flags $flags -lm
    run_client "$stage/client" LD_LIBRARY_PATH="$stage/dest$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if [ -n "${FA_DIST_CLIENT:-}" ]; then
        test -f "$stage/dest$libdir/pkgconfig/flashattn_dist.pc" || fail "flashattn_dist.pc not installed"
        requires=$(pkg-config --print-requires flashattn_dist)
        echo "flashattn_dist requires:" $requires
        echo "$requires" | grep -q "^flashattn = $FA_VERSION\$" || fail "flashattn_dist.pc does not require flashattn = $FA_VERSION"
        # The sysroot stands for the target system, which has the MPI too: its include and library
        # folders (from the MPI's own .pc, outside the sysroot) are linked in.
        mpi_module=$(echo "$requires" | grep -v "^flashattn" | head -n 1 | cut -d' ' -f1)
        if [ -n "$mpi_module" ]; then
            for dir in $(PKG_CONFIG_SYSROOT_DIR= pkg-config --cflags-only-I --libs-only-L "$mpi_module" | sed 's/-[IL]//g'); do
                mkdir -p "$(dirname "$stage/dest$dir")"
                test -e "$stage/dest$dir" || ln -s "$dir" "$stage/dest$dir"
            done
        fi
        flags=$(pkg-config --cflags --libs flashattn_dist)
        echo "pkg-config flashattn_dist: $flags"
        # shellcheck disable=SC2086
        "$FA_CC" -std=c11 -Wall -Werror -o "$stage/dist_client" "$FA_DIST_CLIENT" $sanitize_flags $flags -lm
        run_dist_client "$stage/dist_client" LD_LIBRARY_PATH="$stage/dest$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    ;;
cmake)
    install_tree
    test -f "$stage/dest$libdir/cmake/flashattn/flashattnConfig.cmake" || fail "flashattnConfig.cmake not installed"
    test -f "$stage/dest$libdir/cmake/flashattn/flashattnConfigVersion.cmake" || fail "flashattnConfigVersion.cmake not installed"
    mkdir -p "$stage/dest$libdir/flashattn"
    cp "$FA_FAKE_PLUGIN" "$stage/dest$libdir/flashattn/libflashattn-cuda.so"
    mv "$stage/dest" "$stage/moved"
    moved=$stage/moved$FA_PREFIX moved_libdir=$stage/moved$libdir
    echo "installed under $stage/dest$FA_PREFIX, moved to $moved"
    cmake -S "$FA_HERE/cmake" -B "$stage/build" -DCMAKE_PREFIX_PATH="$moved" -DCMAKE_C_COMPILER="$FA_CC" \
        -DCMAKE_C_FLAGS="$sanitize_flags" -DCMAKE_EXE_LINKER_FLAGS="$sanitize_flags" \
        -DFA_CLIENT_SOURCE="$FA_CLIENT" -DFA_DIST_CLIENT_SOURCE="${FA_DIST_CLIENT:-}" -DFA_VERSION="$FA_VERSION" -DFA_INCOMPATIBLE_VERSIONS="$FA_INCOMPATIBLE_VERSIONS" \
        >"$stage/cmake.log" 2>&1 || { cat "$stage/cmake.log"; fail "cmake configure failed"; }
    grep "flashattn" "$stage/cmake.log" | sed 's/^/  cmake: /'
    grep -qF "plugins in $moved_libdir/flashattn" "$stage/cmake.log" || fail "flashattn_PLUGIN_DIR is not in the moved tree"
    grep -qF "flashattn component io: TRUE" "$stage/cmake.log" || fail "find_package(flashattn COMPONENTS io) failed"
    cmake --build "$stage/build" >"$stage/cmake-build.log" 2>&1 || { cat "$stage/cmake-build.log"; fail "cmake build failed"; }
    # The client finds the moved library through the RPATH CMake gives it, and its plugins beside it.
    plugin_at=$moved_libdir/flashattn/libflashattn-cuda.so run_client "$stage/build/client" FLASHATTN_PLUGIN_DIR=
    mkdir "$stage/override"
    cp "$FA_FAKE_PLUGIN" "$stage/override/libflashattn-cuda.so"
    echo "with FLASHATTN_PLUGIN_DIR=$stage/override:"
    plugin_at=$stage/override/libflashattn-cuda.so run_client "$stage/build/client" FLASHATTN_PLUGIN_DIR="$stage/override"
    if [ -n "${FA_DIST_CLIENT:-}" ]; then
        grep -qF "flashattn component dist: TRUE" "$stage/cmake.log" || fail "find_package(flashattn COMPONENTS dist) failed"
        run_dist_client "$stage/build/dist_client"
    fi
    ;;
meson)
    parent=$stage/parent
    mkdir -p "$parent/subprojects"
    cp "$FA_HERE/meson-parent/meson.build" "$FA_HERE/meson-parent/meson_options.txt" "$parent/"
    cp "$FA_CLIENT" "$parent/client.c"
    dist=false
    if [ -n "${FA_DIST_CLIENT:-}" ]; then cp "$FA_DIST_CLIENT" "$parent/dist_client.c"; dist=true; fi
    ln -s "$FA_SOURCE" "$parent/subprojects/flashattn"
    "$FA_MESON" setup "$parent/build" "$parent" --force-fallback-for=flashattn -Dflashattn_version="$FA_VERSION" \
        -Ddist=$dist >"$stage/setup.log" 2>&1 || {
        cat "$stage/setup.log"; fail "meson setup of the parent project failed"; }
    grep -q "Dependency flashattn found: YES .*(overridden)" "$stage/setup.log" || {
        cat "$stage/setup.log"; fail "dependency('flashattn') did not come from the subproject"; }
    grep -q "Dependency flashattn_io found: YES .*(overridden)" "$stage/setup.log" || {
        cat "$stage/setup.log"; fail "dependency('flashattn_io') did not come from the subproject"; }
    "$FA_MESON" compile -C "$parent/build" >"$stage/compile.log" 2>&1 || { cat "$stage/compile.log"; fail "build failed"; }
    # GPU plugins are found beside the subproject's library in the build tree.
    cp "$FA_FAKE_PLUGIN" "$parent/build/subprojects/flashattn/src/libflashattn-cuda.so"
    plugin_at=$parent/build/subprojects/flashattn/src/libflashattn-cuda.so run_client "$parent/build/client" FLASHATTN_PLUGIN_DIR=
    if [ "$dist" = true ]; then
        grep -q "Dependency flashattn_dist found: YES .*(overridden)" "$stage/setup.log" || {
            cat "$stage/setup.log"; fail "dependency('flashattn_dist') did not come from the subproject"; }
        run_dist_client "$parent/build/dist_client"
    fi
    ;;
*) fail "unknown way (pkgconfig, cmake, meson)" ;;
esac
echo "consume $way: OK"
