#!/bin/sh
# Lists the code objects and kernels of the HIP plugin: the offload bundler must find one code
# object per requested gfx target, each holding every attention kernel, and the CDNA ones must
# contain MFMA instructions (the MFMA tile layer). The *INS_9fma_layer names match the tile
# kernels on the plain-FMA and MFMA layers (mangled fa_tc::forward<fa_tc::fma_layer<...>, W>, ...).
# Usage: list_hip_kernels.sh PLUGIN TARGET...
set -eu
plugin=$1; shift
bundler=
for candidate in clang-offload-bundler clang-offload-bundler-15 /usr/lib/llvm-15/bin/clang-offload-bundler \
                 /usr/lib/llvm-*/bin/clang-offload-bundler; do
    if command -v "$candidate" >/dev/null 2>&1; then bundler=$(command -v "$candidate"); break; fi
done
[ -n "$bundler" ] || { echo "FAIL: clang-offload-bundler not found (Debian package clang-tools-15)"; exit 1; }
objcopy=$(command -v llvm-objcopy-15 || command -v llvm-objcopy || command -v objcopy)
readelf=$(command -v llvm-readelf-15 || command -v llvm-readelf)
objdump=$(command -v llvm-objdump-15 || command -v llvm-objdump)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$objcopy" --dump-section .hip_fatbin="$work/fatbin" "$plugin" 2>/dev/null ||
    objcopy -O binary --only-section=.hip_fatbin "$plugin" "$work/fatbin"
echo "bundles in $plugin:"
"$bundler" --list --type=o --input="$work/fatbin" 2>/dev/null | sed 's/^/  /'
status=0
for target in "$@"; do
    triple=hipv4-amdgcn-amd-amdhsa--$target
    if ! "$bundler" --list --type=o --input="$work/fatbin" 2>/dev/null | grep -qx "$triple"; then
        echo "FAIL: no code object for $target"; status=1; continue
    fi
    "$bundler" --unbundle --type=o --input="$work/fatbin" --targets="$triple" --output="$work/$target.co" 2>/dev/null
    kernels=$("$readelf" --symbols "$work/$target.co" | awk '/\.kd$/ {print $NF}' | sort -u)
    count=$(echo "$kernels" | grep -c . || true)
    echo "$target: $count kernels"
    echo "$kernels" | sed 's/\.kd$//; s/^/  /'
    for name in forward backward_dq backward_dkdv row_delta 7forwardINS_9fma_layer 11backward_dqINS_9fma_layer 13backward_dkdvINS_9fma_layer 7forwardINS_10mfma_layer 13backward_dkdvINS_10mfma_layer; do
        echo "$kernels" | grep -q "$name" || { echo "FAIL: $target lacks kernel $name"; status=1; }
    done
    case "$target" in
    gfx908|gfx90a)
        mfma=$("$objdump" -d "$work/$target.co" | grep -c v_mfma || true)
        echo "$target: $mfma v_mfma instructions"
        [ "$mfma" -gt 0 ] || { echo "FAIL: $target has no MFMA instruction"; status=1; };;
    esac
done
exit $status
