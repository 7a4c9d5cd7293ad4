// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * cargo-trace's in-kernel stack walker and aggregator.
 *
 * Every event (uprobe, uretprobe, perf sample, tracepoint) takes the user
 * registers of the current thread, walks its stack with the unwind tables
 * userspace loaded (docs/walk.md is the contract, shared with
 * unwind_tables::walk), stores the stack once by hash and adds 1 to the
 * counter of (stack, kernel stack, process, probe). Nothing is sent to
 * userspace per event; it reads the maps when it wants.
 *
 * Where the time goes (benches/uprobe.rs measures it): helper calls are
 * dear where the kernel mitigates return speculation (~90 ns for one
 * bpf_probe_read_user on the machines measured), so the hot path avoids
 * them. Per event: the process lookup, one bpf_probe_read_user per 4 KiB
 * page of stack touched (page_cache), and usually a single counts lookup
 * (see record()). Per frame, no helper call: the rule comes from a per-CPU
 * cache keyed by the address (rule_cache) or, on a miss, from the mapping
 * (the previous frame's tried first) and a branch-free binary search of the
 * rows of its 64 KiB page, and reads are served from the cached pages.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "cargo_trace.h"

#define CT_SIGSTOP 19
#define CT_NR_RT_SIGRETURN 15 /* x86-64 */
#define CT_SYSCALL_INSN_LEN 2

#define ENOMEM 12
#define EEXIST 17

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by userspace before load (bpf_prog::Options). */
const volatile __u8 filter_uprobes = 0; /* uprobes count only pids in pid_filter */
const volatile __u8 filter_events = 1;	/* same for perf events and tracepoints */
const volatile __u8 kernel_stacks = 1;	/* record kernel stacks of kernel-mode events */

/*
 * Anchors: they put the header's enums in BTF, so that the generated skeleton
 * carries their values and layout.rs can check its mirrors at compile time.
 */
const volatile enum ct_limits anchor_limits;
const volatile enum ct_stack_key anchor_stack_key;
const volatile enum ct_rule_kind anchor_rule_kind;
const volatile enum ct_reg anchor_reg;
const volatile enum ct_rbp_kind anchor_rbp_kind;
const volatile enum ct_sigframe anchor_sigframe;
const volatile enum ct_mapping_flags anchor_mapping_flags;
const volatile enum ct_walk_error anchor_walk_error;

/* Map sizes here are defaults; userspace may resize them before load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ct_row_chunk);
	__uint(max_entries, 8192); /* 8M rows, 32 MiB */
} rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ct_page);
	__uint(max_entries, 262144); /* 16 GiB of code, 2 MiB */
} pages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ct_rule);
	__uint(max_entries, 262144); /* 4 MiB */
} rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_table);
	__uint(max_entries, 4096);
} tables SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* 16 KiB values: allocate on use */
	__type(key, __u32);		      /* tgid */
	__type(value, struct ct_proc);
	__uint(max_entries, 4096);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* 4 KiB values: allocate on use */
	__type(key, __u64);		      /* stack hash */
	__type(value, struct ct_stack);
	__uint(max_entries, 16384);
} stacks SEC(".maps");

/*
 * Where a new stack goes when the stacks map cannot allocate it: its
 * elements come from per-CPU caches that the kernel refills after the
 * program returns, so a burst of new stacks inside one interrupt can find
 * them empty (-ENOMEM) long before the map is full. This map is
 * preallocated; userspace moves its stacks into the stacks map
 * (Tracer::drain_spilled_stacks), and every lookup tries both.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, struct ct_stack);
	__uint(max_entries, 256);
} spilled_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct_count_key);
	__type(value, struct ct_count);
	__uint(max_entries, 65536);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, CT_WALK_ERROR_COUNT);
} walk_errors SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* tgid */
	__type(value, __u8);
	__uint(max_entries, 4096);
} pid_filter SEC(".maps");

/* Processes that exec'd and have not stopped with their libraries mapped yet
 * (see on_exec). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* tgid */
	__type(value, __u8);
	__uint(max_entries, 4096);
} loading SEC(".maps");

/*
 * The walk's state, and the stack it builds. It lives in a per-CPU map
 * rather than on the BPF stack for two reasons: a ct_stack does not fit in
 * 512 bytes of stack, and values loaded from a map are unknown to the
 * verifier, so it checks one iteration of the walk for every frame count
 * instead of simulating CT_MAX_FRAMES iterations with a known counter.
 * Per CPU is enough: tracing programs of the kinds used here do not nest on
 * one CPU (the kernel's bpf_prog_active guard).
 */
struct walk_scratch {
	struct ct_stack stack;	       /* stack.len counts the frames found so far */
	struct ct_stack kstack;	       /* the kernel stack, if the event has one */
	__u64 page_tag[CT_PAGE_SLOTS]; /* user page number + 1 held by each slot; 0: none */
	__u16 page_lo[CT_PAGE_SLOTS];  /* the slot holds bytes [page_lo, page end) of it, from 0 */
	__u32 use_rule_cache;	       /* level 0 only: see CT_NEST_LEVELS */
	struct ct_rule rule;	       /* the rule of the current step, when not from the cache */
	__u64 pc;
	__u64 rsp;
	__u64 rbp;
	__u64 hash;
	__u64 check;
	__u32 nmappings;
	__u32 mapping; /* index of the mapping of the previous pc: tried first */
	__u32 exact;   /* pc is a current pc, not a return address */
	__u32 generation; /* of the process's mappings (ct_proc.generation) */
	__u64 rdi;	  /* the thread's: known at the first frame (stack.len 1) only */
	__u16 error;
	__u16 reason;
};

