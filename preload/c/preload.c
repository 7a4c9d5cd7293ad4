/*
 * libcargo-trace-preload.so: the heap profiler's probe sites, preloaded into a
 * target cargo-trace launches (cargo-trace/src/alloc/preload.rs), and, when
 * CARGO_TRACE_HEAP names cargo-trace's socket, its in-process recorder
 * (record.h: no kernel event at all, see the preload crate's lib.rs).
 *
 * Both modes run the same wrappers and call the same sites from the same
 * instructions: in-process, the sites of allocations and of realloc's entry
 * jump to the recorder, which walks from the site's caller exactly as the BPF
 * programs do from the site's probe, so the stacks are the same. Frees and
 * unmaps are recorded before the block goes back (no walk); the free log is
 * the BPF mode's only.
 *
 * Probing libc's allocator costs three kernel events per malloc/free pair: a
 * breakpoint at malloc's entry, its return probe, a breakpoint at free's
 * entry. Preloaded, this library's malloc and the rest call libc's and then
 * call a site: a function whose first instruction is a nop, where the
 * uprobe's breakpoint is emulated (never single-stepped). A pair costs two
 * such events, and no return probe. The BPF programs (alloc.bpf.h,
 * on_preload_*) walk the stack from the site's caller, the wrapper below,
 * and count the block as the probes of libc's functions do.
 *
 * Not a 5-byte nop: Linux 6.18 optimizes a uprobe on one into a call to a
 * trampoline page of the process, which a child it forks does not inherit,
 * though it inherits the call: the child crashes at its first allocation.
 *
 * Frees of small blocks, where cargo-trace counts every call
 * (CARGO_TRACE_FREE_LOG=1 in the environment), are not a site each: each
 * thread logs them, address and time, in its struct ct_free_log
 * (cargo_trace.h), before the block goes back to the allocator, and the log
 * goes to the kernel with the thread's next allocation, or when it is full,
 * or when the thread exits or execs. A malloc/free pair is then one
 * breakpoint. A block the allocator hands
 * out is never one whose free is still in this thread's log: the log is
 * told first. Another thread may be handed it, which the kernel sees (the
 * address is live still) and sorts out when the free is told.
 *
 * The sites take what the programs read in their argument registers:
 *   cargo_trace_allocated(address, size, mapped, log, n): a block allocated
 *     (NULL: the allocation failed); mapped: by mmap, which an allocator the
 *     program probes may be calling (then it is part of that call); log and
 *     n: the thread's free log and its entries, told first.
 *   cargo_trace_freeing(address): a block about to be freed, before the
 *     allocator may hand the address out again to another thread (frees not
 *     logged).
 *   cargo_trace_freed(log, n): a thread's free log, full.
 *   cargo_trace_log(log): where the thread's log is, at its first free.
 *   cargo_trace_unmapping(address): a mapping about to be unmapped.
 *   cargo_trace_resizing(old, size, log, n) before realloc,
 *     cargo_trace_resized(new) after: the old block leaves at the first, and
 *     comes back if the realloc failed.
 * Without cargo-trace attached the sites are a call to a nop each.
 *
 * Only calls made through the dynamic linker's symbol lookup come here:
 * libc's calls to its own malloc from inside realloc, or to mmap from inside
 * malloc, do not, which is what the profile wants (they are part of the call
 * the program made).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>
#include <linux/types.h>

#include "cargo_trace.h"

#define EXPORT __attribute__((visibility("default")))
/* A site: its own function, never inlined or cloned, its arguments in their
 * registers, a one-byte nop first (the build has no endbr64 to precede it). */
#define SITE EXPORT __attribute__((noipa, used))
#define NOP __asm__ volatile("nop" ::: "memory")

/* cargo_trace_allocated, cargo_trace_resizing and cargo_trace_resized are
 * written in assembly (record.h): a nop, and when recording in-process, the
 * jump to the recorder with the registers a probe of the site would see, so
 * that both modes walk from the very same call instruction of the wrapper. */
EXPORT void cargo_trace_allocated(void *address, size_t size, int mapped, struct ct_free_log *log,
				  unsigned n);
EXPORT void cargo_trace_resizing(void *old, size_t size, struct ct_free_log *log, unsigned n);
EXPORT void cargo_trace_resized(void *address);

SITE void cargo_trace_freed(struct ct_free_log *log, unsigned n)
{
	NOP;
	(void)log, (void)n;
}

