// SIGINT / SIGTERM -> a flag read at step boundaries (see stop_signal.h).
#include "stop_signal.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t seen;

static void on_signal(int sig) {
    seen = 1;
    signal(sig, SIG_DFL); // a second signal ends the process the default way
}

void stop_signal_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    // A write to stdout that waits on a slow reader must not fail with EINTR: stdio drops
    // the text it held, and the run would end in a write error instead of the clean stop.
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int stop_signal_seen(void) { return seen != 0; }

int stop_reasons_any(const k25_dist *d, int mine) {
    if (seen) mine |= K25_STOP_SIGNAL;
    int any = mine;
    if (d && d->world_size > 1)
        MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_BOR, d->world));
    return any;
}

int stop_signal_any(const k25_dist *d) { return (stop_reasons_any(d, 0) & K25_STOP_SIGNAL) != 0; }