/* One scratch per nesting level (see CT_NEST_LEVELS). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct walk_scratch);
	__uint(max_entries, CT_NEST_LEVELS);
} scratch SEC(".maps");

/* Per CPU: bit l set while a walk holds level l. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} levels SEC(".maps");

/* Pages of user stack read during the current walk: an element per level
 * per CPU (key cpu * CT_NEST_LEVELS + level), sized by userspace to the
 * number of possible CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_user_pages);
	__uint(max_entries, 64 * CT_NEST_LEVELS);
} page_cache SEC(".maps");

/* See CT_RULE_CACHE_SLOTS: an element per CPU, sized by userspace to the
 * number of possible CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_rule_cache);
	__uint(max_entries, 64);
} rule_cache SEC(".maps");

/*
 * Frames walked per bpf_loop iteration. Each iteration is a call and a
 * return of the callback, and returns are expensive where the kernel
 * mitigates return-address speculation (SRSO safe RET here): four steps per
 * call took ~3.5 ns off each frame, at 4x the verifier's work.
 */
#define STEPS_PER_CALL 4

/*
 * What bpf_loop passes to each step (it must live on the BPF stack): the
 * walk's scratch, the process's mappings, and this walk's page slots and
 * this CPU's rule cache, looked up once per walk rather than once a frame.
 */
struct walk_ctx {
	struct walk_scratch *w;
	struct ct_proc *proc;
	struct ct_user_pages *pages;
	struct ct_rule_cache *rules;
};

static __always_inline void count_error(__u32 error)
{
	__u64 *value = bpf_map_lookup_elem(&walk_errors, &error);

	if (value)
		*value += 1;
}

/* Two independent 64-bit hashes of the frames (multiply-xorshift with
 * unrelated constants), finished with murmur3's fmix64. */
static __always_inline __u64 hash_step(__u64 hash, __u64 pc)
{
	hash = (hash ^ pc) * 0x9e3779b97f4a7c15ULL;
	return hash ^ (hash >> 29);
}

static __always_inline __u64 check_step(__u64 check, __u64 pc)
{
	check = (check + pc) * 0xc2b2ae3d27d4eb4fULL;
	return (check << 31) | (check >> 33);
}

static __always_inline __u64 fmix64(__u64 k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	k ^= k >> 33;
	return k;
}

/*
 * The binary searches below are branch-free apart from their exit test: a
 * comparison becomes an all-ones/all-zeros mask. This keeps the verifier on
 * one path per step (a branchy search forks its state at every step and blows
 * the 1M-instruction budget) and spares the CPU a mispredicted branch per
 * step. The empty asm keeps clang from turning the mask back into a branch.
 */
static __always_inline __u64 mask_if_negative(__s64 value)
{
	asm volatile("" : "+r"(value));
	return (__u64)(value >> 63);
}

/* Index of the mapping holding addr, or CT_MAX_MAPPINGS if none does. */
static __always_inline __u32 find_mapping(struct ct_proc *proc, __u32 n, __u64 addr)
{
	/* lo = number of mappings that start at or before addr */
	__u32 lo = 0, len = n;

	for (int step = 0; step < CT_MAPPING_SEARCH_STEPS; step++) {
		if (len == 0)
			break;
		__u32 half = len >> 1;
		__u64 start = proc->mappings[(lo + half) & (CT_MAX_MAPPINGS - 1)].start;
		/* start <= addr; user addresses are below 2^63 */
		__u32 take = mask_if_negative(start - addr - 1);
		lo += (half + 1) & take;
		len = half - (take & ((len & 1) ^ 1));
	}
	if (lo == 0)
		return CT_MAX_MAPPINGS;
	lo -= 1;
	if (addr >= proc->mappings[lo & (CT_MAX_MAPPINGS - 1)].end)
		return CT_MAX_MAPPINGS;
	return lo;
}

static __always_inline struct ct_row *row_at(__u32 index)
{
	__u32 chunk_index = index / CT_ROWS_PER_CHUNK;
	struct ct_row_chunk *chunk = bpf_map_lookup_elem(&rows, &chunk_index);

	if (!chunk)
		return NULL;
	return &chunk->rows[index % CT_ROWS_PER_CHUNK];
}

/* The index in the rules map of the rule governing ELF address addr in
 * table t, -1 when the table has none (a gap); *row_offset is addr's offset
 * past the row's start, capped at CT_STEP_WINDOW. */
