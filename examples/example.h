/* What the examples share: the check a caller of flashattn writes around each call, and
 * deterministic inputs. Copy it along with an example. */
#ifndef FLASHATTN_EXAMPLE_H
#define FLASHATTN_EXAMPLE_H

#include <stdio.h>

#include <flashattn.h>

/* On failure: print the call, its status and the library's one-line reason (fa_last_error names
 * the argument), then jump to the caller's clean-up label `done`. */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        fa_status st_ = (call);                                                                    \
        if (st_ != FA_SUCCESS) {                                                                   \
            fprintf(stderr, "%s: %s: %s\n", #call, fa_status_string(st_), fa_last_error());        \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* Deterministic inputs in [-1, 1) (a linear congruential generator). */
static inline float uniform(unsigned *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / (float)(1u << 23) - 1.0f;
}

#endif
