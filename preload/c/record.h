/*
 * In-process recording, included by preload.c once `next` (the wrapped
 * functions) is declared. Enabled when CARGO_TRACE_HEAP names cargo-trace's
 * socket; the library then calls no site and the kernel sees nothing.
 *
 * Per event, on the thread that allocates, with no lock and no cache line
 * shared with another producer:
 *   the wrapper calls ctp_capture (an assembly stub: the wrapper's return
 *   address, rsp and rbp, as the BPF path takes them at a site's entry with
 *   the site's frame popped) -> ctp_record -> the walk memo (memo_find) or
 *   the walk (walk.h) and the stack interned in the region (intern) -> one
 *   event in the thread's ring (publish).
 * Frees publish their event before the block goes back to the allocator and
 * allocations after the allocator returned and before the pointer is handed
 * out, so the consumer can order events of different threads exactly
 * (preload/src/recorder.rs).
 *
 * Rare paths take locks: the connection (once per process image), a new
 * thread taking a ring, a new stack stored, a mapping asked of cargo-trace.
 * Every one of them checks that cargo-trace is still there (its end of the
 * socket); when it is gone, the library passes every call through.
 *
 * Memory besides the region, all from mmap, bounded: one struct thread per
 * ring (CTP_RINGS of them, see THREAD_BYTES), the mapping sets cargo-trace
 * sent (at most MAX_MAPSETS), the tables memfd's mapping (read-only, shared).
 * region->private_bytes says how much of it is in use.
 */
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "shared.h"

struct walk_env;
static const struct ctp_mapping *walk_mapping(struct walk_env *env, uint64_t addr);
static int walk_read(struct walk_env *env, uint64_t addr, uint64_t *value);
static const unsigned char *walk_tables(struct walk_env *env);
static int walk_cached(struct walk_env *env, uint64_t lookup, struct ctp_rule *rule,
		       uint32_t *object, uint64_t *bias);
static void walk_cache(struct walk_env *env, uint64_t lookup, const struct ctp_rule *rule,
		       uint32_t object, uint64_t bias);

#include "walk.h"

enum record_limits {
	NEST_LEVELS = 2,	 /* a signal handler inside the recorder, and no deeper */
	PENDING = 64,		 /* events of a nested level waiting for the outer one */
	MEMO_SETS = 32,		 /* per thread: sets of the walk memo ... */
	MEMO_WAYS = 2,		 /* ... of this many walks each */
	MEMO_WORDS = 192,	 /* words a remembered walk read, at most */
	RULE_CACHE = 2048,	 /* per thread: rules found, by address (direct-mapped) */
	MAX_MAPSETS = 256,	 /* mapping sets received (each a lookup); more: NoMapping */
	NEGATIVES = 64,		 /* pcs cargo-trace knew no mapping for */
	STACK_PROBES = 64,	 /* slots tried for a stack */
	WAIT_NS = 20000,	 /* a full ring's wait between looks */
	RING_TRIES = 5000,	 /* looks for a free ring, WAIT_NS * 10 apart: 1 s */
};

#define TABLES_RESERVE (1ULL << 36) /* the tables memfd's mapping: address space only */

/* What a wrapper hands the recorder, and where the walk starts (ctp_capture). */
struct ctp_call {
	uint64_t rip;
	uint64_t rsp;
	uint64_t rbp;
	uint64_t address;
	uint64_t size;
	uint32_t kind; /* enum ctp_event_kind */
	uint32_t flags;
};

/* A walk remembered: its start, and every word it read (offset above rsp,
 * value). A walk from the same start that finds the same words would take
 * the same steps and give the same stack (memo.bpf.h says why). */
struct memo_entry {
	uint64_t rip;
	uint64_t rsp;
	uint64_t rbp;
	uint32_t generation; /* of the mapping set walked; 0: empty */
	uint32_t stack;
	uint32_t nwords;
	uint32_t uses_rbp;
	uint32_t offset[MEMO_WORDS];
	uint64_t value[MEMO_WORDS];
};

/* A rule found for (lookup address, mapping set): a set, once sent, never
 * changes, nor do tables, so an entry never goes stale. */
struct rule_cache_entry {
	uint64_t lookup;
	uint32_t generation; /* 0: empty */
	uint32_t object;
	uint64_t bias;
	struct ctp_rule rule;
};

struct memo_set {
	uint32_t next;
	struct memo_entry ways[MEMO_WAYS];
};

/* The mappings cargo-trace sent last, and the pcs it knew no mapping for. */
struct mapset {
	uint32_t n;
	uint32_t generation;
	struct ctp_mapping m[];
};

/* A thread's recorder state: one per ring, reused with it. */
struct thread {
	struct ctp_ring *ring;
	uint32_t index;
	uint32_t level; /* recorder calls in progress on the thread */
	uint64_t head;	/* = ring->head, the producer's copy */
	uint64_t tail;	/* ring->tail as last read */
	uint64_t stack_lo, stack_hi; /* the thread's stack, read directly */
	uint64_t random;
	uint32_t npending;
	uint32_t publishing; /* inside publish: a nested level must not publish */
	struct ctp_event pending[PENDING];
	struct ctp_walk scratch[NEST_LEVELS];
	struct memo_set memo[MEMO_SETS];
	struct rule_cache_entry rules[RULE_CACHE];
};

#define THREAD_BYTES ((sizeof(struct thread) + 4095) & ~4095UL)

/* This process is a forked child that has not exec'd (its connection is not an
 * image's). */
static int forked_image;

/* The process's connection and region (reset in a forked child). */
static struct {
	int state; /* enum conn_state */
	int lock;
	int fd;
	uint32_t pid;
	struct ctp_region *region;
	struct ctp_ring *rings;
	struct ctp_stack_slot *slots;
	uint64_t *words;
	const unsigned char *tables;
	struct mapset *maps;
	uint32_t mapsets;
	int lookup_lock;
	uint32_t mappings_epoch; /* region->mappings_epoch last acted on */
	uint64_t negatives[NEGATIVES];
	uint32_t negatives_generation;
	uint32_t nnegatives;
	struct ctp_options options;
	struct thread *threads[CTP_RINGS];
} conn;

