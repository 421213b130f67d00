/* A call chain of known depth for the unwinder's tests, built with -O2
 * -fomit-frame-pointer: main -> chain_a -> chain_b -> chain_c -> chain_d -> chain_e ->
 * chain_leaf, which spins. noinline and the volatile sink keep every frame real. */
#include <stdio.h>

static volatile unsigned long sink;

__attribute__((noinline)) void chain_leaf(unsigned long n) {
    for (;;) {
        for (unsigned long i = 0; i < n; i++) sink += i * 7;
    }
}
__attribute__((noinline)) void chain_e(unsigned long n) { chain_leaf(n + 1); sink++; }
__attribute__((noinline)) void chain_d(unsigned long n) { chain_e(n + 1); sink++; }
__attribute__((noinline)) void chain_c(unsigned long n) { chain_d(n + 1); sink++; }
__attribute__((noinline)) void chain_b(unsigned long n) { chain_c(n + 1); sink++; }
__attribute__((noinline)) void chain_a(unsigned long n) { chain_b(n + 1); sink++; }

int main(void) {
    printf("ready\n");
    fflush(stdout);
    chain_a(1000);
    return 0;
}
