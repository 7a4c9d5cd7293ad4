/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The heap profiler, included at the end of trace.bpf.c: the malloc family's
 * calls, their returns and the frees of their blocks, aggregated per (user
 * stack, process, probe) and per (process, probe). Userspace reads the maps
 * (bpf_prog::Tracer::alloc_stats and friends).
 *
 * on_alloc (uprobe on an allocating function), on_resize (on one that
 * resizes a block): walks the stack once, with take_stacks, and keeps its
 * key and the requested size for the return in the thread's task storage;
 * a realloc's old block leaves the live map here, at entry, because once
 * the allocator has freed it another thread may be handed the same address
 * before this call returns.
 * on_alloc_return (uretprobe): the address (NULL: nothing allocated) enters
 * the live map with its size, stack and birth time; the stack's counters and
 * size histogram grow.
 * All are attached as uprobes of one perf event per kind of function, which
 * the kernel binds to the traced processes and their children (probes'
 * bound.rs): a multi-uprobe link, or a uprobe session, follows one process
 * and not its forks, or else every process on the machine.
 * on_free (uprobe on free and the like): the block leaves the live map at
 * entry, for the same reason; its stack's frees, freed bytes and lifetime
 * histogram grow. An address the map does not hold (allocated before the
 * attach, by an untracked function, or twice freed) is counted apart.
 *
 * Where the time goes: besides the walk, mostly in helper calls, ~40 ns each
 * where the kernel mitigates return speculation (array lookups are inlined;
 * hash lookups, the task, its storage, the pid and the clock are calls).
 * The hot paths make few: the entry reads its cookie from the run context
 * and its process from the thread's storage, which exists only for threads
 * of wanted processes; the return finds its probe id in the call; the free
 * of a tracked block asks neither the thread's calls nor the pid filter. A
 * call that sampling leaves out makes none: its entry draws from this CPU's
 * random state, not bpf_get_prandom_u32, and needs no cookie (resizes have
 * their own program); its return, while no thread keeps a call, ends on the
 * count of calls kept (alloc_calls_kept); the free of its block on the live
 * filter.
 *
 * Nesting: an allocator may call another probed function (glibc's
 * realloc(NULL, n) calls malloc, realloc(p, 0) free, reallocarray realloc).
 * Only the outermost call is what the program asked for: calls made while
 * another is in progress on the thread are marked nested and not counted.
 * A tail call (glibc's reallocarray jumps to realloc) enters the second
 * function with the first one's rsp: nested too. Its stack could not be
 * walked anyway: the first function's return address is the uretprobe
 * trampoline's by then. Both returns fire, the inner one first.
 * Calls in progress are a stack per thread, matched by the stack pointer:
 * a return pops the call whose entry rsp is its own minus 8 (the return
 * address popped), discarding deeper ones that never returned.
 *
 * jemalloc's xallocx(ptr, size, extra, flags) resizes a block in place and
 * returns its usable size, the block's address unchanged. It is counted as a
 * realloc that did not move: the old block freed (its stack's frees, its
 * lifetime) and a block of the new size allocated at the same address under
 * the stack of the xallocx call. The new size is the one asked for as far as
 * the allocator gave it: the usable size returned, capped at size + extra
 * (with extra 0, exactly size, as a malloc of size counts size however the
 * allocator rounds it). A usable size below size means the block could not
 * be resized: it stays as it was, with its size, stack and birth.
 *
 * Anonymous mmap and munmap are tracked as an allocator's functions: the
 * mapping made at an address is a block until munmap is called at it (a
 * partial munmap ends the whole block). malloc's own mmaps and munmaps happen
 * inside allocator calls (nested) or inside free (an unknown address, not
 * counted as such for munmap).
 *
 * Peak: each process's live bytes and their peak, and for each stack its
 * live bytes at that peak, kept lazily: a change of a stack that comes
 * after the process's last peak first saves the stack's live bytes as they
 * were at it (they had not changed since). Exact for one thread; with
 * threads racing on one process, within the races, and, where frees are
 * logged (struct ct_free_log), within the small blocks a thread freed and
 * has not told yet.
 */
#ifndef ALLOC_BPF_H
#define ALLOC_BPF_H

#define CT_MAP_ANONYMOUS 0x20
#define CT_MAP_FAILED (~0ULL)

/* Set by userspace before load (bpf_prog::AllocOptions). */
const volatile __u64 alloc_temporary_ns = 1000000; /* frees sooner are temporaries */
/*
 * Sampling, when one is set: an outermost allocating call is counted with a
 * chance of 1 in alloc_sample_every, or of size / alloc_sample_bytes (1 from
 * that size up): unbiased estimates, each sampled event weighing the inverse
 * of its chance (est_* in ct_alloc_stats). Frees of blocks not sampled find
 * no block, as frees of unknown ones do, and are not counted as unknown.
 */
const volatile __u32 alloc_sample_every = 0;
const volatile __u64 alloc_sample_bytes = 0;
/* Only allocations of sizes in [alloc_min_size, alloc_max_size] are counted
 * (0: no bound). As with sampling, the frees of the others are not unknown. */
const volatile __u64 alloc_min_size = 0;
const volatile __u64 alloc_max_size = 0;

const volatile enum ct_alloc_limits anchor_alloc_limits;
const volatile enum ct_alloc_kind anchor_alloc_kind;
const volatile enum ct_alloc_counter anchor_alloc_counter;
const volatile enum ct_alloc_call_flags anchor_alloc_call_flags;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* sized for the worst case, used by few */
	__type(key, struct ct_live_key);
	__type(value, struct ct_live_block);
	__uint(max_entries, 1 << 20);
} alloc_live SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ct_alloc_key);
	__type(value, struct ct_alloc_stats);
	__uint(max_entries, 65536);
} alloc_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_alloc_proc_key);
	__type(value, struct ct_alloc_proc);
	__uint(max_entries, 4096);
} alloc_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, CT_ALLOC_COUNTER_COUNT);
} alloc_counters SEC(".maps");