enum conn_state {
	CONN_NONE = 0,
	CONN_UP = 1,
	CONN_FAILED = 2, /* no cargo-trace, or it went away: pass through */
};

/* Whether the library records in-process: set at its first call when
 * CARGO_TRACE_HEAP is, cleared for good when cargo-trace goes away (detach).
 * Read by the sites' assembly, hence not static. */
__attribute__((visibility("hidden"))) int recording_mode;
/* CTP_OPT_WRAPPERS_PASS, as the connection's options said: a named allocator's
 * session, where the wrappers pass every call through (preload.c) and only its
 * hooked functions record. Read by every wrapper, hence on its own. */
static int wrappers_pass;
/* CARGO_TRACE_HEAP_NO_STACKS=1: events without stacks, for the benchmark's account of
 * where a pair's time goes (the consumer counts no allocation without its stack). */
static int no_stacks;

static __thread struct thread *self __attribute__((tls_model("initial-exec")));
/* The library's own calls into libc that may allocate: never counted. */
static __thread int internal __attribute__((tls_model("initial-exec")));
/* A wrapped allocator's call in progress: what it calls (mmap) is part of it. */
static __thread int in_call __attribute__((tls_model("initial-exec")));

static pthread_key_t thread_key;


static void spin_lock(int *lock)
{
	while (__atomic_exchange_n(lock, 1, __ATOMIC_ACQUIRE))
		while (__atomic_load_n(lock, __ATOMIC_RELAXED))
			__builtin_ia32_pause();
}

static int try_lock(int *lock)
{
	return !__atomic_exchange_n(lock, 1, __ATOMIC_ACQUIRE);
}

static void spin_unlock(int *lock)
{
	__atomic_store_n(lock, 0, __ATOMIC_RELEASE);
}

static uint64_t monotonic_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000 + (uint64_t)ts.tv_nsec;
}

/* An event's time: the TSC (~8 ns, clock_gettime ~18 ns: the largest cost of a pair
 * after the allocator itself), which the consumer turns into CLOCK_MONOTONIC ns
 * (recorder.rs, Clock). The kernel's clocksource here is this TSC, constant and
 * synchronized across CPUs. */
static inline uint64_t now_ticks(void)
{
	return __builtin_ia32_rdtsc();
}

static void *map_private(size_t bytes)
{
	void *p = next.mmap ? next.mmap(NULL, bytes, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
			    : MAP_FAILED;
	if (p == MAP_FAILED)
		return NULL;
	if (conn.region)
		__atomic_fetch_add(&conn.region->private_bytes, bytes, __ATOMIC_RELAXED);
	return p;
}

/* cargo-trace went away (or never answered): every call passes through from
 * now on. */
static void detach(void)
{
	if (conn.region)
		__atomic_store_n(&conn.region->detached, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&conn.state, CONN_FAILED, __ATOMIC_RELEASE);
	__atomic_store_n(&recording_mode, 0, __ATOMIC_RELAXED);
}

/* Whether cargo-trace's end of the socket is still open. */
static int consumer_alive(void)
{
	struct pollfd p = { .fd = conn.fd, .events = POLLIN };

	if (poll(&p, 1, 0) < 0)
		return 1;
	if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
		return 0;
	if (p.revents & POLLIN) {
		char byte;
		/* nothing is ever sent unasked: readable means closed */
		return recv(conn.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
	}
	return 1;
}

/* Receives a mappings message (and the tables' fd with the first) into a new
 * mapping set; 0 on success. */
static int receive_mappings(int *tables_fd)
{
	size_t most = sizeof(struct ctp_msg_mappings) + CTP_MAX_MAPPINGS * sizeof(struct ctp_mapping);
	size_t buf_bytes = (most + 4095) & ~4095UL;
	if (conn.mapsets >= MAX_MAPSETS)
		return -1;
	/* not counted in private_bytes: unmapped below */
	unsigned char *buf = next.mmap(NULL, buf_bytes, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return -1;
	char control[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = buf, .iov_len = most };
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control,
		.msg_controllen = sizeof(control),
	};
	ssize_t got;
	do
		got = recvmsg(conn.fd, &msg, MSG_CMSG_CLOEXEC);
	while (got < 0 && errno == EINTR);
	const struct ctp_msg_mappings *head = (const void *)buf;
	int ok = got >= (ssize_t)sizeof(*head) && head->kind == CTP_MSG_MAPPINGS &&
		 head->nmappings <= CTP_MAX_MAPPINGS &&
		 (size_t)got == sizeof(*head) + head->nmappings * sizeof(struct ctp_mapping);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int fd;
			memcpy(&fd, CMSG_DATA(c), sizeof(fd));
			if (tables_fd && *tables_fd < 0)
				*tables_fd = fd;
			else
				close(fd);
		}
	}
	struct mapset *set = NULL;
	if (ok) {
		size_t set_bytes = (sizeof(struct mapset) +
				    head->nmappings * sizeof(struct ctp_mapping) + 4095) & ~4095UL;
		set = map_private(set_bytes);
		ok = set != NULL;
	}
	if (ok) {
		conn.options = head->options;
		wrappers_pass = (head->options.flags & CTP_OPT_WRAPPERS_PASS) != 0;
		set->n = head->nmappings;
		set->generation = conn.mapsets + 1;
		memcpy(set->m, buf + sizeof(*head), set->n * sizeof(struct ctp_mapping));
		conn.mapsets++;
		__atomic_store_n(&conn.maps, set, __ATOMIC_RELEASE);
	}
	next.munmap(buf, buf_bytes);
	return ok ? 0 : -1;
}

static uint64_t region_size(void)
{
	return CTP_REGION_HEADER + (uint64_t)CTP_RINGS * sizeof(struct ctp_ring) +
	       (uint64_t)CTP_STACK_SLOTS * sizeof(struct ctp_stack_slot) +
	       (uint64_t)CTP_STACK_WORDS * sizeof(uint64_t);
}

static void place_hooks(void);
/* The most memory the hooks' areas take (hooks.h: MAX_AREAS of HOOK_AREA). */
#define HOOK_AREAS_BYTES (64ULL * 64 * 1024)