SITE void cargo_trace_log(struct ct_free_log *log)
{
	NOP;
	(void)log;
}

SITE void cargo_trace_freeing(void *address)
{
	NOP;
	(void)address;
}

SITE void cargo_trace_unmapping(void *address)
{
	NOP;
	(void)address;
}


/* The functions wrapped, as the next object in the lookup order defines
 * them (libc's, or an allocator preloaded after this library). */
static struct {
	void *(*malloc)(size_t);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	void *(*reallocarray)(void *, size_t, size_t);
	void (*free)(void *);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*memalign)(size_t, size_t);
	void *(*valloc)(size_t);
	void *(*pvalloc)(size_t);
	void *(*mmap)(void *, size_t, int, int, int, off_t);
	int (*munmap)(void *, size_t);
	size_t (*malloc_usable_size)(void *);
} next;

/*
 * While dlsym looks the functions up, the allocations it makes (if any) come
 * from here: a block of this arena is never freed, and a free of one is
 * ignored. Bumped atomically, should two threads resolve at once.
 */
static _Alignas(64) unsigned char bootstrap[16384];
static size_t bootstrap_used;
static __thread int resolving;

static int in_bootstrap(const void *p)
{
	return (const unsigned char *)p >= bootstrap &&
	       (const unsigned char *)p < bootstrap + sizeof(bootstrap);
}

static void *bootstrap_alloc(size_t size)
{
	size_t rounded = (size + 15) & ~(size_t)15;
	size_t at = __atomic_fetch_add(&bootstrap_used, rounded, __ATOMIC_RELAXED);

	if (rounded < size || at + rounded > sizeof(bootstrap))
		return NULL;
	return bootstrap + at;
}

#include "record.h"

#define RESOLVE(name) (next.name = (__typeof__(next.name))dlsym(RTLD_NEXT, #name))

static void resolve(void)
{
	resolving = 1;
	RESOLVE(malloc);
	RESOLVE(calloc);
	RESOLVE(realloc);
	RESOLVE(reallocarray);
	RESOLVE(free);
	RESOLVE(posix_memalign);
	RESOLVE(aligned_alloc);
	RESOLVE(memalign);
	RESOLVE(valloc);
	RESOLVE(pvalloc);
	RESOLVE(mmap);
	RESOLVE(munmap);
	RESOLVE(malloc_usable_size);
	resolving = 0;
	static int decided;
	if (!decided) {
		decided = 1;
		record_init();
	}
}

/*
 * The thread's free log. Static TLS (the library is loaded with the
 * program): an entry costs two stores and the clock's vDSO read. The
 * kernel reads it where it is; `logging` is set once, before main.
 */
static __thread struct ct_free_log free_log __attribute__((tls_model("initial-exec")));
static int logging;

/*
 * Blocks this large are told at once. Until a logged free is told, the
 * kernel counts its block live: a thread that frees and then waits without
 * allocating keeps its last frees in its log. Small blocks only, so what is
 * counted live that way is under CT_FREE_LOG * LOGGED_BELOW bytes a thread,
 * and the live bytes (and their peak) stay within that of the truth.
 */
#define LOGGED_BELOW 16384

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000 + (uint64_t)ts.tv_nsec;
}

/* Tells the thread's log when it ends (pthread_exit, or its function
 * returned): older kernels release a thread's memory before the exit
 * tracepoint where the kernel takes the log otherwise. */
static pthread_key_t exit_key;

static void tell_at_exit(void *value)
{
	struct ct_free_log *log = value;
	unsigned n = log->n;

	if (n) {
		cargo_trace_freed(log, n);
		log->n = 0;
	}
}

static inline __attribute__((always_inline)) void log_free(void *p)
{
	struct ct_free_log *log = &free_log;

	if (__builtin_expect(!log->registered, 0)) {
		log->registered = 1;
		cargo_trace_log(log);
		pthread_setspecific(exit_key, log);
	}
	unsigned n = log->n;
	log->entries[n].address = (uintptr_t)p;
	log->entries[n].ns = now_ns();
	/* the entry before the count: a thread killed between the two leaves
	 * it out, never half written */
	__atomic_store_n(&log->n, n + 1, __ATOMIC_RELEASE);
	if (n + 1 == CT_FREE_LOG) {
		cargo_trace_freed(log, n + 1);
		log->n = 0;
	}
}

