/* What libflashattn_io takes from the core library. The IO model uses a few of the core's internal
 * helpers: checked arithmetic (common/validate.c), the sized-struct read (common/sized_struct.c)
 * and the host allocator (common/alloc.c). Those have no state the two libraries must share, so
 * they are compiled into this library too (src/io/meson.build), hidden. The error record is the
 * one thing that must be shared: fa_last_error() is libflashattn's, so this library's internal
 * fa_set_error (the name those files and the model call) formats the message and hands it to
 * libflashattn's private export fa_private_set_error (src/common/error.h), as libflashattn_dist
 * does. */
#include <stdarg.h>
#include <stdio.h>

#include "../common/error.h"

fa_status fa_set_error(fa_status status, const char *fmt, ...)
{
    char message[512]; /* the size of the core's record (common/error.c); longer texts are cut there too */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return fa_private_set_error(status, "%s", message);
}
