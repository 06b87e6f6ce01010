// SIGINT / SIGTERM: a clean stop. The handler only raises a flag; the generation loops ask at
// each step boundary whether any rank saw a signal (one collective, so all ranks stop after the
// same step), then finish their output (the tokens generated so far, the timings, the bench
// results of completed levels) and exit. A second signal kills the process at once.
#pragma once
#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

void stop_signal_install(void);
// This process received SIGINT or SIGTERM.
int stop_signal_seen(void);
// Collective over the world: some rank received a signal.
int stop_signal_any(const k25_dist *d);

#ifdef __cplusplus
}
#endif
