#include "sized_struct.h"

#include <string.h>

#include "error.h"

fa_status fa_sized_struct_read(const char *name, const void *src, size_t min_size, size_t full_size, void *full)
{
    if (!src) return fa_set_error(FA_ERROR_INVALID_VALUE, "%s: is NULL", name);
    size_t size;
    memcpy(&size, src, sizeof size); /* struct_size is the first member of every sized struct */
    if (size < min_size)
        return fa_set_error(FA_ERROR_INVALID_VALUE,
                            "%s->struct_size: %zu is below the %zu bytes of the smallest known layout "
                            "(set it with the struct's init function)",
                            name, size, min_size);
    const unsigned char *bytes = src;
    for (size_t i = full_size; i < size; ++i)
        if (bytes[i] != 0)
            return fa_set_error(FA_ERROR_NOT_SUPPORTED,
                                "%s->struct_size: %zu bytes with fields set past the %zu this library (%s) knows",
                                name, size, full_size, fa_version_string());
    const size_t known = size < full_size ? size : full_size;
    memcpy(full, src, known);
    memcpy(full, &full_size, sizeof full_size); /* the internal copy is always complete */
    return FA_SUCCESS;
}
