/* The shared-library half of chain.c's call chain. */
#include <unistd.h>

static volatile unsigned long lib_sink;

__attribute__((noinline)) void chain_lib_leaf(unsigned long n, int sleep) {
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