/* A zeroed ct_alloc_stats, the first value of a new key: too big for the
 * BPF stack (a ct_alloc_proc's too: the element is larger). Never written. */
_Static_assert(sizeof(struct ct_alloc_stats) >= sizeof(struct ct_alloc_proc),
	       "alloc_zero's element zeroes a ct_alloc_proc too");
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_alloc_stats);
	__uint(max_entries, 1);
} alloc_zero SEC(".maps");

/*
 * When some allocations are left out (sampling, sizes), most frees are of
 * blocks never tracked: the number of live blocks per hash of their address
 * (any process) lets such a free end on one inlined array lookup, before
 * any helper call. A count may exceed the truth (a block replaced in the
 * live map, or deleted by userspace, stays counted), never fall short of
 * it: a block is counted before a free can see it, as the return that adds
 * it comes before the allocating call hands it out.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1 << CT_ALLOC_LIVE_FILTER_BITS); /* 1 when nothing is left out */
} alloc_live_filter SEC(".maps");

/*
 * Addresses a block was counted freed at because the allocator handed them
 * out again with no free seen (CT_ALLOC_REUSED), with the time: where frees
 * are logged (struct ct_free_log), a thread's free may be told after another
 * thread was handed the address. The told free finds it here, and is not
 * counted again, nor as unknown, nor as a reuse. Kept for the recent ones.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_live_key);
	__type(value, __u64);
	__uint(max_entries, 4096);
} alloc_reused SEC(".maps");

/* Per CPU: the state of sampling's random numbers (xorshift64*), seeded by
 * bpf_get_prandom_u32 at its first use. A helper call costs ~40 ns where
 * the kernel mitigates return speculation: an unsampled call makes one. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} alloc_random SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ct_alloc_thread);
} alloc_threads SEC(".maps");

/*
 * Under sampling 1 in N, the calls kept in the threads' storage for their
 * return and not yet popped, all threads together. Most returns are then of
 * calls left out at their entry: while no thread keeps a call, a return
 * cannot be of one and ends on this load, before the two helper calls that
 * would look (on_alloc_return). It is never 0 while the returning thread
 * keeps a call: its own entry counted the call before the return (one
 * thread, in order, whatever CPU each ran on), and each other thread's pops
 * come after its own pushes. A call whose return never comes stays counted
 * until a later entry or return of its thread drops it (a longjmp out of
 * the allocator), or for good when the thread ends in it (killed, or its
 * process exiting meanwhile) or the return probe goes before the call
 * returns (a detach): the count is then above the truth, and the returns
 * take the slow way, which is exact. Not kept without sample_every:
 * every wanted entry keeps a call then, the count would seldom be 0, and a
 * line that every CPU writes would cost every call; the slow way also
 * counts the wanted returns whose entry went unseen (CT_ALLOC_NO_ENTRY),
 * which this load could not tell.
 */
volatile __u64 alloc_calls_kept = 0;

/*
 * When the session's probes were attached, in bpf_ktime_get_ns's clock, set
 * by userspace before the target it launched runs on (0: not yet). A free
 * logged before it (by a library's constructor, ahead of the target's entry
 * where it waited for the probes) is of a block allocated before the probes
 * saw anything, and is not counted, as such frees were not before the log.
 */
volatile __u64 alloc_logged_since = 0;

/* A call pushed on a thread's calls, or popped (see alloc_calls_kept). */
static __always_inline void call_pushed(void)
{
	if (alloc_sample_every > 1)
		__sync_fetch_and_add(&alloc_calls_kept, 1);
}

static __always_inline void call_popped(void)
{
	if (alloc_sample_every > 1)
		__sync_fetch_and_sub(&alloc_calls_kept, 1);
}

/* All ones if v is not 0, for v below 2^63. */
static __always_inline __u64 mask_if_not_zero(__u64 v)
{
	return mask_if_negative(-(__s64)v);
}

/*
 * Bucket of a log2 histogram: the bit length of v (0 for 0), capped.
 * Branch-free: with a branch per halving, the verifier followed each of the
 * 64 ways through it, each bucket an index it keeps apart, twice a program.
 */
static __always_inline __u32 log2_bucket(__u64 v)
{
	__u64 bits = 0, shift;

	shift = 32 & mask_if_not_zero(v >> 32);
	v >>= shift;
	bits += shift;
	shift = 16 & mask_if_not_zero(v >> 16);
	v >>= shift;
	bits += shift;
	shift = 8 & mask_if_not_zero(v >> 8);
	v >>= shift;
	bits += shift;
	shift = 4 & mask_if_not_zero(v >> 4);
	v >>= shift;
	bits += shift;
	shift = 2 & mask_if_not_zero(v >> 2);
	v >>= shift;
	bits += shift;
	shift = 1 & mask_if_not_zero(v >> 1);
	v >>= shift;
	bits += shift;
	bits += v;
	return bits < CT_ALLOC_BUCKETS ? bits : CT_ALLOC_BUCKETS - 1;
}

