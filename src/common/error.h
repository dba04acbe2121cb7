/* The thread's last error: a fixed text per status plus one detailed line. */
#ifndef FA_ERROR_H
#define FA_ERROR_H
#include "flashattn.h"

#if defined(__GNUC__)
#  define FA_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#  define FA_PRINTF(a, b)
#endif

/* Records the message for this thread and returns status, so callers can `return fa_set_error(...)`.
 * Internal to libflashattn (hidden). */
fa_status fa_set_error(fa_status status, const char *fmt, ...) FA_PRINTF(2, 3);
/* The same, exported under a private name (not in any public header, not API) for
 * the optional libraries over this one (libflashattn_dist, libflashattn_io), whose failures must
 * show in this library's fa_last_error(). */
FA_API fa_status fa_private_set_error(fa_status status, const char *fmt, ...) FA_PRINTF(2, 3);
void fa_clear_error(void);
#endif