/* The site of an allocation, with the frees logged before it. A macro: the
 * stack's first frame is the wrapper, which names the function it wraps,
 * with no inlined frame of this file's under it. */
#define ALLOCATED(p, size, mapped)                                          \
	do {                                                                \
		unsigned logged_ = free_log.n;                              \
		cargo_trace_allocated(p, size, mapped, &free_log, logged_); \
		if (logged_)                                                \
			free_log.n = 0;                                     \
	} while (0)

/* A child forked by this thread starts with a copy of its log: the parent
 * tells those frees, and the kernel knows nothing of the copy. */
static void forked_child(void)
{
	free_log.n = 0;
	free_log.registered = 0;
}

__attribute__((constructor)) static void preload_init(void)
{
	if (!next.malloc)
		resolve();
	record_image_started();
	const char *value = getenv("CARGO_TRACE_FREE_LOG");
	logging = value && value[0] == '1' && pthread_key_create(&exit_key, tell_at_exit) == 0;
	if (logging)
		pthread_atfork(NULL, NULL, forked_child);
}

/* The last frees of the thread that exits the process (the kernel takes
 * them at its exit too, where it can read them: it finds the log empty). */
__attribute__((destructor)) static void preload_fini(void)
{
	tell_at_exit(&free_log);
}

/* Whether the wrapped functions are there; allocations made before they are
 * (by dlsym itself) take the bootstrap arena. */
static int ready(void)
{
	if (__builtin_expect(next.free != NULL, 1))
		return 1;
	if (!resolving)
		resolve();
	return next.free != NULL;
}

/* A wrapped allocator's call: when recording in-process, what the allocator
 * calls of the wrappers meanwhile (an allocator's own mmaps) is part of the
 * call (in_call is only ever set then). A macro: the wrapper itself calls. */
#define CALLING(call)                          \
	({                                     \
		int recording_ = recording_mode; \
		in_call += recording_;          \
		__typeof__(call) r_ = (call);  \
		in_call -= recording_;          \
		r_;                            \
	})

/* A named allocator's session (CTP_OPT_WRAPPERS_PASS): straight to the next
 * definition with a tail jump, recording nothing, as if the wrapper were not there: a
 * hooked function it reaches (libjemalloc.so's malloc) counts the call, and its
 * caller is the program's frame, as on the BPF path, which runs without the library. */
#define PASS_THROUGH(call)                             \
	do {                                           \
		if (__builtin_expect(wrappers_pass, 0)) \
			return call;                   \
	} while (0)

/* Inside a wrapped allocator's call: straight through (see CALLING). */
#define INSIDE_CALL(call)             \
	do {                          \
		if (in_call) {        \
			inside_call(); \
			return call;  \
		}                     \
	} while (0)

EXPORT void *malloc(size_t size)
{
	if (!ready())
		return bootstrap_alloc(size);
	PASS_THROUGH(next.malloc(size));
	INSIDE_CALL(next.malloc(size));
	void *p = CALLING(next.malloc(size));
	ALLOCATED(p, size, 0);
	return p;
}

EXPORT void *calloc(size_t n, size_t size)
{
	if (!ready()) {
		size_t bytes;
		if (__builtin_mul_overflow(n, size, &bytes))
			return NULL;
		return bootstrap_alloc(bytes); /* static storage: zeroed */
	}
	PASS_THROUGH(next.calloc(n, size));
	INSIDE_CALL(next.calloc(n, size));
	void *p = CALLING(next.calloc(n, size));
	ALLOCATED(p, n * size, 0);
	return p;
}

EXPORT void free(void *p)
{
	if (!p || in_bootstrap(p))
		return;
	if (__builtin_expect(wrappers_pass, 0)) {
		next.free(p); /* a tail jump: see PASS_THROUGH */
		return;
	}
	if (recording_mode) {
		if (!in_call)
			RECORD(CTP_EV_FREE, p, 0);
		else
			inside_call();
		next.free(p);
		return;
	}
	if (logging && next.malloc_usable_size && next.malloc_usable_size(p) < LOGGED_BELOW)
		log_free(p);
	else
		cargo_trace_freeing(p);
	if (ready())
		next.free(p);
}

/* Not inlined: the stacks of realloc and reallocarray start here, as they
 * always have on the BPF path. */