static __always_inline bool sampling(void)
{
	return alloc_sample_every > 1 || alloc_sample_bytes > 0;
}

/* Whether some allocations are left out, by sampling or by size. */
static __always_inline bool leaving_out(void)
{
	return sampling() || alloc_min_size > 0 || alloc_max_size > 0;
}

static __always_inline bool size_wanted(__u64 size)
{
	return size >= alloc_min_size && (alloc_max_size == 0 || size <= alloc_max_size);
}

static __always_inline __u32 random_u32(void)
{
	__u32 zero = 0;
	__u64 *state = bpf_map_lookup_elem(&alloc_random, &zero); /* inlined: no call */

	if (!state)
		return bpf_get_prandom_u32();
	__u64 x = *state;
	if (!x)
		x = (__u64)bpf_get_prandom_u32() << 32 | bpf_get_prandom_u32() | 1;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x; /* a program interrupting this one may draw the same number: harmless */
	return (x * 0x2545F4914F6CDD1DULL) >> 32;
}

/* Whether an allocation of size bytes is sampled. */
static __always_inline bool sampled(__u64 size)
{
	if (alloc_sample_every > 1) /* r < 2^32 / N, without a division */
		return (__u64)random_u32() * alloc_sample_every < 1ULL << 32;
	if (alloc_sample_bytes > 0)
		return size >= alloc_sample_bytes ||
		       (__u64)random_u32() * alloc_sample_bytes < size << 32;
	return true;
}

/* The running uprobe program's cookie, read from its perf link's run context
 * with a load where bpf_get_attach_cookie is a call; the task is at hand for
 * its storage anyway. */
static __always_inline __u64 run_cookie(struct task_struct *task)
{
	return bpf_core_cast(task->bpf_ctx, struct bpf_trace_run_ctx)->bpf_cookie;
}

/* What a sampled event of a block of size bytes stands for: allocations (or
 * frees) in 1/65536ths, and bytes. */
static __always_inline __u64 weight_count(__u64 size)
{
	if (alloc_sample_every > 1)
		return (__u64)alloc_sample_every << CT_ALLOC_WEIGHT_SHIFT;
	if (size >= alloc_sample_bytes || size == 0)
		return 1 << CT_ALLOC_WEIGHT_SHIFT;
	return (alloc_sample_bytes << CT_ALLOC_WEIGHT_SHIFT) / size;
}

static __always_inline __u64 weight_bytes(__u64 size)
{
	if (alloc_sample_every > 1)
		return size * alloc_sample_every;
	return size >= alloc_sample_bytes ? size : alloc_sample_bytes;
}

/* The live filter's count of the slot of address (NULL when no block is left out). */
static __always_inline __u32 *live_filter_slot(__u64 address)
{
	if (!leaving_out())
		return NULL;
	/* blocks are 16-byte aligned: Fibonacci hashing of the rest */
	__u32 slot = ((address >> 4) * 0x9E3779B97F4A7C15ULL) >> (64 - CT_ALLOC_LIVE_FILTER_BITS);

	return bpf_map_lookup_elem(&alloc_live_filter, &slot);
}

/* Puts block at key in the live map, counted in the live filter. */
static __always_inline long put_live(struct ct_live_key *key, struct ct_live_block *block,
				     __u64 flags)
{
	long err = bpf_map_update_elem(&alloc_live, key, block, flags);
	__u32 *count = err ? NULL : live_filter_slot(key->address);

	if (count)
		__sync_fetch_and_add(count, 1);
	return err;
}

static __always_inline struct ct_alloc_stats *alloc_stats_of(__u64 stack, __u32 pid,
							     __u32 probe_id)
{
	struct ct_alloc_key key = { .stack = stack, .pid = pid, .probe_id = probe_id };
	struct ct_alloc_stats *stats = bpf_map_lookup_elem(&alloc_stats, &key);
	__u32 zero = 0;

	if (stats)
		return stats;
	struct ct_alloc_stats *empty = bpf_map_lookup_elem(&alloc_zero, &zero);
	if (!empty)
		return NULL;
	long err = bpf_map_update_elem(&alloc_stats, &key, empty, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		count_in(&alloc_counters, CT_ALLOC_STATS_FULL);
		return NULL;
	}
	return bpf_map_lookup_elem(&alloc_stats, &key);
}

static __always_inline struct ct_alloc_proc *alloc_proc_of(__u32 pid, __u32 probe_id)
{
	struct ct_alloc_proc_key key = { .pid = pid, .probe_id = probe_id };
	struct ct_alloc_proc *proc = bpf_map_lookup_elem(&alloc_procs, &key);

	__u32 zero = 0;

	if (proc)
		return proc;
	/* zeroes: alloc_zero's element is larger, and its start will do */
	struct ct_alloc_stats *empty = bpf_map_lookup_elem(&alloc_zero, &zero);
	if (!empty)
		return NULL;
	long err = bpf_map_update_elem(&alloc_procs, &key, empty, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		count_in(&alloc_counters, CT_ALLOC_STATS_FULL);
		return NULL;
	}
	return bpf_map_lookup_elem(&alloc_procs, &key);
}

