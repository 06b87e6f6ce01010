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

// Reasons for every rank to stop after the same step, agreed in the one collective.
enum { K25_STOP_SIGNAL = 1, K25_STOP_OUTPUT = 2 /* rank 0 could not write its output */ };
// Collective over the world: the union of every rank's reasons, K25_STOP_SIGNAL included when
// this process received a signal; `mine` adds this rank's other reasons.
int stop_reasons_any(const k25_dist *d, int mine);

#ifdef __cplusplus
}
#endif