static __attribute__((noinline)) void *resize(void *old, size_t size)
{
	if (in_bootstrap(old)) {
		/* moved out of the arena: a new block, its size unknown here, so
		 * copied up to the arena's end at most */
		void *p = malloc(size);
		if (p) {
			size_t left = (size_t)(bootstrap + sizeof(bootstrap) - (unsigned char *)old);
			__builtin_memcpy(p, old, size < left ? size : left);
		}
		return p;
	}
	INSIDE_CALL(next.realloc(old, size));
	unsigned logged = free_log.n;
	cargo_trace_resizing(old, size, &free_log, logged);
	if (logged)
		free_log.n = 0;
	void *p = CALLING(next.realloc(old, size));
	cargo_trace_resized(p);
	return p;
}

EXPORT void *realloc(void *old, size_t size)
{
	if (!ready())
		return bootstrap_alloc(size);
	if (!in_bootstrap(old))
		PASS_THROUGH(next.realloc(old, size));
	return resize(old, size);
}

EXPORT void *reallocarray(void *old, size_t n, size_t size)
{
	size_t bytes;

	if (__builtin_mul_overflow(n, size, &bytes)) {
		errno = ENOMEM;
		return NULL;
	}
	if (!ready())
		return bootstrap_alloc(bytes);
	/* libc's, which reaches realloc through the lookup, as without the library */
	if (!in_bootstrap(old) && next.reallocarray)
		PASS_THROUGH(next.reallocarray(old, n, size));
	return resize(old, bytes);
}

EXPORT int posix_memalign(void **out, size_t alignment, size_t size)
{
	if (!ready())
		return ENOMEM;
	PASS_THROUGH(next.posix_memalign(out, alignment, size));
	INSIDE_CALL(next.posix_memalign(out, alignment, size));
	int error = CALLING(next.posix_memalign(out, alignment, size));
	ALLOCATED(error ? NULL : *out, size, 0);
	return error;
}

EXPORT void *aligned_alloc(size_t alignment, size_t size)
{
	if (!ready())
		return NULL;
	PASS_THROUGH(next.aligned_alloc(alignment, size));
	INSIDE_CALL(next.aligned_alloc(alignment, size));
	void *p = CALLING(next.aligned_alloc(alignment, size));
	ALLOCATED(p, size, 0);
	return p;
}

EXPORT void *memalign(size_t alignment, size_t size)
{
	if (!ready())
		return NULL;
	PASS_THROUGH(next.memalign(alignment, size));
	INSIDE_CALL(next.memalign(alignment, size));
	void *p = CALLING(next.memalign(alignment, size));
	ALLOCATED(p, size, 0);
	return p;
}

EXPORT void *valloc(size_t size)
{
	if (!ready())
		return NULL;
	PASS_THROUGH(next.valloc(size));
	INSIDE_CALL(next.valloc(size));
	void *p = CALLING(next.valloc(size));
	ALLOCATED(p, size, 0);
	return p;
}

EXPORT void *pvalloc(size_t size)
{
	if (!ready())
		return NULL;
	PASS_THROUGH(next.pvalloc(size));
	INSIDE_CALL(next.pvalloc(size));
	void *p = CALLING(next.pvalloc(size));
	ALLOCATED(p, size, 0);
	return p;
}

EXPORT void *mmap(void *address, size_t length, int prot, int flags, int fd, off_t offset)
{
	if (!ready()) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	PASS_THROUGH(next.mmap(address, length, prot, flags, fd, offset));
	if (flags & MAP_ANONYMOUS)
		INSIDE_CALL(next.mmap(address, length, prot, flags, fd, offset));
	void *p = CALLING(next.mmap(address, length, prot, flags, fd, offset));
	if (flags & MAP_ANONYMOUS)
		ALLOCATED(p == MAP_FAILED ? NULL : p, length, 1);
	return p;
}

EXPORT void *mmap64(void *address, size_t length, int prot, int flags, int fd, off_t offset)
	__attribute__((alias("mmap")));

EXPORT int munmap(void *address, size_t length)
{
	if (!ready()) {
		errno = ENOMEM;
		return -1;
	}
	PASS_THROUGH(next.munmap(address, length));
	if (recording_mode) {
		if (!in_call)
			RECORD(CTP_EV_MUNMAP, address, length);
		else
			inside_call();
		return next.munmap(address, length);
	}
	cargo_trace_unmapping(address);
	return next.munmap(address, length);
}
