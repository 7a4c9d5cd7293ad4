/*
 * Pipe ping-pong for the overhead benchmark: two processes pass one byte back
 * and forth over two pipes ROUNDS times (argument), so each round is two
 * context switches or more, each a stay off the CPU that `cargo trace offcpu`
 * weighs. Prints `rounds N loop_ns T`, the loop timed with CLOCK_MONOTONIC.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Sends a byte on out and waits for the answer on in, rounds times. */
static __attribute__((noinline)) void ping(int out, int in, long rounds)
{
	char byte = 'x';

	for (long i = 0; i < rounds; i++)
		if (write(out, &byte, 1) != 1 || read(in, &byte, 1) != 1)
			exit(1);
}

/* Answers every byte read on in with a byte on out, until in closes. */
static __attribute__((noinline)) void pong(int in, int out)
{
	char byte;

	while (read(in, &byte, 1) == 1)
		if (write(out, &byte, 1) != 1)
			exit(1);
}

int main(int argc, char **argv)
{
	long rounds = argc > 1 ? atol(argv[1]) : 100000;
	int to_pong[2], to_ping[2];

	if (pipe(to_pong) || pipe(to_ping))
		return 1;
	pid_t child = fork();
	if (child < 0)
		return 1;
	if (child == 0) {
		close(to_pong[1]);
		close(to_ping[0]);
		pong(to_pong[0], to_ping[1]);
		return 0;
	}
	close(to_pong[0]);
	close(to_ping[1]);
	long long start = now_ns();
	ping(to_pong[1], to_ping[0], rounds);
	long long loop_ns = now_ns() - start;
	close(to_pong[1]);
	waitpid(child, NULL, 0);
	printf("rounds %ld loop_ns %lld\n", rounds, loop_ns);
	return 0;
}