/* Connects to cargo-trace, makes the region and says hello; 0 on success. */
static int connect_now(void)
{
	const char *path = getenv("CARGO_TRACE_HEAP");
	struct sockaddr_un addr = { .sun_family = AF_UNIX };

	if (!path || strlen(path) >= sizeof(addr.sun_path))
		return -1;
	strcpy(addr.sun_path, path);
	conn.pid = (uint32_t)getpid();
	conn.fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (conn.fd < 0)
		return -1;
	if (connect(conn.fd, (struct sockaddr *)&addr, sizeof(addr)))
		return -1;
	uint64_t bytes = region_size();
	int region_fd = memfd_create("cargo-trace-heap", MFD_CLOEXEC);
	if (region_fd < 0 || ftruncate(region_fd, (off_t)bytes))
		return -1;
	void *region = next.mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, region_fd, 0);
	if (region == MAP_FAILED) {
		close(region_fd);
		return -1;
	}
	struct ctp_region *r = region;
	r->magic = CTP_MAGIC;
	r->version = CTP_VERSION;
	r->pid = conn.pid;
	r->nrings = CTP_RINGS;
	r->region_bytes = bytes;
	r->rings_offset = CTP_REGION_HEADER;
	r->ring_bytes = sizeof(struct ctp_ring);
	r->slots_offset = r->rings_offset + (uint64_t)CTP_RINGS * sizeof(struct ctp_ring);
	r->nslots = CTP_STACK_SLOTS;
	r->words_offset = r->slots_offset + (uint64_t)CTP_STACK_SLOTS * sizeof(struct ctp_stack_slot);
	r->nwords = CTP_STACK_WORDS;
	/* the thread states, the mapping sets kept, one message buffer at a time, the
	 * hooks' areas (hooks.h) */
	r->private_bound = (uint64_t)CTP_RINGS * THREAD_BYTES + HOOK_AREAS_BYTES +
			   (uint64_t)(MAX_MAPSETS + 1) *
				   ((sizeof(struct mapset) +
				     CTP_MAX_MAPPINGS * sizeof(struct ctp_mapping) + 4095) &
				    ~4095UL);
	conn.region = r;
	conn.rings = (struct ctp_ring *)((unsigned char *)r + r->rings_offset);
	conn.slots = (struct ctp_stack_slot *)((unsigned char *)r + r->slots_offset);
	conn.words = (uint64_t *)((unsigned char *)r + r->words_offset);

	struct ctp_msg_hello hello = {
		.kind = CTP_MSG_HELLO,
		.magic = CTP_MAGIC,
		.version = CTP_VERSION,
		.pid = conn.pid,
		.region_bytes = bytes,
		.flags = forked_image ? CTP_HELLO_FORKED : 0,
	};
	char control[CMSG_SPACE(sizeof(int))];
	memset(control, 0, sizeof(control));
	struct iovec iov = { .iov_base = &hello, .iov_len = sizeof(hello) };
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control,
		.msg_controllen = sizeof(control),
	};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &region_fd, sizeof(int));
	ssize_t sent = sendmsg(conn.fd, &msg, MSG_NOSIGNAL);
	close(region_fd);
	if (sent != (ssize_t)sizeof(hello))
		return -1;

	int tables_fd = -1;
	if (receive_mappings(&tables_fd) || tables_fd < 0)
		return -1;
	void *tables = next.mmap(NULL, TABLES_RESERVE, PROT_READ, MAP_SHARED | MAP_NORESERVE,
				 tables_fd, 0);
	close(tables_fd);
	if (tables == MAP_FAILED)
		return -1;
	conn.tables = tables;
	/* a forked child has its parent's hooks */
	if (!forked_image)
		place_hooks();
	return 0;
}

/* Connects once per process image (and once per forked child); 0 when up. */
static int ensure_connected(void)
{
	int state = __atomic_load_n(&conn.state, __ATOMIC_ACQUIRE);

	if (state == CONN_UP)
		return 0;
	if (state == CONN_FAILED)
		return -1;
	spin_lock(&conn.lock);
	if (conn.state == CONN_NONE) {
		internal++;
		int ok = connect_now() == 0;
		internal--;
		if (ok)
			__atomic_store_n(&conn.state, CONN_UP, __ATOMIC_RELEASE);
		else
			detach();
	}
	spin_unlock(&conn.lock);
	return conn.state == CONN_UP ? 0 : -1;
}

/* Waits until t's ring has room (never drops) unless the consumer is gone;
 * 0 when there is room. A nested level may publish meanwhile. */
static int wait_for_room(struct thread *t)
{
	struct ctp_ring *r = t->ring;

	t->tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
	if (t->head - t->tail >= CTP_RING_EVENTS)
		r->waits++;
	for (unsigned spins = 0; t->head - t->tail >= CTP_RING_EVENTS; spins++) {
		/* the consumer drains on another core: yield first, sleep later */
		if (spins < 64) {
			sched_yield();
		} else {
			if (!consumer_alive()) {
				detach();
				return -1;
			}
			struct timespec pause = { 0, WAIT_NS };
			nanosleep(&pause, NULL);
		}
		t->tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
	}
	return 0;
}

/* Publishes e in t's ring. Only the few instructions that take a slot and
 * publish it keep a nested level (a signal handler) from publishing too. */
static void publish(struct thread *t, const struct ctp_event *e)
{
	struct ctp_ring *r = t->ring;

	for (;;) {
		if (__builtin_expect(t->head - t->tail >= CTP_RING_EVENTS, 0) && wait_for_room(t))
			return;
		t->publishing = 1;
		__asm__ volatile("" ::: "memory");
		uint64_t head = t->head;
		if (__builtin_expect(head - t->tail < CTP_RING_EVENTS, 1)) {
			/* the line a few events on, for writing: it was last read by the
			 * consumer's core (or evicted since), a miss the thread would wait on */
			__builtin_prefetch(&r->events[(head + 8) & (CTP_RING_EVENTS - 1)], 1, 3);
			r->events[head & (CTP_RING_EVENTS - 1)] = *e;
			__atomic_store_n(&r->head, head + 1, __ATOMIC_RELEASE);
			t->head = head + 1;
			__asm__ volatile("" ::: "memory");
			t->publishing = 0;
			return;
		}
		/* a nested level took the room while this one waited */
		__asm__ volatile("" ::: "memory");
		t->publishing = 0;
	}
}

