// Progress lines on stderr for long byte-counting tasks.
#include "progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

#define PROGRESS_MIN_TOTAL ((uint64_t)1 << 30) // shown without a terminal above 1 GiB
#define PROGRESS_TTY_MS 250.0                  // terminal: redraw at most 4 times a second
#define PROGRESS_LOG_MS 5000.0                 // log file: a line every 5 s

static struct {
    char what[64];
    uint64_t total;
    uint64_t done;    // atomic
    int shown, tty, active;
    double t0, next;  // next: earliest time of the next line (ms), guarded by `printing`
    int printing;     // atomic flag: one thread prints at a time
} prog;

static void print_line(double now, int final) {
    uint64_t done = __atomic_load_n(&prog.done, __ATOMIC_RELAXED);
    double s = (now - prog.t0) / 1e3;
    double gb = (double)done / 1e9, rate = s > 0 ? gb / s : 0;
    double pct = prog.total ? 100.0 * (double)done / (double)prog.total : 100.0;
    char left[32] = "";
    if (!final && rate > 0 && done < prog.total)
        snprintf(left, sizeof left, ", %.0f s left", ((double)(prog.total - done) / 1e9) / rate);
    fprintf(stderr, "%s%s: %.2f / %.2f GB (%.0f%%), %.2f GB/s, %.1f s%s%s", prog.tty ? "\r" : "",
            prog.what, gb, (double)prog.total / 1e9, pct, rate, s, left,
            prog.tty ? (final ? "\033[K\n" : "\033[K") : "\n");
    fflush(stderr);
}

void progress_begin(const char *what, uint64_t total) {
    memset(&prog, 0, sizeof prog);
    snprintf(prog.what, sizeof prog.what, "%s", what);
    prog.total = total;
    prog.tty = isatty(STDERR_FILENO);
    prog.shown = k25_log_rank <= 0 && (prog.tty || total > PROGRESS_MIN_TOTAL);
    prog.t0 = k25_now_ms();
    prog.next = prog.t0 + (prog.tty ? PROGRESS_TTY_MS : PROGRESS_LOG_MS);
    prog.active = 1;
}

void progress_update(uint64_t bytes) {
    if (!prog.active) return;
    __atomic_fetch_add(&prog.done, bytes, __ATOMIC_RELAXED);
    if (!prog.shown) return;
    if (__atomic_exchange_n(&prog.printing, 1, __ATOMIC_ACQUIRE)) return;
    double now = k25_now_ms();
    if (now >= prog.next) {
        print_line(now, 0);
        prog.next = now + (prog.tty ? PROGRESS_TTY_MS : PROGRESS_LOG_MS);
    }
    __atomic_store_n(&prog.printing, 0, __ATOMIC_RELEASE);
}

void progress_end(void) {
    if (prog.active && prog.shown) print_line(k25_now_ms(), 1);
    prog.active = 0;
}