static __always_inline __s64 find_rule(struct ct_table *t, __u64 addr, __u32 *row_offset)
{
	__u64 page_index = (addr >> CT_PAGE_SHIFT) - t->first_page;

	/* below first_page the subtraction wraps to a huge index */
	if (page_index >= t->npages)
		return -1;
	__u32 key = t->pages_base + (__u32)page_index;
	struct ct_page *page = bpf_map_lookup_elem(&pages, &key);
	if (!page)
		return -1;

	/* the last row of the page whose addr_lo <= the low bits of addr */
	__u32 addr_lo = addr & 0xffff;
	__u32 first = page->first_row;
	__u32 lo = 0, len = page->nrows;
	__u32 rule = 0, row_lo = 0;
	for (int step = 0; step < CT_ROW_SEARCH_STEPS; step++) {
		if (len == 0)
			break;
		__u32 half = len >> 1;
		struct ct_row *row = row_at(first + lo + half);
		if (!row)
			return -1;
		/* row->addr_lo <= addr_lo */
		__u32 take = mask_if_negative((__s64)row->addr_lo - addr_lo - 1);
		lo += (half + 1) & take;
		len = half - (take & ((len & 1) ^ 1));
		rule = (row->rule & take) | (rule & ~take);
		row_lo = (row->addr_lo & take) | (row_lo & ~take);
	}
	if (lo == 0) {
		/* no row of this page starts at or before addr: the row before
		 * the page governs, if the table has one; it started in an
		 * earlier page, so every step of it lies behind addr */
		if (first <= t->rows_base)
			return -1;
		struct ct_row *row = row_at(first - 1);
		if (!row)
			return -1;
		rule = row->rule;
		*row_offset = CT_STEP_WINDOW;
	} else {
		__u32 offset = addr_lo - row_lo;
		*row_offset = offset < CT_STEP_WINDOW ? offset : CT_STEP_WINDOW;
	}
	return t->rules_base + rule;
}

/*
 * How far a CT_RULE_CFA_RSP_STEPS rule has moved rsp, in 8-byte slots,
 * row_offset (<= CT_STEP_WINDOW) bytes past its row's start: pushes minus
 * pops among the steps at row offsets 1..row_offset. Both 16-bit halves are
 * counted at once, branch-free (the classic SWAR popcount; BPF has none).
 */
static __always_inline __s64 steps_moved(__u32 steps, __u32 row_offset)
{
	__u32 happened = (1U << row_offset) - 1;
	__u32 x = steps & (happened | happened << 16);

	x -= (x >> 1) & 0x55555555;
	x = (x & 0x33333333) + ((x >> 2) & 0x33333333);
	x = (x + (x >> 4)) & 0x0f0f0f0f;
	x += x >> 8; /* pushes in bits 0-4, pops in bits 16-20 */
	return (__s64)(x & 0x1f) - (__s64)((x >> 16) & 0x1f);
}

/*
 * The rule for runtime address lookup (the pc, or a return address - 1) in
 * the process whose mappings proc holds, as the per-CPU rule cache keeps
 * it: a CT_RULE_CFA_RSP_STEPS row resolved to the CT_RULE_CFA_RSP in effect
 * at that address. NULL when the walk must stop; w->error says why.
 *
 * The cache is keyed by (address, generation of the process's mappings):
 * userspace gives every mapping set it registers a new generation, so an
 * entry can never answer for other mappings, and a hit costs no mapping
 * search, no table search and no rules lookup.
 */
static __always_inline struct ct_rule *rule_for(struct walk_scratch *w, struct ct_proc *proc,
						struct ct_rule_cache *cache, __u64 lookup)
{
	__u32 generation = w->generation;
	struct ct_rule_cache_entry *entry = NULL;

	if (w->use_rule_cache) {
		__u32 slot = ((lookup ^ ((__u64)generation << 40)) * 0x9e3779b97f4a7c15ULL) >> 52;
		entry = &cache->entries[slot & (CT_RULE_CACHE_SLOTS - 1)];
		if (entry->addr == lookup && entry->generation == generation)
			return &entry->rule;
	}

	__u32 mi = w->mapping;
	if (mi >= CT_MAX_MAPPINGS) {
		w->error = CT_WALK_NO_MAPPING;
		return NULL;
	}
	struct ct_mapping *m = &proc->mappings[mi];
	if (lookup < m->start || lookup >= m->end) {
		mi = find_mapping(proc, w->nmappings, lookup);
		if (mi >= CT_MAX_MAPPINGS) {
			w->error = CT_WALK_NO_MAPPING;
			return NULL;
		}
		m = &proc->mappings[mi];
		w->mapping = mi;
	}
	__u32 table_id = m->table_id;
	struct ct_table *t = bpf_map_lookup_elem(&tables, &table_id);
	if ((m->flags & CT_MAPPING_NO_TABLE) || !t) {
		w->error = CT_WALK_NO_ROW;
		return NULL;
	}
	__u32 row_offset = 0;
	__s64 found = find_rule(t, lookup - m->bias, &row_offset);
	if (found < 0) {
		w->error = CT_WALK_NO_ROW;
		return NULL;
	}
	__u32 index = found;
	struct ct_rule *rule = bpf_map_lookup_elem(&rules, &index);
	if (!rule) {
		w->error = CT_WALK_NO_ROW;
		return NULL;
	}
	w->rule = *rule;
	if (rule->kind == CT_RULE_CFA_RSP_STEPS) {
		w->rule.kind = CT_RULE_CFA_RSP;
		w->rule.cfa_off += 8 * steps_moved(rule->cfa_arg, row_offset);
	}
	if (entry) {
		entry->rule = w->rule;
		entry->addr = lookup;
		entry->generation = generation;
	}
	return &w->rule;
}

