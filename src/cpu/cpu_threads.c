/* Thread helpers that compile with or without OpenMP. */
#include "cpu_tile.h"

#ifdef _OPENMP
#include <omp.h>
#endif

int fa_cpu_thread_count(int requested)
{
#ifdef _OPENMP
    return requested > 0 ? requested : omp_get_max_threads();
#else
    (void)requested;
    return 1;
#endif
}

int fa_cpu_thread_num(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
