#!/bin/sh
# A built library exports exactly the fa_* functions its public headers declare FA_API, plus the
# private names given (src/common/error.h: fa_private_set_error, for libflashattn_dist and
# libflashattn_io only), so no internal function leaks into the ABI and no function of another
# library's header is exported (libflashattn has no fa_io_*). Names the toolchain adds (starting
# with '_') are ignored.
# Usage: check_library_exports.sh LIBRARY "PRIVATE NAMES" HEADER...
set -eu
library=$1
private=$2
shift 2
[ -f "$library" ] || { echo "FAIL: $library was not built"; exit 1; }
exported=$(nm -D --defined-only "$library" | awk '{print $3}' | grep -v '^_' | sort -u)
declared=$( (grep -ho 'FA_API[^;(]*(' "$@" | grep -o 'fa_[a-z0-9_]*($' | tr -d '('; for name in $private; do echo "$name"; done) | sort -u)
if [ "$exported" != "$declared" ]; then
    echo "FAIL: $library exports (>) differ from its headers' FA_API functions and the private names (<):"
    printf '%s\n' "$declared" >"${TMPDIR:-/tmp}/fa-declared.$$"
    printf '%s\n' "$exported" | diff "${TMPDIR:-/tmp}/fa-declared.$$" - || true
    rm -f "${TMPDIR:-/tmp}/fa-declared.$$"
    exit 1
fi
echo "OK: $library exports $(echo "$exported" | wc -l) names: its headers' FA_API functions${private:+ and $private}"
