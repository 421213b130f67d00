/* Code that appears while the program runs: spins in waiting() until a line arrives on
 * stdin, then dlopen()s the library named by its argument (libchain.so) and spins in its
 * chain: late_call -> chain_lib_c -> chain_lib_d -> chain_lib_leaf. Built -O2
 * -fomit-frame-pointer like chain.c. */
#include <dlfcn.h>
#include <poll.h>
#include <stdio.h>

static volatile unsigned long sink;

__attribute__((noinline)) void waiting(void) {
    struct pollfd in = {.fd = 0, .events = POLLIN};
    while (poll(&in, 1, 0) == 0)
        for (unsigned long i = 0; i < 1000; i++) sink += i;
}

__attribute__((noinline)) void late_call(void (*chain)(unsigned long, int)) {
    chain(1000, 0);
    sink++;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    printf("ready\n");
    fflush(stdout);
    waiting();
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    late_call((void (*)(unsigned long, int))dlsym(lib, "chain_lib_c"));
    return 0;
}
