// A target for the sampler's tests, built with -O0 -fno-omit-frame-pointer so every
// function keeps its frame. `spin user` only computes; `spin mixed` also reads /dev/zero,
// which spends its time in the kernel (clearing pages) under frostdb_spin_kernel.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void frostdb_spin_user(unsigned long n)
{
	for (unsigned long i = 0; i < n; i++)
		sink += i * 7;
}

__attribute__((noinline)) void frostdb_spin_kernel(int fd, char *buf)
{
	for (int i = 0; i < 16; i++)
		if (read(fd, buf, 1 << 20) < 0)
			exit(2);
}

__attribute__((noinline)) void frostdb_spin_outer(int mixed, int fd, char *buf)
{
	for (;;) {
		frostdb_spin_user(2000000);
		if (mixed)
			frostdb_spin_kernel(fd, buf);
	}
}

int main(int argc, char **argv)
{
	int mixed = argc > 1 && strcmp(argv[1], "mixed") == 0;
	int fd = open("/dev/zero", O_RDONLY);
	char *buf = malloc(1 << 20);
	if (fd < 0 || !buf)
		return 1;
	printf("ready\n");
	fflush(stdout);
	frostdb_spin_outer(mixed, fd, buf);
	return 0;
}
