#!/bin/sh
# Installs the build into a temporary DESTDIR, compiles test_client.c against the installed
# pkg-config file and runs it against the installed library.
# Arguments: meson build_dir prefix libdir cc client_source b_sanitize
set -eu
meson=$1 build=$2 prefix=$3 libdir=$4 cc=$5 client=$6 sanitize=$7
case $libdir in /*) ;; *) libdir=$prefix/$libdir ;; esac
stage=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-install.XXXXXX")
trap 'rm -rf "$stage"' EXIT INT TERM

"$meson" install -C "$build" --destdir "$stage" --no-rebuild --quiet >"$stage/install.log" 2>&1 || {
    cat "$stage/install.log"; echo "test_install: meson install failed"; exit 1; }
test -f "$stage$prefix/include/flashattn.h" || { echo "test_install: header not installed"; exit 1; }
test -f "$stage$libdir/pkgconfig/flashattn.pc" || { echo "test_install: flashattn.pc not installed"; exit 1; }

export PKG_CONFIG_PATH="$stage$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$stage"
unset PKG_CONFIG_LIBDIR || true
flags=$(pkg-config --cflags --libs flashattn)
echo "pkg-config: $flags"
# shellcheck disable=SC2086 # flags are a list of words
# A sanitized library needs its runtime first in the client too.
case $sanitize in none | "") ;; *) flags="-fsanitize=$sanitize $flags" ;; esac
"$cc" -std=c11 -Wall -Werror -o "$stage/client" "$client" $flags -lm
LD_LIBRARY_PATH="$stage$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$stage/client"