/* Adds delta to the live bytes of stats' stack and of its process, keeping
 * the peak (see the top of this file). */
static __always_inline void change_live(struct ct_alloc_stats *stats, struct ct_alloc_proc *proc,
					__s64 delta)
{
	__u64 seq = __sync_fetch_and_add(&proc->seq, 1) + 1;

	if (proc->peak_seq >= stats->changed_seq)
		stats->peak_live_bytes = stats->live_bytes;
	__sync_fetch_and_add(&stats->live_bytes, delta);
	stats->changed_seq = seq;
	__s64 live = __sync_fetch_and_add(&proc->live_bytes, delta) + delta;
	if (live > proc->peak_bytes) {
		proc->peak_bytes = live;
		proc->peak_seq = seq;
	}
}

/* Counts the free of a tracked block at time now. A global function, as
 * account_alloc: each is verified once a program, not at each of the ways a
 * program reaches it (on_alloc_return: 53K instructions, 11K so). */
__noinline int account_free(const struct ct_live_block *block, __u32 pid, __u64 now)
{
	if (!block)
		return 0;
	struct ct_alloc_stats *stats = alloc_stats_of(block->stack, pid, block->probe_id);
	struct ct_alloc_proc *proc = alloc_proc_of(pid, block->probe_id);

	if (!stats || !proc)
		return 0;
	__u64 lifetime = now > block->born_ns ? now - block->born_ns : 0;
	__sync_fetch_and_add(&stats->frees, 1);
	__sync_fetch_and_add(&stats->freed_bytes, block->size);
	if (lifetime < alloc_temporary_ns)
		__sync_fetch_and_add(&stats->temporaries, 1);
	__sync_fetch_and_add(&stats->life_hist[log2_bucket(lifetime)], 1);
	__sync_fetch_and_add(&stats->live_birth_us, -(block->born_ns / 1000));
	if (sampling()) {
		__sync_fetch_and_add(&stats->est_frees, weight_count(block->size));
		__sync_fetch_and_add(&stats->est_freed_bytes, weight_bytes(block->size));
	}
	change_live(stats, proc, -(__s64)block->size);
	__sync_fetch_and_add(&proc->frees, 1);
	__sync_fetch_and_add(&proc->freed_bytes, block->size);
	return 0;
}

static __always_inline void count_unknown_free(__u32 pid, __u32 probe_id)
{
	if (leaving_out())
		return; /* most are frees of blocks left out */
	struct ct_alloc_proc *proc = alloc_proc_of(pid, probe_id);

	count_in(&alloc_counters, CT_ALLOC_UNKNOWN_FREES);
	if (proc)
		__sync_fetch_and_add(&proc->unknown_frees, 1);
}

/* Counts the allocation of size bytes at address under stack, and tracks the
 * block: pid_probe is the process's tgid << 32 | the probe id (five arguments
 * at most). */
__noinline int account_alloc(__u64 address, __u64 size, __u64 stack, __u64 pid_probe, __u64 now)
{
	__u32 pid = pid_probe >> 32, probe_id = pid_probe;
	struct ct_alloc_stats *stats = alloc_stats_of(stack, pid, probe_id);
	struct ct_alloc_proc *proc = alloc_proc_of(pid, probe_id);

	if (!stats || !proc)
		return 0;
	__sync_fetch_and_add(&stats->allocs, 1);
	__sync_fetch_and_add(&stats->bytes, size);
	__sync_fetch_and_add(&stats->size_hist[log2_bucket(size)], 1);
	__sync_fetch_and_add(&proc->allocs, 1);
	__sync_fetch_and_add(&proc->bytes, size);
	if (sampling()) {
		__sync_fetch_and_add(&stats->est_allocs, weight_count(size));
		__sync_fetch_and_add(&stats->est_bytes, weight_bytes(size));
	}

	struct ct_live_key key = { .address = address, .pid = pid };
	struct ct_live_block block = {
		.size = size,
		.stack = stack,
		.born_ns = now,
		.probe_id = probe_id,
	};
	long err = put_live(&key, &block, BPF_NOEXIST);
	if (err == -EEXIST) {
		/* The allocator handed out an address still live here: its block
		 * was freed by a function not probed. Count it freed now. */
		struct ct_live_block *old = bpf_map_lookup_elem(&alloc_live, &key);
		if (old) {
			struct ct_live_block gone = *old;
			count_in(&alloc_counters, CT_ALLOC_REUSED);
			account_free(&gone, pid, now);
			bpf_map_update_elem(&alloc_reused, &key, &now, BPF_ANY);
		}
		err = put_live(&key, &block, BPF_ANY);
	}
	if (err) {
		count_in(&alloc_counters, CT_ALLOC_LIVE_FULL);
		__sync_fetch_and_add(&stats->untracked, 1);
		__sync_fetch_and_add(&stats->untracked_bytes, size);
		return 0;
	}
	__sync_fetch_and_add(&stats->live_birth_us, now / 1000);
	change_live(stats, proc, size);
	return 0;
}