/* Publishes the events a nested level left (a signal handler that allocated
 * while this thread was in the recorder). */
static void publish_pending(struct thread *t)
{
	uint32_t n = __atomic_load_n(&t->npending, __ATOMIC_RELAXED);

	while (n) {
		for (uint32_t i = 0; i < n; i++)
			publish(t, &t->pending[i]);
		/* a handler may add one meanwhile: then publish it too */
		uint32_t seen = n;
		if (__atomic_compare_exchange_n(&t->npending, &seen, 0, 0, __ATOMIC_RELAXED,
						__ATOMIC_RELAXED))
			break;
		for (uint32_t i = n; i < seen; i++)
			t->pending[i - n] = t->pending[i];
		__atomic_store_n(&t->npending, seen - n, __ATOMIC_RELAXED);
		n = seen - n;
	}
}

static void thread_ended(void *value)
{
	struct thread *t = value;

	if (!t || !t->ring || self != t)
		return;
	if (conn.state == CONN_UP)
		publish_pending(t);
	__atomic_store_n(&t->ring->state, CTP_RING_RELEASED, __ATOMIC_RELEASE);
	self = NULL;
}

/*
 * The thread's stack, where the walk reads directly: the mapping that holds
 * the stack pointer now. Not pthread_getattr_np: it takes the thread's lock
 * and, for the main thread, reads /proc/self/maps with stdio, which
 * allocates: a malloc made inside it (Rust's runtime asks for the main
 * thread's stack before main) would wait for that lock for good. The kernel
 * is asked instead, with system calls only: PROCMAP_QUERY (Linux 6.11+) for
 * the one mapping, else /proc/self/maps read by hand.
 */
struct ctp_procmap_query {
	uint64_t size;
	uint64_t query_flags;
	uint64_t query_addr;
	uint64_t vma_start;
	uint64_t vma_end;
	uint64_t vma_flags;
	uint64_t vma_page_size;
	uint64_t vma_offset;
	uint64_t inode;
	uint32_t dev_major;
	uint32_t dev_minor;
	uint32_t vma_name_size;
	uint32_t build_id_size;
	uint64_t vma_name_addr;
	uint64_t build_id_addr;
};

/* _IOWR(0x9f, 17, struct procmap_query) */
#define CTP_PROCMAP_QUERY (0xc0000000UL | (sizeof(struct ctp_procmap_query) << 16) | (0x9fUL << 8) | 17)

static uint64_t parse_hex(const char **text, const char *end)
{
	uint64_t value = 0;
	const char *p = *text;

	for (; p < end; p++) {
		char c = *p;
		unsigned digit;
		if (c >= '0' && c <= '9')
			digit = (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			digit = (unsigned)(c - 'a' + 10);
		else
			break;
		value = value << 4 | digit;
	}
	*text = p;
	return value;
}

/* The mapping of /proc/self/maps (fd) holding addr, read a page at a time. */
static int stack_from_maps_text(int fd, uint64_t addr, uint64_t *lo, uint64_t *hi)
{
	char buffer[4096];
	size_t kept = 0;

	for (;;) {
		ssize_t n = syscall(SYS_read, fd, buffer + kept, sizeof(buffer) - kept);
		if (n <= 0)
			return -1;
		size_t len = kept + (size_t)n;
		const char *line = buffer;
		const char *end = buffer + len;
		for (;;) {
			const char *newline = memchr(line, '\n', (size_t)(end - line));
			if (!newline)
				break;
			const char *p = line;
			uint64_t start = parse_hex(&p, newline);
			if (p < newline && *p == '-') {
				p++;
				uint64_t stop = parse_hex(&p, newline);
				if (start <= addr && addr < stop) {
					*lo = start;
					*hi = stop;
					return 0;
				}
			}
			line = newline + 1;
		}
		kept = (size_t)(end - line);
		if (kept == sizeof(buffer))
			return -1; /* a line longer than the buffer: give up */
		memmove(buffer, line, kept);
	}
}

static void find_stack(struct thread *t)
{
	uint64_t here = (uint64_t)(uintptr_t)__builtin_frame_address(0);
	int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);

	t->stack_lo = t->stack_hi = 0;
	if (fd < 0)
		return;
	struct ctp_procmap_query query = {
		.size = sizeof(query),
		.query_addr = here,
	};
	if (syscall(SYS_ioctl, fd, CTP_PROCMAP_QUERY, &query) == 0) {
		t->stack_lo = query.vma_start;
		t->stack_hi = query.vma_end;
	} else {
		uint64_t lo, hi;
		if (stack_from_maps_text(fd, here, &lo, &hi) == 0) {
			t->stack_lo = lo;
			t->stack_hi = hi;
		}
	}
	syscall(SYS_close, fd);
}

/* Takes a free ring for the calling thread, with its state; NULL if none is free. */
static struct thread *take_ring(void)
{
	struct thread *t = NULL;

