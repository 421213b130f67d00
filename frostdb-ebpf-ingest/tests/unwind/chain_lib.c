/* The shared-library half of chain.c's call chain. */
#include <signal.h>
#include <unistd.h>

static volatile unsigned long lib_sink;

/* Waits inside the handler: a stack that runs through the signal frame. */
static void on_signal(int sig) {
    (void)sig;
    for (;;) pause();
}

/* sleep: 0 spins, 1 waits in pause(), 2 raises a signal whose handler waits. */
__attribute__((noinline)) void chain_lib_leaf(unsigned long n, int sleep) {
    if (sleep == 2) {
        signal(SIGUSR1, on_signal);
        raise(SIGUSR1);
    }
    for (;;) {
        if (sleep) {
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