/*
 * Reads the u64 at user address addr through the page cache. Equivalent to
 * bpf_probe_read_user of those 8 bytes: a copy succeeds exactly when the
 * bytes it takes are mapped, readable and present, and it never leaves the
 * page of addr. Returns 0 on success.
 */
static __always_inline int read_user(struct walk_scratch *w, struct ct_user_pages *pages,
				     __u64 addr, __u64 *value)
{
	if (addr & (sizeof(__u64) - 1))
		/* misaligned (stack slots never are), maybe across two pages:
		 * read directly. Aligned, the word is one of its page's. */
		return bpf_probe_read_user(value, sizeof(*value), (void *)addr);

	__u32 offset = addr & (CT_USER_PAGE_SIZE - 1);
	__u64 page = addr / CT_USER_PAGE_SIZE;
	__u32 slot = page & (CT_PAGE_SLOTS - 1);
	struct ct_user_page *copy = &pages->slots[slot];
	if (w->page_tag[slot] != page + 1 || offset < w->page_lo[slot]) {
		__u32 lo = offset & ~63U;
		lo = lo > CT_READ_BELOW ? lo - CT_READ_BELOW : 0;
		__u32 size = CT_USER_PAGE_SIZE - lo;
		/* a bound the verifier can follow (the empty asm keeps clang
		 * from folding it away) */
		asm volatile("" : "+r"(size));
		if (size > CT_USER_PAGE_SIZE)
			return -1;
		if (bpf_probe_read_user(copy->words, size, (void *)(page * CT_USER_PAGE_SIZE + lo))) {
			w->page_tag[slot] = 0;
			return -1;
		}
		w->page_tag[slot] = page + 1;
		w->page_lo[slot] = lo;
	}
	/* a word index: page_lo is a multiple of 64 */
	__u32 at = (offset - w->page_lo[slot]) / sizeof(__u64);
	if (at >= CT_USER_PAGE_SIZE / sizeof(__u64))
		return -1;
	/* one load: through a byte array, clang would assemble the word from
	 * eight byte loads (BPF has no unaligned access) */
	*value = copy->words[at];
	return 0;
}

static __always_inline int stop(struct walk_scratch *w, __u16 error)
{
	w->error = error;
	return 1;
}

/* One step of docs/walk.md: from the frame at w->pc to its caller. */
static __always_inline int walk_step(struct walk_scratch *w, struct ct_proc *proc,
				     struct ct_user_pages *pages, struct ct_rule_cache *cache)
{
	__u64 lookup = w->exact ? w->pc : w->pc - 1;
	struct ct_rule *rule = rule_for(w, proc, cache, lookup);
	if (!rule)
		return 1;

	__u64 rsp = w->rsp, rbp = w->rbp;
	__u64 cfa, ra;
	__u32 exact = 0;
	switch (rule->kind) {
	case CT_RULE_CFA_RSP:
		cfa = rsp + (__s64)rule->cfa_off;
		break;
	case CT_RULE_CFA_RBP:
		cfa = rbp + (__s64)rule->cfa_off;
		break;
	case CT_RULE_PLT:
		cfa = rsp + 8 + ((w->pc & 15) >= (__u64)rule->cfa_off ? 8 : 0);
		break;
	case CT_RULE_CFA_DEREF: {
		__u64 base = rule->cfa_reg == CT_REG_RBP ? rbp : rsp;
		if (read_user(w, pages, base + (__s64)rule->cfa_off, &cfa))
			return stop(w, CT_WALK_READ_FAULT);
		cfa += (__s64)(__s32)rule->cfa_arg;
		break;
	}
	case CT_RULE_END:
		return stop(w, CT_WALK_OK);
	case CT_RULE_RETURN_IN_RDI:
		/* the return address left the stack: the caller's rsp may be
		 * this frame's, so no growth check */
		if (w->stack.len != 1) {
			w->reason = CT_UNSUPPORTED_RETURN_ADDRESS;
			return stop(w, CT_WALK_UNSUPPORTED);
		}
		ra = w->rdi;
		cfa = rsp + (__s64)rule->cfa_off;
		goto push;
	case CT_RULE_SIGNAL:
		/* rip, rsp and rbp of the interrupted code, from the ucontext */
		if (read_user(w, pages, rsp + CT_SIGFRAME_RIP, &ra) ||
		    read_user(w, pages, rsp + CT_SIGFRAME_RSP, &cfa) ||
		    read_user(w, pages, rsp + CT_SIGFRAME_RBP, &rbp))
			return stop(w, CT_WALK_READ_FAULT);
		exact = 1;
		goto push;
	case CT_RULE_UNSUPPORTED:
		w->reason = rule->reason;
		return stop(w, CT_WALK_UNSUPPORTED);
	case CT_RULE_GAP:
		return stop(w, CT_WALK_NO_ROW);
	default:
		/* a kind this program does not know: never guess */
		return stop(w, CT_WALK_UNSUPPORTED);
	}