/* Removes the block at address from the live map into *block, for a free
 * made at freed_ns (~0: now). 0 if it was there; 1 if the address holds a
 * block born after that free (see tell_frees), or another free of it took
 * it first (a double free, racing); -1 if no block was there. */
static __always_inline int take_live(__u64 address, __u32 pid, __u64 freed_ns,
				     struct ct_live_block *block)
{
	struct ct_live_key key = { .address = address, .pid = pid };
	struct ct_live_block *live = bpf_map_lookup_elem(&alloc_live, &key);

	if (!live)
		return -1;
	if (live->born_ns > freed_ns)
		return 1;
	*block = *live;
	if (bpf_map_delete_elem(&alloc_live, &key))
		return 1;
	__u32 *count = live_filter_slot(address);
	if (count)
		__sync_fetch_and_sub(count, 1);
	return 0;
}

/* What tell_free works on: bpf_loop's context lives on the BPF stack. */
struct told_frees {
	struct ct_alloc_thread *t; /* the entries, in t->told */
	__u32 tgid;
	__u32 probe_id;
};

/* bpf_loop callback: tells the free of entry i (see tell_frees). */
static int tell_free(__u32 i, void *arg)
{
	struct told_frees *c = arg;
	struct ct_free_entry *entry = &c->t->told[i & (CT_FREE_LOG - 1)];
	__u32 tgid = c->tgid;
	__u64 address = entry->address, ns = entry->ns;

	if (ns < alloc_logged_since)
		return 0;
	__u32 *count = live_filter_slot(address);
	if (count && *count == 0)
		return 0; /* a block left out */
	struct ct_live_block block;
	int taken = take_live(address, tgid, ns, &block);
	if (taken == 0) {
		account_free(&block, tgid, ns);
		return 0;
	}
	struct ct_live_key key = { .address = address, .pid = tgid };
	__u64 *reused = bpf_map_lookup_elem(&alloc_reused, &key);
	if (reused && *reused >= ns) {
		/* counted freed at the reuse: not a reuse without a free after
		 * all (the sum over CPUs comes out right) */
		bpf_map_delete_elem(&alloc_reused, &key);
		__u32 index = CT_ALLOC_REUSED;
		__u64 *reuses = bpf_map_lookup_elem(&alloc_counters, &index);
		if (reuses)
			*reuses -= 1;
		return 0;
	}
	if (taken < 0)
		count_unknown_free(tgid, c->probe_id);
	return 0;
}

/*
 * Tells the kernel n frees of the thread's free log at user address log (a
 * struct ct_free_log) in process tgid, a wanted one: each block leaves the
 * live map and is counted freed at the time logged, as on_free would have
 * counted it then. A block born after its free was logged is another one
 * the allocator handed out at the address meanwhile (to another thread:
 * this one tells its log before it allocates); the logged block was counted
 * freed then (alloc_reused). Returns 0, or -1 if the log could not be read.
 * The entries are read at once into the thread's storage (no other program
 * of the thread runs meanwhile; on the BPF stack they took half of it) and
 * told by a bpf_loop callback, which the verifier checks once rather than
 * for each of CT_FREE_LOG entries. A global function: checked once, on its
 * own, rather than at each call with the caller's state.
 */
__noinline int tell_frees(__u64 log, __u32 n, __u32 tgid, __u32 probe_id)
{
	if (n > CT_FREE_LOG)
		n = CT_FREE_LOG;
	if (n == 0)
		return 0;
	struct ct_alloc_thread *t = bpf_task_storage_get(&alloc_threads, bpf_get_current_task_btf(),
							 NULL, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t)
		return -1;
	if (!t->tgid)
		t->tgid = tgid; /* created here: see thread_calls */
	if (bpf_probe_read_user(t->told, n * sizeof(t->told[0]),
				(void *)(log + __builtin_offsetof(struct ct_free_log, entries))))
		return -1;
	struct told_frees c = { .t = t, .tgid = tgid, .probe_id = probe_id };
	bpf_loop(n, tell_free, &c, 0);
	return 0;
}

/* The calls in progress on task, the current thread, after dropping those
 * that returned unseen: their entry rsp under sp, the stack pointer at an
 * entry (a call in progress has its entry rsp above it, or at it when it
 * tail-called the function entered now). The storage is created (create)
 * only for a thread of a wanted process: a thread that has one is wanted,
 * and its process is known without the two helper calls that ask. */
