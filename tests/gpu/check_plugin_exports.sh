#!/bin/sh
# A built GPU plugin exists where the registry looks (next to libflashattn.so), exports exactly
# one dynamic symbol, fa_backend_plugin_entry, and does not depend on the core library.
# The CUDA plugin must also not need the CUDA runtime at run time (it is linked statically).
# Usage: check_plugin_exports.sh PLUGIN [cuda|hip]
set -eu
plugin=$1
kind=${2:-}
[ -f "$plugin" ] || { echo "FAIL: $plugin was not built"; exit 1; }
exports=$(nm -D --defined-only "$plugin" | awk '{print $3}' | sort -u)
if [ "$exports" != "fa_backend_plugin_entry" ]; then
    echo "FAIL: $plugin exports:"; echo "$exports"; exit 1
fi
needed=$(readelf -d "$plugin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "$plugin needs: $(echo $needed)"
case "$needed" in *libflashattn*) echo "FAIL: the plugin links the core library"; exit 1;; esac
if [ "$kind" = cuda ]; then
    case "$needed" in *libcudart*|*libcuda.so*) echo "FAIL: the CUDA plugin needs the CUDA runtime or driver library at load time"; exit 1;; esac
fi
if [ "$kind" = hip ]; then
    case "$needed" in *libamdhip64*) ;; *) echo "FAIL: the HIP plugin should load libamdhip64"; exit 1;; esac
fi
echo "OK: $plugin exports only fa_backend_plugin_entry"
