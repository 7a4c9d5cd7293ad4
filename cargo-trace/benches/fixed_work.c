/*
 * A fixed amount of CPU work that times itself, for the profile:hz:99 part of
 * the overhead benchmark. The work does not depend on time, so a run that is
 * slowed down by sampling takes longer instead of doing less.
 *
 *   main -> work -> block (STEPS / BLOCK_STEPS times: xorshift64 steps)
 *
 * Usage: fixed_work STEPS. No system call inside the timed part. Prints on stdout:
 *   wall_ns <CLOCK_MONOTONIC ns> cpu_ns <CLOCK_THREAD_CPUTIME_ID ns> state <x>
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NOIPA __attribute__((noipa))
#define BLOCK_STEPS 10000UL

NOIPA static unsigned long block(unsigned long x)
{
	for (unsigned long i = 0; i < BLOCK_STEPS; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
	}
	return x;
}

NOIPA static unsigned long work(unsigned long steps)
{
	unsigned long x = 0x9e3779b97f4a7c15UL;
	for (unsigned long done = 0; done < steps; done += BLOCK_STEPS)
		x = block(x);
	return x;
}

static long long ns(clockid_t clock)
{
	struct timespec time;
	clock_gettime(clock, &time);
	return time.tv_sec * 1000000000LL + time.tv_nsec;
}

int main(int argc, char **argv)
{
	char *end;
	unsigned long steps = argc > 1 ? strtoul(argv[1], &end, 10) : 0;
	if (argc != 2 || *argv[1] == 0 || *end != 0) {
		fprintf(stderr, "usage: fixed_work STEPS\n");
		return 2;
	}
	long long wall = ns(CLOCK_MONOTONIC), cpu = ns(CLOCK_THREAD_CPUTIME_ID);
	unsigned long state = work(steps);
	cpu = ns(CLOCK_THREAD_CPUTIME_ID) - cpu;
	wall = ns(CLOCK_MONOTONIC) - wall;
	printf("wall_ns %lld cpu_ns %lld state %lx\n", wall, cpu, state);
	return 0;
}