	if (read_user(w, pages, cfa - 8, &ra))
		return stop(w, CT_WALK_READ_FAULT);
	if (rule->rbp_kind == CT_RBP_AT_CFA) {
		if (read_user(w, pages, cfa + (__s64)rule->rbp_off, &rbp))
			return stop(w, CT_WALK_READ_FAULT);
	} else if (rule->rbp_kind == CT_RBP_AT_RBP) {
		if (read_user(w, pages, rbp + (__s64)rule->rbp_off, &rbp))
			return stop(w, CT_WALK_READ_FAULT);
	}
	if (cfa <= rsp)
		return stop(w, CT_WALK_BAD_RA);

push:
	if (ra == 0)
		return stop(w, CT_WALK_BAD_RA);
	__u32 len = w->stack.len;
	if (len >= CT_MAX_FRAMES)
		return stop(w, CT_WALK_DEPTH_CAP);
	w->stack.pcs[len & (CT_MAX_FRAMES - 1)] = ra;
	w->stack.len = len + 1;
	w->hash = hash_step(w->hash, ra);
	w->check = check_step(w->check, ra);
	w->pc = ra;
	w->rsp = cfa;
	w->rbp = rbp;
	w->exact = exact;
	return 0;
}

/* bpf_loop callback: up to STEPS_PER_CALL steps; 1 once the walk stopped. */
static int walk_steps(__u32 index, void *arg)
{
	struct walk_ctx *ctx = arg;
	struct walk_scratch *w = ctx->w;
	struct ct_proc *proc = ctx->proc;
	struct ct_user_pages *pages = ctx->pages;
	struct ct_rule_cache *cache = ctx->rules;

	for (int i = 0; i < STEPS_PER_CALL; i++)
		if (walk_step(w, proc, pages, cache))
			return 1;
	return 0;
}

static __always_inline bool same_stack(const struct ct_stack *a, const struct ct_stack *b)
{
	return a->check == b->check && a->len == b->len && a->error == b->error &&
	       a->reason == b->reason;
}

/*
 * Stores the stack under hash (or, after a collision, the next free slot)
 * unless it is there already; returns its key in the stacks map.
 */
static __always_inline struct ct_stack *stored_stack(__u64 *key)
{
	struct ct_stack *old = bpf_map_lookup_elem(&stacks, key);

	return old ? old : bpf_map_lookup_elem(&spilled_stacks, key);
}

static __always_inline __u64 store_stack(struct ct_stack *stack, __u64 hash)
{
	for (int slot = 0; slot < CT_STACK_SLOTS; slot++) {
		__u64 key = hash + slot;
		struct ct_stack *old = stored_stack(&key);

		if (!old) {
			long err = bpf_map_update_elem(&stacks, &key, stack, BPF_NOEXIST);
			if (err == -ENOMEM)
				err = bpf_map_update_elem(&spilled_stacks, &key, stack, BPF_NOEXIST);
			if (err == 0)
				return key;
			/* -EEXIST: another CPU stored a stack there just now */
			if (err != -EEXIST)
				break;
			old = stored_stack(&key);
			if (!old)
				break;
		}
		if (same_stack(old, stack))
			return key;
		count_error(CT_WALK_HASH_COLLISION);
	}
	count_error(CT_WALK_STACK_MAP_FULL);
	return CT_STACK_NOT_STORED;
}

/* A finished stack hash as a key of the stacks map: clear of the reserved
 * keys, and of wrapping in store_stack. */
static __always_inline __u64 stack_key(__u64 hash)
{
	if (hash < CT_STACK_FIRST || hash > ~0ULL - CT_STACK_SLOTS)
		return CT_STACK_FIRST;
	return hash;
}

/* Finishes the hashes of stack (its frames' hash and check so far) over its
 * length and stop reason: sets stack->check, returns its stacks map key. */
static __always_inline __u64 finish_stack(struct ct_stack *stack, __u64 hash, __u64 check)
{
	__u64 tail = ((__u64)stack->len << 32) | ((__u64)stack->error << 16) | stack->reason;

	stack->check = fmix64(check_step(check, tail));
	return stack_key(fmix64(hash_step(hash, tail)));
}

/* Whether the current task is inside execve (where the kernel has it). */
static __always_inline bool current_in_execve(void)
{
	struct task_struct *task = bpf_get_current_task_btf();

	if (!bpf_core_field_exists(task->in_execve))
		return false;
	return BPF_CORE_READ_BITFIELD_PROBED(task, in_execve);
}

/*
 * Walks the user stack from the given registers into the scratch map and
 * finishes its hashes (w->hash, w->stack.check). False when the event has
 * no user stack after all: inside execve, a walk that fails found the image
 * that called execve gone (its registers, but the new image's memory) or the
 * new image not registered yet (registers at its entry point, where nothing
 * of it has run; also just after execve, in the kernel still: no process
 * but one that is loading). Such an event is counted as CT_WALK_IN_EXEC,
 * with its kernel stack only, rather than as a walk that failed.
 */
