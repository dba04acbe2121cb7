#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

static fa_status record(fa_status status, const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    return status;
}

fa_status fa_set_error(fa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(status, fmt, ap);
    va_end(ap);
    return status;
}

fa_status fa_private_set_error(fa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(status, fmt, ap);
    va_end(ap);
    return status;
}

void fa_clear_error(void) { last_error[0] = '\0'; }

const char *fa_last_error(void) { return last_error; }

const char *fa_status_string(fa_status s)
{
    switch (s) {
    case FA_SUCCESS: return "success";
    case FA_ERROR_INVALID_VALUE: return "invalid value";
    case FA_ERROR_NOT_SUPPORTED: return "not supported";
    case FA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FA_ERROR_BACKEND_UNAVAILABLE: return "backend unavailable";
    case FA_ERROR_BACKEND_FAILURE: return "backend failure";
    }
    return "unknown status";
}
