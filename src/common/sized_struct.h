/* Reading a caller's struct that starts with `size_t struct_size` (the ABI policy in the README):
 * the library copies the fields that fit into a full internal struct holding the defaults, once,
 * at the API boundary, so nothing past the caller's struct_size is ever read. */
#ifndef FA_SIZED_STRUCT_H
#define FA_SIZED_STRUCT_H
#include <stddef.h>

#include "flashattn.h"

/* full: a struct of full_size bytes already holding the defaults. src's struct_size must be at
 * least min_size (the oldest sized layout) else FA_ERROR_INVALID_VALUE; a struct_size above
 * full_size (a newer client) is accepted when its extra bytes are all zero, else
 * FA_ERROR_NOT_SUPPORTED. name: the argument in messages ("desc"). */
fa_status fa_sized_struct_read(const char *name, const void *src, size_t min_size, size_t full_size, void *full);
#endif