static __always_inline bool walk_user_stack(struct walk_scratch *w, __u32 level, __u32 tgid,
					    __u64 rip, __u64 rsp, __u64 rbp, __u64 rdi)
{
	struct ct_stack *stack = &w->stack;
	stack->pcs[0] = rip;
	stack->len = 1;
	w->pc = rip;
	w->rsp = rsp;
	w->rbp = rbp;
	w->hash = hash_step(0, rip);
	w->check = check_step(0x5851f42d4c957f2dULL, rip);
	w->mapping = 0;
	w->exact = 1;
	w->rdi = rdi;
	w->error = CT_WALK_OK;
	w->reason = 0;
	w->use_rule_cache = level == 0;
	for (int slot = 0; slot < CT_PAGE_SLOTS; slot++)
		w->page_tag[slot] = 0;

	__u32 cpu = bpf_get_smp_processor_id();
	__u32 pages_key = cpu * CT_NEST_LEVELS + level;
	struct ct_user_pages *pages = bpf_map_lookup_elem(&page_cache, &pages_key);
	struct ct_rule_cache *cache = bpf_map_lookup_elem(&rule_cache, &cpu);
	struct ct_proc *proc = bpf_map_lookup_elem(&procs, &tgid);
	if (!pages || !cache) {
		/* never: both maps have an element per possible CPU */
		w->error = CT_WALK_READ_FAULT;
	} else if (proc) {
		struct walk_ctx ctx = { .w = w, .proc = proc, .pages = pages, .rules = cache };
		__u32 n = proc->nmappings;
		w->nmappings = n < CT_MAX_MAPPINGS ? n : CT_MAX_MAPPINGS;
		w->generation = proc->generation;
		/* Each step either stops or adds a frame, and the step that
		 * would add frame CT_MAX_FRAMES + 1 stops with DEPTH_CAP, so
		 * CT_MAX_FRAMES steps always reach a stop: the bound is never
		 * what ends a walk. */
		bpf_loop(CT_MAX_FRAMES / STEPS_PER_CALL + 1, walk_steps, &ctx, 0);
	} else {
		w->error = CT_WALK_NO_PROC;
	}

	if (w->error != CT_WALK_OK &&
	    (current_in_execve() ||
	     (w->error == CT_WALK_NO_PROC && bpf_map_lookup_elem(&loading, &tgid)))) {
		count_error(CT_WALK_IN_EXEC);
		return false;
	}
	count_error(w->error);
	stack->error = w->error;
	stack->reason = w->reason;
	w->hash = finish_stack(stack, w->hash, w->check);
	return true;
}

/*
 * Takes the kernel stack of the event into w->kstack and finishes its
 * hashes, as walk_user_stack does for the user stack; returns its key in
 * the stacks map, or CT_STACK_NONE if the kernel gave none.
 */
static __always_inline __u64 take_kernel_stack(struct walk_scratch *w, void *ctx)
{
	struct ct_stack *k = &w->kstack;
	long bytes = bpf_get_stack(ctx, k->pcs, CT_KSTACK_DEPTH * sizeof(__u64), 0);

	if (bytes <= 0) {
		count_error(CT_WALK_KSTACK_LOST);
		return CT_STACK_NONE;
	}
	__u32 len = bytes / sizeof(__u64);
	__u64 hash = 0, check = 0x2545f4914f6cdd1dULL;
	for (__u32 i = 0; i < CT_KSTACK_DEPTH; i++) {
		if (i >= len)
			break;
		hash = hash_step(hash, k->pcs[i]);
		check = check_step(check, k->pcs[i]);
	}
	k->len = len;
	k->error = CT_WALK_OK;
	k->reason = 0;
	return finish_stack(k, hash, check);
}

static __always_inline void count_event(__u64 stack_hash, __u64 kstack_hash, __u32 tgid,
					__u32 probe_id, __u64 check)
{
	struct ct_count_key key = {
		.stack_hash = stack_hash,
		.kstack_hash = kstack_hash,
		.pid = tgid,
		.probe_id = probe_id,
	};
	struct ct_count *count = bpf_map_lookup_elem(&counts, &key);

	if (!count) {
		struct ct_count first = { .events = 1, .check = check };
		long err = bpf_map_update_elem(&counts, &key, &first, BPF_NOEXIST);
		if (err == 0)
			return;
		if (err == -EEXIST)
			count = bpf_map_lookup_elem(&counts, &key);
		if (!count) {
			count_error(CT_WALK_COUNT_MAP_FULL);
			return;
		}
	}
	__sync_fetch_and_add(&count->events, 1);
}

/* Claims a free nesting level of this CPU (see CT_NEST_LEVELS) in *held;
 * CT_NEST_LEVELS if all are taken. */
static __always_inline __u32 claim_level(__u32 *held)
{
	for (__u32 level = 0; level < CT_NEST_LEVELS; level++) {
		__u32 bit = 1U << level;
		if (!(__sync_fetch_and_or(held, bit) & bit))
			return level;
	}
	return CT_NEST_LEVELS;
}