static __always_inline struct ct_alloc_thread *thread_calls(struct task_struct *task, __u64 sp,
							    bool create)
{
	struct ct_alloc_thread *t = bpf_task_storage_get(&alloc_threads, task, NULL, 0);

	if (!t && create) {
		__u32 tgid = bpf_get_current_pid_tgid() >> 32;
		if (filter_uprobes && !pid_wanted(tgid))
			return NULL;
		t = bpf_task_storage_get(&alloc_threads, task, NULL,
					 BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (t)
			t->tgid = tgid;
	}
	if (!t)
		return NULL;
	for (int i = 0; i < CT_ALLOC_NEST; i++) {
		__u32 depth = t->depth;
		if (depth == 0 || depth > CT_ALLOC_NEST ||
		    t->calls[(depth - 1) & (CT_ALLOC_NEST - 1)].sp >= sp)
			break;
		t->depth = depth - 1;
		call_popped();
	}
	if (t->depth > CT_ALLOC_NEST)
		t->depth = 0;
	return t;
}

/* Puts back the block a resize took from the live map at its entry, when the
 * resize did not happen. */
static __always_inline void restore_old_block(const struct ct_alloc_call *call, __u32 tgid)
{
	if (call->flags & CT_CALL_OLD_KNOWN) {
		struct ct_live_key key = { .address = call->old, .pid = tgid };
		put_live(&key, &call->old_block, BPF_ANY);
	}
}

/* The user stack of an allocating call: from the probed function's entry,
 * or, at a preloaded site (site), from its caller, the preloaded library's
 * wrapper of the allocator's function, the site's own frame left out: the
 * stack then starts where a probe of the wrapped function would start it. */
static __always_inline __u64 alloc_stack(struct pt_regs *ctx, __u32 tgid, bool site)
{
	__u64 ip = ctx->ip, sp = ctx->sp;

	/* at the site's first instruction: its return address on top (unread,
	 * the walk starts at the site, one frame more) */
	if (site && bpf_probe_read_user(&ip, sizeof(ip), (void *)sp) == 0)
		sp += 8;
	else
		ip = ctx->ip;
	return take_stacks(NULL, tgid, ip, sp, ctx->bp, ctx->di, false).user;
}

/* An allocating call's entry, unsampled when sampling 1 in N left it out
 * (a resize then goes on all the same: see on_resize). Returns 1 when it
 * kept no call for its return, 0 when it did. */
static __always_inline int alloc_entry(struct pt_regs *ctx, struct task_struct *task,
				       bool unsampled, bool site)
{
	__u64 cookie = run_cookie(task);
	__u32 kind = cookie >> CT_ALLOC_KIND_SHIFT;
	struct ct_alloc_thread *t = thread_calls(task, ctx->sp, true);
	if (!t)
		return 1;
	__u32 tgid = t->tgid;
	__u32 depth = t->depth;
	if (depth >= CT_ALLOC_NEST)
		return 0; /* its return counts CT_ALLOC_NO_ENTRY */
	struct ct_alloc_call *call = &t->calls[depth & (CT_ALLOC_NEST - 1)];
	t->depth = depth + 1;
	call_pushed();
	call->sp = ctx->sp;
	if (depth > 0) {
		call->flags = CT_CALL_NESTED;
		return 0;
	}

	__u64 size = 0, old = 0, out = 0;

	switch (kind) {
	case CT_ALLOC_SIZE_ARG0:
		size = ctx->di;
		break;
	case CT_ALLOC_SIZE_ARG1:
		size = ctx->si;
		break;
	case CT_ALLOC_CALLOC:
		size = ctx->di * ctx->si;
		break;
	case CT_ALLOC_REALLOC:
		old = ctx->di;
		size = ctx->si;
		break;
	case CT_ALLOC_REALLOCARRAY:
		old = ctx->di;
		size = ctx->si * ctx->dx;
		break;
	case CT_ALLOC_POSIX_MEMALIGN:
		out = ctx->di;
		size = ctx->dx;
		break;
	case CT_ALLOC_MMAP:
		size = ctx->si;
		break;
	case CT_ALLOC_XALLOCX:
		old = ctx->di;
		size = ctx->si;
		out = ctx->dx; /* extra */
		break;
	}
	call->kind = kind;
	call->probe_id = cookie;
	call->size = size;
	call->out = out;
	call->old = old;
	call->flags = 0;
	if (old && take_live(old, tgid, ~0ULL, &call->old_block) == 0)
		call->flags = CT_CALL_OLD_KNOWN;
	/* mmap of a file is no heap: its return is not counted */
	bool file = kind == CT_ALLOC_MMAP && !(ctx->cx & CT_MAP_ANONYMOUS);
	if (file || unsampled || !size_wanted(size) ||
	    (alloc_sample_bytes > 0 && !sampled(size))) {
		/* sampling's cheap path: kept for its return (a realloc's old block
		 * is still freed there), not walked */
		call->flags |= CT_CALL_UNSAMPLED;
		return 0;
	}
	call->stack = alloc_stack(ctx, tgid, site);
	return 0;
}

/* An allocating call's return, of address (its return value): entry_sp is
 * the stack pointer its entry saw. */
static __always_inline int alloc_return(struct task_struct *task, __u64 entry_sp, __u64 address)
{
	struct ct_alloc_thread *t = thread_calls(task, entry_sp, false);
	__u32 depth = t ? t->depth : 0;
	if (!t || depth == 0 || depth > CT_ALLOC_NEST ||
	    t->calls[(depth - 1) & (CT_ALLOC_NEST - 1)].sp != entry_sp) {
		/* sampling 1 in N keeps no call for most entries; a thread without
		 * storage is most often one of a process not wanted */
		if (alloc_sample_every <= 1 &&
		    (t || !filter_uprobes || pid_wanted(bpf_get_current_pid_tgid() >> 32)))
			count_in(&alloc_counters, CT_ALLOC_NO_ENTRY);
		return 0;
	}
	t->depth = depth - 1;
	call_popped();
	struct ct_alloc_call *call = &t->calls[(depth - 1) & (CT_ALLOC_NEST - 1)];
	if (call->flags & CT_CALL_NESTED)
		return 0;

	__u32 tgid = t->tgid;
	__u32 probe_id = call->probe_id;
	__u64 now = bpf_ktime_get_ns();
	if (call->kind == CT_ALLOC_MMAP && address == CT_MAP_FAILED)
		address = 0;
	if (call->kind == CT_ALLOC_POSIX_MEMALIGN) {
		/* returns an error number; the address went to *out */
		if (address != 0 || bpf_probe_read_user(&address, sizeof(address),
							 (void *)call->out))
			address = 0;
	}
	if (call->kind == CT_ALLOC_XALLOCX) {
		/* returns the usable size; the block stays where it is (see the
		 * top of this file) */
		__u64 usable = address, most = call->size + call->out;
		if (usable < call->size) {
			restore_old_block(call, tgid); /* not resized */
			return 0;
		}
		call->size = usable < most ? usable : most;
		address = call->old;
	}
	if (call->old) {
		if (!address && call->size) {
			/* failed: the old block lives on */
			count_in(&alloc_counters, CT_ALLOC_FAILED);
			restore_old_block(call, tgid);
			return 0;
		}
		if (call->flags & CT_CALL_OLD_KNOWN)
			account_free(&call->old_block, tgid, now);
		else
			count_unknown_free(tgid, probe_id);
	}
	if (!address) {
		/* realloc(p, 0) freeing p is not a failure */
		if (!call->old)
			count_in(&alloc_counters, CT_ALLOC_FAILED);
		return 0;
	}
	if (call->flags & CT_CALL_UNSAMPLED)
		return 0;
	account_alloc(address, call->size, call->stack, (__u64)tgid << 32 | probe_id, now);
	return 0;
}

/* The entry of an allocating function that does not resize a block. */
SEC("uprobe")
int on_alloc(struct pt_regs *ctx)
{
	/* Sampling 1 in N: most calls end here, before any helper call, on this
	 * CPU's random state. The calls that the sampled ones make go on (they
	 * are nested). The return of a call left here finds no call of its own:
	 * see on_alloc_return. */
	if (alloc_sample_every > 1 && !sampled(0))
		return 0;
	alloc_entry(ctx, bpf_get_current_task_btf(), false, false);
	return 0;
}

/* The entry of realloc, reallocarray and xallocx (AllocKind::programs): one
 * that sampling leaves out goes on, to free its old block (its own
 * allocation is not counted: CT_CALL_UNSAMPLED) and so that the calls it
 * makes are nested, as the sampled ones are (realloc(NULL, n) calls
 * malloc: counted once either way). A program of its own, so that the
 * others' left out need not read their kind from the run context. */
SEC("uprobe")
int on_resize(struct pt_regs *ctx)
{
	bool unsampled = alloc_sample_every > 1 && !sampled(0);

	alloc_entry(ctx, bpf_get_current_task_btf(), unsampled, false);
	return 0;
}

SEC("uretprobe")
int on_alloc_return(struct pt_regs *ctx)
{
	/* Sampling 1 in N: the return of a call left out at its entry is still
	 * probed. While no thread keeps a call, it ends on this load, where the
	 * task and its storage were two helper calls to find no call. */
	if (alloc_sample_every > 1 && alloc_calls_kept == 0)
		return 0;
	/* rsp at the entry was this one less the return address popped */
	return alloc_return(bpf_get_current_task_btf(), ctx->sp - 8, ctx->ax);
}

/* The entry of a freeing function, of the block at address. */
static __always_inline int free_entry(struct pt_regs *ctx, __u64 address)
{
	if (!address)
		return 0;
	__u32 *count = live_filter_slot(address);
	if (count && *count == 0)
		return 0; /* a block left out */
	/* The live map holds blocks of wanted processes only, and a free nested
	 * in an allocator call finds none (realloc(p, 0) frees p: its entry took
	 * p): the thread's calls and the pid filter are asked only of the others,
	 * two and three helper calls spared on the way every tracked block goes. */
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct ct_live_block block;
	if (take_live(address, tgid, ~0ULL, &block) == 0) {
		account_free(&block, tgid, bpf_ktime_get_ns());
		return 0;
	}
	if (leaving_out())
		return 0; /* most are frees of blocks left out */
	if (filter_uprobes && !pid_wanted(tgid))
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	struct ct_alloc_thread *t = thread_calls(task, ctx->sp, false);
	if (t && t->depth > 0)
		return 0; /* inside an allocator call: part of it */
	__u64 cookie = run_cookie(task);
	/* most munmaps unmap files, or memory malloc mapped for itself */
	if (cookie >> CT_ALLOC_KIND_SHIFT != CT_ALLOC_MUNMAP)
		count_unknown_free(tgid, (__u32)cookie);
	return 0;
}

SEC("uprobe")
int on_free(struct pt_regs *ctx)
{
	return free_entry(ctx, ctx->di);
}

/* A free's probe moved past its first instructions, which copied the address
 * from rdi to rsi (mimalloc's mi_free: they are not emulated, and a probe on
 * them would be single-stepped, ~30 times the time). */
SEC("uprobe")
int on_free_arg1(struct pt_regs *ctx)
{
	return free_entry(ctx, ctx->si);
}

/*
 * The sites of the preloaded library (cargo-trace/preload/preload.c), which
 * a target launched with it calls after its allocator's functions return,
 * or before they free: attached in place of libc's functions. Each is the
 * first instruction of a function of its own, a nop, which the kernel
 * emulates under the breakpoint: no return probe, where libc's functions
 * take an entry and a return event. The stack is
 * walked from the site's caller, the library's wrapper of the allocator's
 * function. Frees go to on_free (their address in rdi as free's is), or,
 * where the library logs them (exact counts: see struct ct_free_log), are
 * told with the thread's next allocation (tell_frees): one breakpoint per
 * pair.
 *
 * on_preload_alloc, at cargo_trace_allocated(address, size, mapped, log, n): the
 * allocating call's entry and return at once, nothing kept per thread. A
 * mapping (mapped) made while a call of a probed allocator is in progress on
 * the thread (an allocator of the executable's own, mapping memory for
 * itself) is part of that call, as when libc's mmap is probed.
 */
SEC("uprobe")
int on_preload_alloc(struct pt_regs *ctx)
{
	__u64 address = ctx->di, size = ctx->si;

	/* sampling 1 in N: most calls end here, before any helper call (the
	 * library logs no frees under sampling) */
	if (alloc_sample_every > 1 && !sampled(0))
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (filter_uprobes && !pid_wanted(tgid))
		return 0;
	/* the thread's frees logged so far came first */
	if (ctx->r8 && tell_frees(ctx->cx, ctx->r8, tgid, (__u32)run_cookie(task)))
		count_in(&alloc_counters, CT_ALLOC_LOGS_UNREAD);
	if (ctx->dx) {
		struct ct_alloc_thread *t = thread_calls(task, ctx->sp, false);
		if (t && t->depth > 0)
			return 0;
	}
	if (!address) {
		count_in(&alloc_counters, CT_ALLOC_FAILED);
		return 0;
	}
	if (!size_wanted(size) || (alloc_sample_bytes > 0 && !sampled(size)))
		return 0;
	__u64 stack = alloc_stack(ctx, tgid, true);
	account_alloc(address, size, stack, (__u64)tgid << 32 | (__u32)run_cookie(task),
		      bpf_ktime_get_ns());
	return 0;
}

/* At cargo_trace_resizing(old, size, log, n), before realloc: its entry, as
 * on_resize's (the cookie's kind is realloc's), the stack walked from the
 * wrapper. */
SEC("uprobe")
int on_preload_resize(struct pt_regs *ctx)
{
	bool unsampled = alloc_sample_every > 1 && !sampled(0);
	struct task_struct *task = bpf_get_current_task_btf();

	if (ctx->cx) {
		/* the thread's logged frees came first (the address realloc
		 * returns may be one of them) */
		__u32 tgid = bpf_get_current_pid_tgid() >> 32;
		if ((!filter_uprobes || pid_wanted(tgid)) &&
		    tell_frees(ctx->dx, ctx->cx, tgid, (__u32)run_cookie(task)))
			count_in(&alloc_counters, CT_ALLOC_LOGS_UNREAD);
	}
	alloc_entry(ctx, task, unsampled, true);
	return 0;
}

/* At cargo_trace_resized(address), after realloc: its return. The wrapper
 * calls both sites with one stack pointer, so the site's rsp is the one the
 * entry kept. */
SEC("uprobe")
int on_preload_resized(struct pt_regs *ctx)
{
	if (alloc_sample_every > 1 && alloc_calls_kept == 0)
		return 0;
	return alloc_return(bpf_get_current_task_btf(), ctx->sp, ctx->di);
}

/* At cargo_trace_freed(log, n): a thread's free log, full. */
SEC("uprobe")
int on_preload_freed(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_uprobes && !pid_wanted(tgid))
		return 0;
	if (tell_frees(ctx->di, ctx->si, tgid, (__u32)run_cookie(bpf_get_current_task_btf())))
		count_in(&alloc_counters, CT_ALLOC_LOGS_UNREAD);
	return 0;
}

