/* The shared-library half of chain.c's call chain. */
#include <signal.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long lib_sink;

/* Waits inside the handler: a stack that runs through the signal frame. */
static void on_signal(int sig) {
    (void)sig;
    for (;;) pause();
}

/* Spins inside the handler. */
static void on_signal_spin(int sig) {
    for (unsigned long i = 0;; i++) lib_sink += i * (unsigned long)sig;
}

/* sleep: 0 spins, 1 waits in pause(), 2 raises a signal whose handler waits, 3 one whose
 * handler spins, 4 reads the clock in a loop (in the vDSO, without entering the kernel). */
__attribute__((noinline)) void chain_lib_leaf(unsigned long n, int sleep) {
    if (sleep == 2 || sleep == 3) {
        signal(SIGUSR1, sleep == 2 ? on_signal : on_signal_spin);
        raise(SIGUSR1);
    }
    for (;;) {
        if (sleep == 4) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            lib_sink += (unsigned long)t.tv_nsec;
        } else if (sleep) {
            pause();
        } else {
            for (unsigned long i = 0; i < n; i++) lib_sink += i * 7;
        }
    }
}
__attribute__((noinline)) void chain_lib_d(unsigned long n, int sleep) {
    chain_lib_leaf(n + 1, sleep);
    lib_sink++;
}
__attribute__((noinline)) void chain_lib_c(unsigned long n, int sleep) {
    chain_lib_d(n + 1, sleep);
    lib_sink++;
}