/*
 * Counts the event with its stacks, using the scratch of level: the user
 * stack walked from rip, rsp, rbp, rdi (none if rip is 0), the kernel stack of
 * kctx (none if NULL). The common case, stacks counted before under the
 * same key, costs one lookup in counts: the count remembers the checks of
 * its stacks, so the stacks map is only consulted for a new stack or a hash
 * collision.
 */
static __always_inline void record_at(__u32 level, void *kctx, __u32 tgid, __u64 rip, __u64 rsp,
				      __u64 rbp, __u64 rdi, __u32 probe_id)
{
	struct walk_scratch *w = bpf_map_lookup_elem(&scratch, &level);

	if (!w) {
		count_event(CT_STACK_NONE, CT_STACK_NONE, tgid, probe_id, 0);
		return;
	}
	__u64 user = CT_STACK_NONE, kernel = CT_STACK_NONE, check = 0;
	if (rip && walk_user_stack(w, level, tgid, rip, rsp, rbp, rdi)) {
		user = w->hash;
		check = w->stack.check;
	}
	if (kctx) {
		kernel = take_kernel_stack(w, kctx);
		if (kernel != CT_STACK_NONE)
			check ^= (w->kstack.check << 17) | (w->kstack.check >> 47);
	}
	struct ct_count_key key = {
		.stack_hash = user,
		.kstack_hash = kernel,
		.pid = tgid,
		.probe_id = probe_id,
	};
	struct ct_count *count = bpf_map_lookup_elem(&counts, &key);
	if (count && count->check == check) {
		__sync_fetch_and_add(&count->events, 1);
		return;
	}
	if (user != CT_STACK_NONE)
		user = store_stack(&w->stack, user);
	if (kernel != CT_STACK_NONE) {
		kernel = store_stack(&w->kstack, kernel);
		if (kernel == CT_STACK_NOT_STORED) {
			count_error(CT_WALK_KSTACK_LOST);
			kernel = CT_STACK_NONE;
		}
	}
	count_event(user, kernel, tgid, probe_id, check);
}

/*
 * Counts the event (see record_at) in a nesting level of its own; without
 * one, without its stacks.
 */
static __always_inline void record(void *kctx, __u32 tgid, __u64 rip, __u64 rsp, __u64 rbp,
				   __u64 rdi, __u32 probe_id)
{
	__u32 zero = 0;
	__u32 *held = rip || kctx ? bpf_map_lookup_elem(&levels, &zero) : NULL;

	if (!held) {
		count_event(CT_STACK_NONE, CT_STACK_NONE, tgid, probe_id, 0);
		return;
	}
	__u32 level = claim_level(held);
	if (level >= CT_NEST_LEVELS) {
		count_error(CT_WALK_TOO_NESTED);
		count_event(CT_STACK_NONE, CT_STACK_NONE, tgid, probe_id, 0);
		return;
	}
	record_at(level, kctx, tgid, rip, rsp, rbp, rdi, probe_id);
	__sync_fetch_and_and(held, ~(1U << level));
}

static __always_inline bool pid_wanted(__u32 tgid)
{
	return bpf_map_lookup_elem(&pid_filter, &tgid) != NULL;
}

/* An event that fired in kernel mode: its kernel stack (unless turned off),
 * and the user registers saved at kernel entry. Kernel threads have none
 * (rip 0: no user stack). */
static __always_inline void record_from_kernel(void *ctx, __u32 tgid, __u32 probe_id)
{
	struct task_struct *task = bpf_get_current_task_btf();
	void *kctx = kernel_stacks ? ctx : NULL;

	if (!task->mm) {
		record(kctx, tgid, 0, 0, 0, 0, probe_id);
		return;
	}
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	__u64 ip = regs->ip;
	/* In rt_sigreturn, rip is past the signal trampoline's last instruction,
	 * the syscall, and so outside its unwind info: walk from the syscall. */
	if (regs->orig_ax == CT_NR_RT_SIGRETURN)
		ip -= CT_SYSCALL_INSN_LEN;
	record(kctx, tgid, ip, regs->sp, regs->bp, regs->di, probe_id);
}

/* uprobe and uretprobe: ctx holds the user registers (at a uretprobe, rip
 * is already the return address and rsp the caller's). */
static __always_inline int on_user_probe(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_uprobes && !pid_wanted(tgid))
		return 0;
	record(NULL, tgid, ctx->ip, ctx->sp, ctx->bp, ctx->di, bpf_get_attach_cookie(ctx));
	return 0;
}

SEC("uprobe")
int on_uprobe(struct pt_regs *ctx)
{
	return on_user_probe(ctx);
}

SEC("uretprobe")
int on_uretprobe(struct pt_regs *ctx)
{
	return on_user_probe(ctx);
}

/* Counts without walking: the baseline the benchmark compares against. */
SEC("uprobe")
int on_uprobe_count(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_uprobes && !pid_wanted(tgid))
		return 0;
	count_event(CT_STACK_NONE, CT_STACK_NONE, tgid, bpf_get_attach_cookie(ctx), 0);
	return 0;
}