/* At cargo_trace_log(log), a thread's first logged free: where its log is,
 * for its exit and its exec. */
SEC("uprobe")
int on_preload_log(struct pt_regs *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct ct_alloc_thread *t = thread_calls(task, ctx->sp, true);

	if (t) {
		t->free_log = ctx->di;
		t->log_probe_id = run_cookie(task);
	}
	return 0;
}

/* Tells the free log of task, the current thread, if it registered one:
 * at its exit or exec, while its memory is still the process's. */
static __always_inline void tell_last_frees(struct task_struct *task)
{
	struct ct_alloc_thread *t = bpf_task_storage_get(&alloc_threads, task, NULL, 0);

	if (!t || !t->free_log)
		return;
	__u64 log = t->free_log;
	__u32 n = 0;
	t->free_log = 0;
	if (bpf_probe_read_user(&n, sizeof(n), (void *)log) ||
	    tell_frees(log, n, t->tgid, t->log_probe_id))
		count_in(&alloc_counters, CT_ALLOC_LOGS_UNREAD);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_thread_exit, struct task_struct *task)
{
	tell_last_frees(task);
	return 0;
}

SEC("tp_btf/sched_prepare_exec")
int BPF_PROG(on_thread_exec, struct task_struct *task)
{
	tell_last_frees(task);
	return 0;
}

#endif /* ALLOC_BPF_H */