	for (int i = 0; i < CTP_RINGS && !t; i++) {
		struct ctp_ring *r = &conn.rings[i];
		uint32_t free_state = CTP_RING_FREE;
		if (!__atomic_compare_exchange_n(&r->state, &free_state, CTP_RING_OWNED, 0,
						 __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			continue;
		t = conn.threads[i];
		if (!t) {
			t = map_private(THREAD_BYTES);
			if (!t) {
				__atomic_store_n(&r->state, CTP_RING_FREE, __ATOMIC_RELEASE);
				break;
			}
			conn.threads[i] = t;
		}
		memset(t, 0, offsetof(struct thread, scratch));
		memset(t->memo, 0, sizeof(t->memo));
		memset(t->rules, 0, sizeof(t->rules));
		t->ring = r;
		t->index = i;
		t->head = __atomic_load_n(&r->head, __ATOMIC_RELAXED);
		t->tail = __atomic_load_n(&r->tail, __ATOMIC_RELAXED);
		t->random = (monotonic_ns() ^ ((uint64_t)i << 32) ^ (uint64_t)(uintptr_t)&t) | 1;
		r->tid = (uint32_t)syscall(SYS_gettid);
		uint32_t limit = __atomic_load_n(&conn.region->ring_limit, __ATOMIC_RELAXED);
		while (limit < (uint32_t)i + 1 &&
		       !__atomic_compare_exchange_n(&conn.region->ring_limit, &limit, i + 1, 0,
						    __ATOMIC_RELEASE, __ATOMIC_RELAXED))
			;
		r->owners++;
	}
	return t;
}

/* A ring for the calling thread and its state; NULL when there is none. */
static struct thread *thread_start(void)
{
	if (internal || ensure_connected())
		return NULL;
	internal++;
	struct thread *t = NULL;
	/* every ring taken: threads that ended wait for the consumer to drain theirs */
	for (unsigned tries = 0; !t && tries < RING_TRIES; tries++) {
		if (tries > 0) {
			if (!consumer_alive()) {
				detach();
				break;
			}
			struct timespec pause = { 0, WAIT_NS * 10 };
			nanosleep(&pause, NULL);
		}
		t = take_ring();
	}
	if (t) {
		find_stack(t);
		self = t;
		pthread_setspecific(thread_key, t);
	} else {
		__atomic_fetch_add(&conn.region->no_ring, 1, __ATOMIC_RELAXED);
	}
	internal--;
	return t;
}

/* ---- what the walk reads ---- */

struct walk_env {
	struct mapset *maps;
	struct rule_cache_entry *rules; /* the thread's (level 0), or NULL */
	uint64_t direct_lo, direct_hi; /* read directly: inside the thread's stack */
	int may_ask;		       /* may ask cargo-trace for a mapping (level 0) */
	int asked;
};

static int read_through_kernel(uint64_t addr, uint64_t *value)
{
	struct iovec local = { .iov_base = value, .iov_len = sizeof(*value) };
	struct iovec remote = { .iov_base = (void *)addr, .iov_len = sizeof(*value) };

	return syscall(SYS_process_vm_readv, conn.pid, &local, 1, &remote, 1, 0) ==
			       (long)sizeof(*value)
		       ? 0
		       : -1;
}

static int walk_read(struct walk_env *env, uint64_t addr, uint64_t *value)
{
	if (__builtin_expect(addr >= env->direct_lo && addr + 8 <= env->direct_hi &&
				     addr + 8 > addr,
			     1)) {
		*value = *(volatile const uint64_t *)addr;
		return 0;
	}
	return read_through_kernel(addr, value);
}

static inline struct rule_cache_entry *rule_slot(struct walk_env *env, uint64_t lookup)
{
	uint64_t mix = lookup * 0x9e3779b97f4a7c15ULL;

	return &env->rules[(mix >> 40) & (RULE_CACHE - 1)];
}

static int walk_cached(struct walk_env *env, uint64_t lookup, struct ctp_rule *rule,
		       uint32_t *object, uint64_t *bias)
{
	if (!env->rules)
		return 0;
	struct rule_cache_entry *e = rule_slot(env, lookup);
	if (e->lookup != lookup || e->generation != env->maps->generation)
		return 0;
	*rule = e->rule;
	*object = e->object;
	*bias = e->bias;
	return 1;
}

static void walk_cache(struct walk_env *env, uint64_t lookup, const struct ctp_rule *rule,
		       uint32_t object, uint64_t bias)
{
	if (!env->rules)
		return;
	struct rule_cache_entry *e = rule_slot(env, lookup);
	e->lookup = lookup;
	e->generation = env->maps->generation;
	e->object = object;
	e->bias = bias;
	e->rule = *rule;
}

static const unsigned char *walk_tables(struct walk_env *env)
{
	(void)env;
	return conn.tables;
}

static const struct ctp_mapping *find_in(const struct mapset *set, uint64_t addr)
{
	uint32_t lo = 0, len = set->n;

	while (len > 0) {
		uint32_t half = len >> 1;
		if (set->m[lo + half].start <= addr) {
			lo += half + 1;
			len -= half + 1;
		} else {
			len = half;
		}
	}
	if (lo == 0 || addr >= set->m[lo - 1].end)
		return NULL;
	return &set->m[lo - 1];
}

/* Asks cargo-trace for the process's mappings (the one at pc wanted); under
 * lookup_lock. 0 when the new set is in conn.maps. */
static int fetch_mappings(uint64_t pc)
{
	struct ctp_msg_lookup ask = { .kind = CTP_MSG_LOOKUP, .pc = pc };

	if (conn.mapsets >= MAX_MAPSETS)
		return -1; /* no room for another set: unasked, so no answer waits unread */
	__atomic_fetch_add(&conn.region->lookups, 1, __ATOMIC_RELAXED);
	internal++;
	int ok = send(conn.fd, &ask, sizeof(ask), MSG_NOSIGNAL) == (ssize_t)sizeof(ask) &&
		 receive_mappings(NULL) == 0;
	internal--;
	if (!ok && !consumer_alive())
		detach();
	return ok ? 0 : -1;
}

/* Asks cargo-trace for the mapping at pc (a library mapped since the last
 * answer); under lookup_lock. */
static void ask_mapping(struct walk_env *env, uint64_t pc)
{
	struct mapset *now = __atomic_load_n(&conn.maps, __ATOMIC_ACQUIRE);

	if (now != env->maps) {
		env->maps = now; /* another thread asked already */
		return;
	}
	if (conn.negatives_generation == now->generation) {
		for (uint32_t i = 0; i < conn.nnegatives; i++)
			if (conn.negatives[i] == pc)
				return;
	} else {
		conn.negatives_generation = now->generation;
		conn.nnegatives = 0;
	}
	if (fetch_mappings(pc))
		return;
	env->maps = __atomic_load_n(&conn.maps, __ATOMIC_ACQUIRE);
	if (!find_in(env->maps, pc)) {
		conn.negatives_generation = env->maps->generation;
		if (conn.nnegatives < NEGATIVES)
			conn.negatives[conn.nnegatives++] = pc;
	}
}

/* cargo-trace said the process's mappings changed (a library unmapped, another
 * mapped over it): asks for them all again before the next walk. */
static void refresh_mappings(uint32_t epoch)
{
	spin_lock(&conn.lookup_lock);
	if (conn.mappings_epoch != epoch && conn.state == CONN_UP) {
		/* asked once whatever the answer: a failure is a detach, or no room */
		fetch_mappings(0);
		conn.mappings_epoch = epoch;
	}
	spin_unlock(&conn.lookup_lock);
}

static const struct ctp_mapping *walk_mapping(struct walk_env *env, uint64_t addr)
{
	const struct ctp_mapping *m = find_in(env->maps, addr);

	if (__builtin_expect(m != NULL, 1) || conn.state != CONN_UP)
		return m;
	if (env->may_ask ? (spin_lock(&conn.lookup_lock), 1) : try_lock(&conn.lookup_lock)) {
		ask_mapping(env, addr);
		spin_unlock(&conn.lookup_lock);
		env->asked = 1;
	}
	return find_in(env->maps, addr);
}

/* ---- stacks ---- */

static uint64_t stack_hash(const struct ctp_walk *w)
{
	uint64_t hash = 0x9e3779b97f4a7c15ULL ^ w->len ^ (uint64_t)w->end << 32 ^
			(uint64_t)w->reason << 48;

	for (uint32_t i = 0; i < w->len; i++) {
		hash = (hash ^ w->frames[i]) * 0xff51afd7ed558ccdULL;
		hash ^= hash >> 32;
	}
	return hash ? hash : 1;
}

static uint64_t stack_header(const struct ctp_walk *w)
{
	return (uint64_t)w->len | (uint64_t)w->end << 32 | (uint64_t)w->reason << 48;
}

static int same_stack(const struct ctp_walk *w, uint32_t id)
{
	uint64_t at = id - 1;

	if (at + 1 + w->len > conn.region->nwords || conn.words[at] != stack_header(w))
		return 0;
	return memcmp(&conn.words[at + 1], w->frames, w->len * sizeof(uint64_t)) == 0;
}

/* The stack's id in the region, stored if new; 0 if it could not be. */
static uint32_t intern(const struct ctp_walk *w, int level)
{
	uint64_t hash = stack_hash(w);
	uint64_t mask = CTP_STACK_SLOTS - 1;

	for (int i = 0; i < STACK_PROBES; i++) {
		struct ctp_stack_slot *slot = &conn.slots[(hash + i) & mask];
		uint64_t h = __atomic_load_n(&slot->hash, __ATOMIC_ACQUIRE);
		if (h == 0)
			break;
		if (h == hash && same_stack(w, slot->id))
			return slot->id;
	}
	/* a nested level may have interrupted the holder: it does not wait */
	if (level ? !try_lock((int *)&conn.region->stack_lock)
		  : (spin_lock((int *)&conn.region->stack_lock), 0))
		return 0;
	uint32_t id = 0;
	for (int i = 0; i < STACK_PROBES; i++) {
		struct ctp_stack_slot *slot = &conn.slots[(hash + i) & mask];
		uint64_t h = slot->hash;
		if (h == hash && same_stack(w, slot->id)) {
			id = slot->id;
			break;
		}
		if (h != 0)
			continue;
		uint64_t used = conn.region->words_used;
		if (used + 1 + w->len > conn.region->nwords)
			break;
		conn.words[used] = stack_header(w);
		memcpy(&conn.words[used + 1], w->frames, w->len * sizeof(uint64_t));
		conn.region->words_used = used + 1 + w->len;
		id = (uint32_t)used + 1;
		slot->id = id;
		__atomic_store_n(&slot->hash, hash, __ATOMIC_RELEASE);
		conn.region->stacks++;
		break;
	}
	if (!id)
		conn.region->stacks_full++;
	spin_unlock((int *)&conn.region->stack_lock);
	return id;
}

/* ---- the walk memo ---- */

static inline struct memo_set *memo_set_of(struct thread *t, uint64_t rip, uint64_t rsp)
{
	uint64_t mix = (rip ^ (rsp * 0xc2b2ae3d27d4eb4fULL)) * 0x9e3779b97f4a7c15ULL;

	return &t->memo[(mix >> 40) & (MEMO_SETS - 1)];
}

/* The stack of a walk from (rip, rsp, rbp) if one remembered read the same
 * words; 0 if none did. */
static inline uint32_t memo_find(struct thread *t, uint32_t generation, uint64_t rip,
				 uint64_t rsp, uint64_t rbp)
{
	struct memo_set *set = memo_set_of(t, rip, rsp);

	for (int way = 0; way < MEMO_WAYS; way++) {
		struct memo_entry *e = &set->ways[way];
		if (e->rip != rip || e->rsp != rsp || e->generation != generation ||
		    (e->uses_rbp && e->rbp != rbp))
			continue;
		uint64_t differ = 0;
		for (uint32_t i = 0; i < e->nwords; i++)
			differ |= *(volatile const uint64_t *)(rsp + e->offset[i]) ^ e->value[i];
		if (!differ)
			return e->stack;
	}
	return 0;
}

static void memo_remember(struct thread *t, uint32_t generation, const struct ctp_walk *w,
			  uint64_t rip, uint64_t rsp, uint64_t rbp, uint32_t stack)
{
	if (w->end != CTP_WALK_COMPLETE || w->unfit || w->nwords > MEMO_WORDS || !stack)
		return;
	/* a walk from a signal's alternate stack: what lies between it and the thread's
	 * stack may be unmapped by the time the memo reads again */
	if (rsp < t->stack_lo || rsp >= t->stack_hi)
		return;
	for (uint32_t i = 0; i < w->nwords; i++)
		if (w->word_addr[i] < rsp || w->word_addr[i] + 8 > t->stack_hi ||
		    w->word_addr[i] - rsp > UINT32_MAX)
			return; /* the memo reads directly only inside the stack */
	struct memo_set *set = memo_set_of(t, rip, rsp);
	struct memo_entry *e = &set->ways[set->next++ % MEMO_WAYS];
	e->rip = rip;
	e->rsp = rsp;
	e->rbp = rbp;
	e->uses_rbp = w->uses_rbp;
	e->stack = stack;
	e->nwords = w->nwords;
	for (uint32_t i = 0; i < w->nwords; i++) {
		e->offset[i] = (uint32_t)(w->word_addr[i] - rsp);
		e->value[i] = w->word_value[i];
	}
	e->generation = generation;
}

/* The stack id of the wrapper's caller chain at c. */
static uint32_t stack_of(struct thread *t, const struct ctp_call *c, uint32_t level)
{
	uint32_t epoch = __atomic_load_n(&conn.region->mappings_epoch, __ATOMIC_ACQUIRE);
	if (__builtin_expect(epoch != conn.mappings_epoch, 0) && level == 0)
		refresh_mappings(epoch);
	struct mapset *maps = __atomic_load_n(&conn.maps, __ATOMIC_ACQUIRE);
	int use_memo = level == 0 && !(conn.options.flags & CTP_OPT_NO_MEMO);

	if (use_memo) {
		/* one answer in 1024 timed, for the figures */
		int timed = (t->ring->memo_hits & 1023) == 0;
		uint64_t started = timed ? now_ticks() : 0;
		uint32_t id = memo_find(t, maps->generation, c->rip, c->rsp, c->rbp);
		if (id) {
			struct ctp_ring *r = t->ring;
			if (timed) {
				r->memo_ticks += now_ticks() - started;
				r->memo_timed++;
			}
			r->memo_hits++;
			return id;
		}
	}
	struct walk_env env = {
		.maps = maps, .rules = level == 0 ? t->rules : NULL, .may_ask = level == 0
	};
	if (c->rsp >= t->stack_lo && c->rsp < t->stack_hi) {
		env.direct_lo = c->rsp;
		env.direct_hi = t->stack_hi;
	}
	struct ctp_walk *w = &t->scratch[level];
	uint64_t started = now_ticks();
	ctp_walk_stack(&env, w, c->rip, c->rsp, c->rbp, 0, 0);
	struct ctp_ring *r = t->ring;
	r->walk_ticks += now_ticks() - started;
	r->walks++;
	r->walked_frames += w->len;
	r->walk_ends[w->end & (CTP_WALK_END_COUNT - 1)]++;
	uint32_t id = intern(w, level);
	if (!id)
		r->not_stored++;
	else if (use_memo && !env.asked)
		memo_remember(t, maps->generation, w, c->rip, c->rsp, c->rbp, id);
	return id;
}

/* A wrapped call made inside a wrapped allocator's call: part of that call. */
static void inside_call(void)
{
	struct thread *t = self;

	if (t && t->ring)
		t->ring->inside_calls++;
}

/* ---- sampling (bpf_prog::AllocOptions, as alloc.bpf.h draws) ---- */

static inline uint32_t random_u32(struct thread *t)
{
	uint64_t x = t->random;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	t->random = x;
	return (uint32_t)((x * 0x2545F4914F6CDD1DULL) >> 32);
}

static inline int sampled(struct thread *t, uint64_t size)
{
	const struct ctp_options *o = &conn.options;

	if (o->sample_every > 1)
		return (uint64_t)random_u32(t) * o->sample_every < 1ULL << 32;
	if (o->sample_bytes > 0)
		return size >= o->sample_bytes ||
		       (uint64_t)random_u32(t) * o->sample_bytes < size << 32;
	return 1;
}

static inline int size_wanted(uint64_t size)
{
	const struct ctp_options *o = &conn.options;

	return size >= o->min_size && (o->max_size == 0 || size <= o->max_size);
}

/* ---- the recorder ---- */

static void record(struct ctp_call *c, int wrapped);

/* Called by ctp_capture with the wrapper's arguments and registers, all in
 * registers (a struct the wrapper stored and this loaded would stall on store
 * forwarding). Not static: the stub jumps here. */
__attribute__((visibility("hidden"), used)) void ctp_record(uint32_t kind, uint64_t address,
							    uint64_t size, uint64_t rip,
							    uint64_t rsp, uint64_t rbp)
{
	struct ctp_call c = {
		.rip = rip, .rsp = rsp, .rbp = rbp, .address = address, .size = size, .kind = kind
	};

	record(&c, 1);
}

/* ctp_record for a hooked function's call (hooks.h): recorded whatever the wrappers do. */
static __attribute__((noinline)) void ctp_record_hooked(uint32_t kind, uint64_t address,
							 uint64_t size, uint64_t rip, uint64_t rsp,
							 uint64_t rbp)
{
	struct ctp_call c = {
		.rip = rip, .rsp = rsp, .rbp = rbp, .address = address, .size = size, .kind = kind
	};

	record(&c, 0);
}

/* Records call c; wrapped: a wrapper's, which a named allocator's session leaves out (a
 * wrapper called before the connection, which told the options, records up to here). */
static inline __attribute__((always_inline)) void record(struct ctp_call *c, int wrapped)
{
	struct thread *t = self;

	if (__builtin_expect(!t, 0)) {
		t = thread_start();
		if (!t)
			return;
	}
	if (internal || conn.state != CONN_UP || (wrapped && wrappers_pass))
		return;
	uint32_t level = t->level;
	if (level >= NEST_LEVELS) {
		t->ring->nested_lost++;
		return;
	}
	t->level = level + 1;
	__asm__ volatile("" ::: "memory");

	struct ctp_event e = { .address = c->address, .size = c->size, .kind = c->kind };
	int walk = 0, keep = 1;
	switch (c->kind) {
	case CTP_EV_ALLOC:
	case CTP_EV_MMAP:
		if (conn.options.sample_every > 1 && !sampled(t, 0)) {
			keep = 0;
			break;
		}
		if (!c->address) {
			e.kind = CTP_EV_FAILED;
			break;
		}
		if (!size_wanted(c->size) || (conn.options.sample_bytes > 0 && !sampled(t, c->size)))
			keep = 0;
		else
			walk = 1;
		break;
	case CTP_EV_RESIZING:
		/* as the BPF path's realloc entry: walked there, unless left out */
		if ((conn.options.sample_every > 1 && !sampled(t, 0)) || !size_wanted(c->size) ||
		    (conn.options.sample_bytes > 0 && !sampled(t, c->size)))
			e.flags = CTP_EV_UNSAMPLED;
		else
			walk = 1;
		break;
	default:
		break;
	}
	if (keep) {
		if (walk && !no_stacks)
			e.stack = stack_of(t, c, level);
		e.time = now_ticks();
		if (level > 0)
			t->ring->nested_events++;
		if (level == 0) {
			publish(t, &e);
			publish_pending(t);
		} else if (!t->publishing) {
			/* the interrupted level is not publishing: in order, at once */
			publish(t, &e);
		} else {
			uint32_t n = t->npending;
			if (n < PENDING) {
				t->pending[n] = e;
				__atomic_store_n(&t->npending, n + 1, __ATOMIC_RELAXED);
			} else {
				t->ring->nested_lost++;
			}
		}
	}
	__asm__ volatile("" ::: "memory");
	t->level = level;
}

/* ctp_capture(kind, address, size): adds the registers a site's probe would
 * see with the site's frame popped (rip: the wrapper's return address, rsp:
 * the wrapper's, rbp) as ctp_record's fourth to sixth arguments, and goes on
 * there. */
void ctp_capture(uint32_t kind, uint64_t address, uint64_t size);
__asm__(".text\n"
	".globl ctp_capture\n"
	".hidden ctp_capture\n"
	".type ctp_capture, @function\n"
	"ctp_capture:\n"
	".cfi_startproc\n"
	"\tmovq (%rsp), %rcx\n"
	"\tleaq 8(%rsp), %r8\n"
	"\tmovq %rbp, %r9\n"
	"\tjmp ctp_record\n"
	".cfi_endproc\n"
	".size ctp_capture, .-ctp_capture\n");

/* The sites cargo_trace_allocated(address, size, mapped, log, n),
 * cargo_trace_resizing(old, size, log, n) and cargo_trace_resized(address):
 * a one-byte nop first (where the BPF path's uprobe is, emulated), a return
 * unless recording in-process, else ctp_record with the event and the
 * registers a probe of the site sees, the site's frame popped. */
#define STR_(x) #x
#define STR(x) STR_(x)
#define EV_ALLOC 1
#define EV_MMAP 3
#define EV_RESIZING 5
#define EV_RESIZED 6
_Static_assert(EV_ALLOC == CTP_EV_ALLOC && EV_MMAP == CTP_EV_MMAP &&
		       EV_RESIZING == CTP_EV_RESIZING && EV_RESIZED == CTP_EV_RESIZED,
	       "the sites' event kinds");
#define SITE_ASM(name, body)                                 \
	".text\n"                                            \
	".globl " #name "\n"                                 \
	".type " #name ", @function\n" #name ":\n"           \
	".cfi_startproc\n"                                   \
	"\tnop\n"                                            \
	"\tcmpl $0, recording_mode(%rip)\n"                  \
	"\tjne 1f\n"                                         \
	"\tret\n"                                            \
	"1:\n" body "\tmovq (%rsp), %rcx\n"                  \
	"\tleaq 8(%rsp), %r8\n"                              \
	"\tmovq %rbp, %r9\n"                                 \
	"\tjmp ctp_record\n"                                 \
	".cfi_endproc\n"                                     \
	".size " #name ", .-" #name "\n"
__asm__(SITE_ASM(cargo_trace_allocated,
		 "\tmovl %edx, %eax\n"
		 "\tmovq %rsi, %rdx\n"
		 "\tmovq %rdi, %rsi\n"
		 "\tmovl $" STR(EV_ALLOC) ", %edi\n"
		 "\ttestl %eax, %eax\n"
		 "\tje 2f\n"
		 "\tmovl $" STR(EV_MMAP) ", %edi\n"
		 "2:\n"));
__asm__(SITE_ASM(cargo_trace_resizing,
		 "\tmovq %rsi, %rdx\n"
		 "\tmovq %rdi, %rsi\n"
		 "\tmovl $" STR(EV_RESIZING) ", %edi\n"));
__asm__(SITE_ASM(cargo_trace_resized,
		 "\tmovq %rdi, %rsi\n"
		 "\txorl %edx, %edx\n"
		 "\tmovl $" STR(EV_RESIZED) ", %edi\n"));

/* Records an event of the calling wrapper: a macro, so that the stub is
 * called from the wrapper itself and the walk starts in it. */
#define RECORD(kind_, address_, size_) \
	ctp_capture((kind_), (uint64_t)(uintptr_t)(address_), (uint64_t)(size_))

/* A forked child records apart: its own region and connection, at its first
 * event. The parent's region stays mapped (the child never writes it). */
static void record_forked_child(void)
{
	if (!recording_mode)
		return;
	forked_image = 1;
	if (conn.state == CONN_UP) {
		close(conn.fd);
		conn.state = CONN_NONE;
	}
	conn.lock = 0;
	conn.lookup_lock = 0;
	conn.region = NULL;
	conn.maps = NULL;
	conn.mapsets = 0;
	conn.nnegatives = 0;
	conn.mappings_epoch = 0;
	/* the parent's threads' states are copies here: the next owners of
	 * this child's rings start from them afresh */
	self = NULL;
	internal = 0;
	in_call = 0;
}

/* Decides the mode, at the library's first call (which may come before its
 * constructor). */
static void record_init(void)
{
	const char *socket_path = getenv("CARGO_TRACE_HEAP");

	if (!socket_path || !socket_path[0])
		return;
	if (pthread_key_create(&thread_key, thread_ended))
		return;
	pthread_atfork(NULL, NULL, record_forked_child);
	const char *bare = getenv("CARGO_TRACE_HEAP_NO_STACKS");
	no_stacks = bare && bare[0] == '1';
	recording_mode = 1;
}

/* A process image connects at its start, whether it allocates or not: cargo-trace
 * tells an image that ran without the library by its silence. */
static void record_image_started(void)
{
	if (recording_mode)
		ensure_connected();
}

#include "hooks.h"
