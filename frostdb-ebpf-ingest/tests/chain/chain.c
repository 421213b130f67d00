/* A call chain of known depth for the unwinder's tests, built with -O2
 * -fomit-frame-pointer: main -> chain_a -> chain_b -> chain_lib_c -> chain_lib_d ->
 * chain_lib_leaf, the last three in libchain.so (chain_lib.c). `chain sleep` waits in
 * pause() at the bottom of the chain; `chain signal` raises a signal there whose handler
 * waits in pause(); `chain signal-spin` one whose handler spins; `chain clock` reads the
 * clock there in a loop (vDSO code); `chain spin` spins there. noinline and the volatile
 * sink keep every frame real (no tail calls, no inlining). */
#include <stdio.h>
#include <string.h>

void chain_lib_c(unsigned long n, int sleep);

static volatile unsigned long sink;

__attribute__((noinline)) void chain_b(unsigned long n, int sleep) {
    chain_lib_c(n + 1, sleep);
    sink++;
}
__attribute__((noinline)) void chain_a(unsigned long n, int sleep) {
    chain_b(n + 1, sleep);
    sink++;
}

int main(int argc, char **argv) {
    int sleep = argc < 2                              ? 0
                : strcmp(argv[1], "sleep") == 0       ? 1
                : strcmp(argv[1], "signal") == 0      ? 2
                : strcmp(argv[1], "signal-spin") == 0 ? 3
                : strcmp(argv[1], "clock") == 0       ? 4
                                                      : 0;
    printf("ready\n");
    fflush(stdout);
    chain_a(1000, sleep);
    return 0;
}