SEC("perf_event")
int on_perf_event(struct bpf_perf_event_data *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_events && !pid_wanted(tgid))
		return 0;
	__u32 probe_id = bpf_get_attach_cookie(ctx);
	__u64 ip = ctx->regs.ip;
	if ((__s64)ip < 0)
		/* kernel half of the address space: sampled in kernel mode */
		record_from_kernel(ctx, tgid, probe_id);
	else
		record(NULL, tgid, ip, ctx->regs.sp, ctx->regs.bp, ctx->regs.di, probe_id);
	return 0;
}

SEC("tracepoint")
int on_tracepoint(void *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_events && !pid_wanted(tgid))
		return 0;
	record_from_kernel(ctx, tgid, bpf_get_attach_cookie(ctx));
	return 0;
}

/* kprobe and kretprobe: a kernel function, in the context of some task; its
 * user stack is the one saved at kernel entry. */
SEC("kprobe")
int on_kprobe(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_events && !pid_wanted(tgid))
		return 0;
	record_from_kernel(ctx, tgid, bpf_get_attach_cookie(ctx));
	return 0;
}

SEC("raw_tp")
int on_raw_tracepoint(void *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_events && !pid_wanted(tgid))
		return 0;
	record_from_kernel(ctx, tgid, bpf_get_attach_cookie(ctx));
	return 0;
}

/*
 * Following the traced processes' children. A process forked by a traced one
 * is traced too: it joins the pid filter and starts with a copy of its
 * parent's mappings (which fork copied). Threads are not forks here: they
 * share their process's tgid.
 *
 * An exec replaces the mappings, so the process's are dropped and it is
 * stopped twice for userspace to register the new image's, reported through
 * new_images: right after the exec (the executable, ld.so and the vDSO are
 * mapped), and at libc's __libc_start_main (every library is mapped, main has
 * not run). Userspace continues it each time with SIGCONT.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} new_images SEC(".maps");

/* The parent of each child followed: userspace names what a child ran
 * before its exec with its parent's mappings. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, __u32);   /* child tgid */
	__type(value, __u32); /* parent tgid */
	__uint(max_entries, 16384);
} parents SEC(".maps");

/*
 * Stops the current process until userspace has registered its mappings.
 * The stop is queued before the report is published: userspace may answer
 * with SIGCONT as soon as it sees the report (this task can be preempted in
 * between), and a SIGCONT discards a pending stop, whereas a stop queued
 * after the SIGCONT would never be undone.
 */
static __always_inline void stop_for_mappings(__u32 tgid)
{
	__u32 *slot = bpf_ringbuf_reserve(&new_images, sizeof(*slot), 0);

	if (!slot)
		return; /* userspace finds it by polling, later */
	*slot = tgid;
	bpf_send_signal(CT_SIGSTOP);
	bpf_ringbuf_submit(slot, 0);
}

SEC("raw_tp/sched_process_fork")
int on_fork(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *parent = (struct task_struct *)ctx->args[0];
	struct task_struct *child = (struct task_struct *)ctx->args[1];
	__u32 parent_tgid = BPF_CORE_READ(parent, tgid);
	__u32 child_pid = BPF_CORE_READ(child, pid);
	__u32 child_tgid = BPF_CORE_READ(child, tgid);

	if (child_pid != child_tgid || !pid_wanted(parent_tgid))
		return 0;
	__u8 one = 1;
	bpf_map_update_elem(&pid_filter, &child_tgid, &one, BPF_ANY);
	bpf_map_update_elem(&parents, &child_tgid, &parent_tgid, BPF_ANY);
	struct ct_proc *proc = bpf_map_lookup_elem(&procs, &parent_tgid);
	if (proc)
		bpf_map_update_elem(&procs, &child_tgid, proc, BPF_ANY);
	return 0;
}

SEC("raw_tp/sched_process_exec")
int on_exec(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (!pid_wanted(tgid))
		return 0;
	bpf_map_delete_elem(&procs, &tgid);
	__u8 one = 1;
	bpf_map_update_elem(&loading, &tgid, &one, BPF_ANY);
	stop_for_mappings(tgid);
	return 0;
}

/*
 * Where a traced process stops once new libraries are mapped, so that
 * userspace registers them before they run (see stop_for_mappings). A uprobe
 * in every process, on ld.so's _dl_debug_state (the cookie: _r_debug's
 * address minus _dl_debug_state's) or on libc's __libc_start_main (the
 * cookie CT_START_MAIN_COOKIE). ld.so calls _dl_debug_state when it starts
 * adding or removing objects and when the link map is consistent again: at
 * start-up after the libraries are mapped and before their constructors
 * run, and after each dlopen and dlclose. __libc_start_main catches a child
 * whose ld.so was not probed.
 */
SEC("uprobe")
int on_start_main(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (!pid_wanted(tgid))
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	if (cookie != CT_START_MAIN_COOKIE) {
		__u32 state;
		if (bpf_probe_read_user(&state, sizeof(state),
					(void *)(ctx->ip + cookie + CT_R_DEBUG_STATE)) ||
		    state != CT_RT_CONSISTENT)
			return 0;
		bpf_map_delete_elem(&loading, &tgid);
		stop_for_mappings(tgid);
		return 0;
	}
	if (bpf_map_delete_elem(&loading, &tgid) == 0 || !bpf_map_lookup_elem(&procs, &tgid))
		stop_for_mappings(tgid);
	return 0;
}
