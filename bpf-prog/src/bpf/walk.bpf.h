/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The user stack walker, included by trace.bpf.c: docs/walk.md executed over
 * the unwind tables userspace loaded (the userspace twin is
 * unwind_tables::walk). walk_user_stack() walks from a thread's registers
 * into a struct walk_state and says how the walk ended (w->error, an enum
 * ct_walk_end); storing and counting the stack is the includer's business.
 *
 * Per frame, no helper call: the rule comes from a per-CPU cache keyed by the
 * address (rule_cache) or, on a miss, from the mapping (the previous frame's
 * tried first) and a branch-free binary search of the rows of its 64 KiB
 * page, and reads are served from pages of stack copied once per walk
 * (page_cache): one bpf_probe_read_user costs ~90 ns where the kernel
 * mitigates return speculation, about as much as the rest of a frame.
 */
#ifndef WALK_BPF_H
#define WALK_BPF_H

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

/* See struct ct_file_key. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ct_file_key);
	__type(value, struct ct_file_object);
	__uint(max_entries, 16384);
} file_objects SEC(".maps");

/*
 * The walk's state, and the stack it builds. The includer keeps it in a map
 * rather than on the BPF stack for two reasons: a ct_stack does not fit in
 * 512 bytes of stack, and values loaded from a map are unknown to the
 * verifier, so it checks one iteration of the walk for every frame count
 * instead of simulating CT_MAX_FRAMES iterations with a known counter.
 * One per nesting level of each CPU (see CT_NEST_LEVELS): programs do
 * interrupt each other's walks.
 */
struct walk_state {
	struct ct_stack stack;	       /* stack.len counts the frames found so far */
	__u64 page_tag[CT_PAGE_SLOTS]; /* user page number + 1 held by each slot; 0: none */
	__u16 page_lo[CT_PAGE_SLOTS];  /* the slot holds bytes [page_lo, page end) of it, from 0 */
	__u32 use_rule_cache;	       /* level 0 only: see CT_NEST_LEVELS */
	struct ct_rule rule;	       /* the rule of the current step, when not from the cache */
	__u64 pc; /* the current frame's runtime address */
	__u64 rsp;
	__u64 rbp;
	__u64 hash;  /* of the frames named so far (see name_frame) */
	__u64 check;
	__u32 named; /* frames named: stack.pcs[named..] still hold runtime addresses */
	__u32 start_trap; /* the thread entered the kernel by an exception without an
			   * error code (orig_ax -1): maybe a breakpoint's trap (see
			   * after_breakpoint) */
	__u32 nmappings;
	__u32 mapping; /* index of the mapping of the previous pc: tried first */
	__u32 exact;   /* pc is a current pc, not a return address */
	__u32 generation; /* of the process's mappings (ct_proc.generation) */
	__u64 rdi;	  /* the thread's: known at the first frame (stack.len 1) only */
	struct ct_mapping unregistered; /* the last unregistered_mapping found (end 0: none) */
	struct ct_file_key vma_key;	/* unregistered_mapping's, for its map lookup */
	__u32 vma_found;		/* unregistered_mapping's: the VMA's file is known */
	__u32 vma_pad;
	__u64 trampoline; /* the process's uretprobe trampoline (see uretprobe_return); 0: none */
	__u16 error;  /* enum ct_walk_end, once the walk stopped */
	__u16 reason; /* for CT_WALK_UNSUPPORTED: the row's ct_rule.reason */
	/* The registers the walk starts from, the thread's: take_user_stack's
	 * caller puts them here (a global function takes five arguments). */
	__u64 start_rip;
	__u64 start_rsp;
	__u64 start_rbp;
	__u64 start_rdi;
	/*
	 * What the walk memo (memo.bpf.h) needs to know of the walk: every
	 * word read (see log_read; distances from start_rsp), and whether the
	 * walk depended on anything else than its start, its process's
	 * mappings and those words.
	 */
	__u32 nwords;			/* words read */
	__u16 unfit;			/* it used more than its start and words (see memo.bpf.h) */
	__u16 uses_rbp;			/* it used the thread's rbp */
	__u64 rbp_from_regs;		/* rbp is still the thread's, not read from the stack */
	__u64 distances[CT_MEMO_WORDS]; /* of each word read, in bytes above start_rsp */
	__u64 values[CT_MEMO_WORDS];
	__u32 forgotten[4]; /* see forget_range */
	/* What the memo's callbacks find (see struct memo_words). */
	__u64 memo_changed;
	__u32 memo_from; /* memo_answer's: the words its buffer holds */
	__u32 memo_to;
	__u32 memo_candidates; /* memo_answer's: the ways whose start matched */
	__u32 memo_first_way;  /* the first of them */
	__u64 memo_key; /* memo_answer's: the key found */
	__u64 memo_reach;
	__u64 memo_lowest;
	__u64 memo_highest;
};

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
 * Frames walked per bpf_loop iteration, in one call of walk_some. Each
 * iteration is a call and a return of the callback, and walk_some's call
 * another; returns are expensive where the kernel mitigates return-address
 * speculation (SRSO safe RET here). walk_some is a global function: the
 * verifier checks its steps once, on their own, where inside the callback it
 * checked them until the callback's state converged, pruning only on states
 * whose every register was within an earlier one's range (on Linux 6.18:
 * 250K instructions a walking program, 18K now; four steps a call would be
 * 58K, for the same time per frame: benches/walk.rs, 13.0-13.4 ns).
 */
#define STEPS_PER_CALL 2

/*
 * What bpf_loop passes to each step (it must live on the BPF stack): the
 * walk's state, the process's mappings, and this walk's page slots and
 * this CPU's rule cache, looked up once per walk rather than once a frame.
 */
struct walk_ctx {
	struct walk_state *w;
	struct ct_proc *proc;
	struct ct_user_pages *pages;
	struct ct_rule_cache *rules;
};

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
	__u64 mask = value >> 63;
	/* and hide that it is 0 or ~0: clang would make a select of it */
	asm volatile("" : "+r"(mask));
	return mask;
}

/*
 * v as the verifier sees a value loaded from memory: any. A search that
 * may end at any of its steps leaves its result with another range after
 * each, and the verifier, which keeps an index it must bound precise,
 * checked the rest of the walk step once for each way out (on Linux 6.18,
 * most of a million instructions). One store and one load; slot tells
 * apart values live at once.
 */
static __always_inline __u32 forget_range(struct walk_state *w, __u32 slot, __u32 v)
{
	volatile __u32 *at = &w->forgotten[slot & 3];

	*at = v;
	return *at;
}

/* Index of the mapping holding addr, or CT_MAX_MAPPINGS if none does. */
static __always_inline __u32 find_mapping(struct walk_state *w, struct ct_proc *proc, __u32 n,
					  __u64 addr)
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
	lo = forget_range(w, 0, lo);
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
static __always_inline __s64 find_rule(struct walk_state *w, struct ct_table *t, __u64 addr,
				       __u32 *row_offset)
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
	lo = forget_range(w, 0, lo);
	rule = forget_range(w, 1, rule);
	row_lo = forget_range(w, 2, row_lo);
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
 * Stores the current frame (the last of w->stack, at w->pc) as it is kept
 * (see CT_FRAME_IN_OBJECT): the ELF address in object, which the mapping
 * with this bias holds, or the runtime address where object is 0 or the
 * address does not fit. Adds it to the hashes: a stack's key is that of its
 * frames as stored, the same in every process running the same code.
 */
static __always_inline void name_frame(struct walk_state *w, __u32 object, __u64 bias)
{
	__u64 frame = w->pc;
	__u64 address = frame - bias;

	if (object && object < CT_MAX_OBJECTS && address < 1ULL << CT_FRAME_OBJECT_SHIFT)
		frame = CT_FRAME_IN_OBJECT | (__u64)object << CT_FRAME_OBJECT_SHIFT | address;
	__u32 len = w->stack.len;
	w->stack.pcs[(len - 1) & (CT_MAX_FRAMES - 1)] = frame;
	w->hash = hash_step(w->hash, frame);
	w->check = check_step(w->check, frame);
	w->named = len;
}

/* bpf_find_vma's callback: the VMA holding an address, as a mapping in
 * w->unregistered (w->vma_found set) if userspace loaded its file
 * (file_objects). Its context is w alone, and its reads are BTF loads, not
 * probe-read helpers through the stack: both frames are under the walk's,
 * in the BPF stack's 512 bytes. */
static long read_vma_file(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct walk_state *w = *(struct walk_state **)data;
	struct file *file = vma->vm_file;

	if (!file)
		return 0;
	struct inode *inode = file->f_inode;
	w->vma_key.pgoff = vma->vm_pgoff;
	w->vma_key.inode = inode->i_ino;
	w->vma_key.dev = inode->i_sb->s_dev;
	struct ct_file_object *o = bpf_map_lookup_elem(&file_objects, &w->vma_key);
	if (!o)
		return 0;
	w->unregistered.start = vma->vm_start;
	w->unregistered.end = vma->vm_end;
	w->unregistered.bias = vma->vm_start + o->bias_from_start;
	w->unregistered.table_id = o->table_id;
	w->unregistered.flags = o->flags;
	w->unregistered.object = o->object;
	w->vma_found = 1;
	return 0;
}

/*
 * The mapping holding addr in the current process when none registered for
 * it does (a library ld.so maps and runs before the link map is consistent,
 * the moment userspace registers it): the kernel's VMA of addr, if userspace
 * loaded its file (file_objects). Written to w->unregistered; 0 if there is
 * none. A global function: it runs on a walk's way out only, and the
 * verifier checks it once rather than at every way a step reaches it.
 */
__noinline int unregistered_mapping(struct walk_state *w, __u64 addr)
{
	struct walk_state *search = w;

	if (!w)
		return 0;
	w->vma_found = 0;
	/* mmap_lock is only tried: a walk never waits (-EBUSY is no mapping) */
	if (bpf_find_vma(bpf_get_current_task_btf(), addr, read_vma_file, &search, 0))
		return 0;
	return w->vma_found;
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
static __always_inline struct ct_rule *rule_for(struct walk_state *w, struct ct_proc *proc,
						struct ct_rule_cache *cache, __u64 lookup)
{
	__u32 generation = w->generation;
	struct ct_rule_cache_entry *entry = NULL;

	if (w->use_rule_cache) {
		__u32 slot = ((lookup ^ ((__u64)generation << 40)) * 0x9e3779b97f4a7c15ULL) >> 52;
		entry = &cache->entries[slot & (CT_RULE_CACHE_SLOTS - 1)];
		if (entry->addr == lookup && entry->generation == generation) {
			name_frame(w, entry->object, entry->bias);
			/* a copy: one kind of pointer out of here, for the verifier
			 * one state to go on with rather than two */
			w->rule = entry->rule;
			return &w->rule;
		}
	}

	__u32 mi = w->mapping & (CT_MAX_MAPPINGS - 1);
	struct ct_mapping *m = &proc->mappings[mi];
	if (lookup < m->start || lookup >= m->end) {
		mi = find_mapping(w, proc, w->nmappings, lookup);
		if (mi < CT_MAX_MAPPINGS) {
			m = &proc->mappings[mi];
			w->mapping = mi;
		} else {
			/* the last one found first: bpf_find_vma may answer once
			 * per interrupt only (its unlock waits for irq_work) */
			m = &w->unregistered;
			if ((lookup < m->start || lookup >= m->end) &&
			    !unregistered_mapping(w, lookup))
				m = NULL;
			if (!m) {
				name_frame(w, 0, 0);
				w->error = CT_WALK_NO_MAPPING;
				return NULL;
			}
			/* not cached, nor the walk remembered: the registered
			 * mappings' generation says nothing of it */
			entry = NULL;
			w->unfit = 1;
		}
	}
	name_frame(w, m->object, m->bias);
	__u32 table_id = m->table_id;
	struct ct_table *t = bpf_map_lookup_elem(&tables, &table_id);
	if ((m->flags & CT_MAPPING_NO_TABLE) || !t) {
		w->error = CT_WALK_NO_ROW;
		return NULL;
	}
	__u32 row_offset = 0;
	__s64 found = find_rule(w, t, lookup - m->bias, &row_offset);
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
		entry->object = m->object;
		entry->bias = m->bias;
	}
	return &w->rule;
}

/*
 * Adds a word read to the walk's log, for the memo: no branch, a few
 * instructions a read (the memo sorts out what fits when it remembers).
 * Past CT_MEMO_WORDS reads the log wraps, and the walk is not remembered.
 */
static __always_inline void log_read(struct walk_state *w, __u64 addr, __u64 value)
{
	__u32 n = w->nwords;

	w->distances[n & (CT_MEMO_WORDS - 1)] = addr - w->start_rsp;
	w->values[n & (CT_MEMO_WORDS - 1)] = value;
	w->nwords = n + 1;
}

/*
 * Reads the u64 at user address addr through the page cache. Equivalent to
 * bpf_probe_read_user of those 8 bytes: a copy succeeds exactly when the
 * bytes it takes are mapped, readable and present, and it never leaves the
 * page of addr. Returns 0 on success. Every aligned word read is logged
 * (log_read); a misaligned one keeps the walk out of the memo.
 */
static __always_inline int read_user(struct walk_state *w, struct ct_user_pages *pages,
				     __u64 addr, __u64 *value)
{
	if (addr & (sizeof(__u64) - 1)) {
		/* misaligned (stack slots never are), maybe across two pages:
		 * read directly. Aligned, the word is one of its page's. */
		w->unfit = 1;
		return bpf_probe_read_user(value, sizeof(*value), (void *)addr);
	}

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
	log_read(w, addr, *value);
	return 0;
}

/*
 * Uretprobes, the session's own or anyone's, replace the return address of
 * the function they probe with the address of a trampoline in the process's
 * [uprobes] page while the function runs, and keep the original in the
 * thread's list of return instances, innermost first, each with the stack
 * address the return address was read from. A walk that meets the
 * trampoline, as a return address or as the pc of an event taken in it (the
 * uretprobe system call, a sample on its way back), takes the original.
 */
#define CT_URETPROBE_DEPTH 8 /* return instances searched */
#define CT_XOL_AREA_SIZE 4096 /* the [uprobes] page */
#define CT_XOL_SLOT_SIZE 128  /* a slot of it; the trampoline's is the first */

/* The uretprobe trampoline of the current process, 0 if it has none. */
static __always_inline __u64 uretprobe_trampoline(void)
{
	struct task_struct *task = bpf_get_current_task_btf();

	if (!bpf_core_field_exists(task->utask))
		return 0;
	/* BTF loads, not probe-read helpers: this runs at every walk */
	struct mm_struct *mm = task->mm;
	if (!mm)
		return 0;
	struct xol_area *area = mm->uprobes_state.xol_area;
	return area ? area->vaddr : 0;
}

/* The current thread's uprobe state: asked only where its process has a
 * [uprobes] page, so where the kernel has the field. A BTF load: a fault
 * reads 0. */
static __always_inline struct uprobe_task *current_utask(void)
{
	return bpf_get_current_task_btf()->utask;
}

/*
 * The return address a uretprobe replaced in the stack slot at `slot` (any
 * slot if 0: the innermost, for a pc in the trampoline), and the slot in
 * *found; 0 if no return instance of the current thread holds it. A global
 * function: it runs only on a trampoline, and is verified once.
 */
__noinline __u64 uretprobe_return(__u64 slot, __u64 *found)
{
	/* BTF loads (a fault reads 0), not probe-read helpers through the stack:
	 * its frame is under the walk's */
	struct uprobe_task *utask = current_utask();
	struct return_instance *ri = utask ? utask->return_instances : NULL;

	for (int i = 0; i < CT_URETPROBE_DEPTH && ri; i++) {
		__u64 stack = ri->stack;
		if (!slot || stack == slot) {
			if (found)
				*found = stack;
			return ri->orig_ret_vaddr;
		}
		ri = ri->next;
	}
	return 0;
}

/*
 * A uprobe's instruction runs out of line: copied to a slot of the process's
 * [uprobes] page (the trampoline's is its first) and single-stepped there,
 * with the registers it has at the probed address. The address in the
 * probed code a pc in the current thread's slot stands for; 0 if pc is not
 * in it.
 */
static __always_inline __u64 uprobe_stepped_from(__u64 pc)
{
	struct uprobe_task *utask = current_utask();

	if (!utask)
		return 0;
	/* set, with vaddr, before rip is moved to the slot, and until the
	 * step is done */
	__u64 slot = utask->xol_vaddr;
	if (!slot || pc - slot >= CT_XOL_SLOT_SIZE)
		return 0;
	return utask->vaddr + (pc - slot);
}

/*
 * Whether the thread's pc follows a breakpoint: a uprobe's int3 traps with
 * rip past it, and the kernel sets rip back to the probed address only once
 * it has found the uprobe. The stack is as it was at the int3. Asked only
 * of a walk that stopped at its first frame with no row or no mapping (the
 * probe on a function's last byte, a one-byte ret: rip is past the
 * function), so a pc that merely follows a 0xcc byte can only gain frames
 * it would not have had.
 */
static __always_inline bool after_breakpoint(__u64 pc)
{
	__u8 byte = 0;

	return !bpf_probe_read_user(&byte, sizeof(byte), (void *)(pc - 1)) && byte == 0xcc;
}

static __always_inline int stop(struct walk_state *w, __u16 error)
{
	w->error = error;
	return 1;
}

/* One step of docs/walk.md: from the frame at w->pc to its caller. */
static __always_inline int walk_step(struct walk_state *w, struct ct_proc *proc,
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
		w->uses_rbp |= w->rbp_from_regs;
		cfa = rbp + (__s64)rule->cfa_off;
		break;
	case CT_RULE_PLT:
		cfa = rsp + 8 + ((w->pc & 15) >= (__u64)rule->cfa_off ? 8 : 0);
		break;
	case CT_RULE_CFA_DEREF: {
		__u64 from_rbp = rule->cfa_reg == CT_REG_RBP;
		/* no branch: one more would double the paths the verifier checks */
		w->uses_rbp |= w->rbp_from_regs & from_rbp;
		__u64 base = from_rbp ? rbp : rsp;
		if (read_user(w, pages, base + (__s64)rule->cfa_off, &cfa))
			return stop(w, CT_WALK_READ_FAULT);
		cfa += (__s64)(__s32)rule->cfa_arg;
		break;
	}
	case CT_RULE_END:
		return stop(w, CT_WALK_COMPLETE);
	case CT_RULE_RETURN_IN_RDI:
		/* the return address left the stack: the caller's rsp may be
		 * this frame's, so no growth check */
		if (w->stack.len != 1) {
			w->reason = CT_UNSUPPORTED_RETURN_ADDRESS;
			return stop(w, CT_WALK_UNSUPPORTED);
		}
		ra = w->rdi;
		cfa = rsp + (__s64)rule->cfa_off;
		w->unfit = 1;
		goto push;
	case CT_RULE_SIGNAL:
		/* rip, rsp and rbp of the interrupted code, from the ucontext */
		if (read_user(w, pages, rsp + CT_SIGFRAME_RIP, &ra) ||
		    read_user(w, pages, rsp + CT_SIGFRAME_RSP, &cfa) ||
		    read_user(w, pages, rsp + CT_SIGFRAME_RBP, &rbp))
			return stop(w, CT_WALK_READ_FAULT);
		w->rbp_from_regs = 0;
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
	if (ra == w->trampoline && ra) {
		ra = uretprobe_return(cfa - 8, NULL);
		w->unfit = 1;
	}
	if (rule->rbp_kind == CT_RBP_AT_CFA) {
		if (read_user(w, pages, cfa + (__s64)rule->rbp_off, &rbp))
			return stop(w, CT_WALK_READ_FAULT);
		w->rbp_from_regs = 0;
	} else if (rule->rbp_kind == CT_RBP_AT_RBP) {
		w->uses_rbp |= w->rbp_from_regs;
		if (read_user(w, pages, rbp + (__s64)rule->rbp_off, &rbp))
			return stop(w, CT_WALK_READ_FAULT);
		w->rbp_from_regs = 0;
	}
	if (cfa <= rsp)
		return stop(w, CT_WALK_BAD_RA);

push:
	if (ra == 0)
		return stop(w, CT_WALK_BAD_RA);
	__u32 len = w->stack.len;
	if (len >= CT_MAX_FRAMES)
		return stop(w, CT_WALK_DEPTH_CAP);
	/* stored as the next step names it */
	w->stack.pcs[len & (CT_MAX_FRAMES - 1)] = ra;
	w->stack.len = len + 1;
	w->pc = ra;
	w->rsp = cfa;
	w->rbp = rbp;
	w->exact = exact;
	return 0;
}

/* Up to STEPS_PER_CALL steps; 1 once the walk stopped. A global function:
 * see STEPS_PER_CALL. */
__noinline int walk_some(struct walk_state *w, struct ct_proc *proc, struct ct_user_pages *pages,
			 struct ct_rule_cache *cache)
{
	if (!w || !proc || !pages || !cache)
		return 1;
	for (int i = 0; i < STEPS_PER_CALL; i++)
		if (walk_step(w, proc, pages, cache))
			return 1;
	return 0;
}

/* bpf_loop callback: walk_some's steps; 1 once the walk stopped. */
static int walk_steps(__u32 index, void *arg)
{
	struct walk_ctx *ctx = arg;

	return walk_some(ctx->w, ctx->proc, ctx->pages, ctx->rules) & 1;
}

/* Sets w up to walk from pc, with the thread's registers from w->start_*. */
static __always_inline void start_walk(struct walk_state *w, __u64 pc)
{
	struct ct_stack *stack = &w->stack;

	stack->pcs[0] = pc;
	stack->len = 1;
	w->pc = pc;
	w->rsp = w->start_rsp;
	w->rbp = w->start_rbp;
	w->hash = 0;
	w->check = 0x5851f42d4c957f2dULL;
	w->named = 0;
	w->mapping = 0;
	w->unregistered.start = 0;
	w->unregistered.end = 0;
	w->exact = 1;
	w->rdi = w->start_rdi;
	w->error = CT_WALK_COMPLETE;
	w->reason = 0;
	w->nwords = 0;
	w->unfit = 0;
	w->uses_rbp = 0;
	w->rbp_from_regs = 1;
}

/*
 * Walks the user stack of the current process, whose mappings proc holds
 * (NULL: none registered), from the given registers into w, using the page
 * slots of nesting level `level` (and the rule cache at level 0);
 * trampoline is the process's uretprobe_trampoline(). w->stack holds the
 * frames found (stored as CT_FRAME_IN_OBJECT says), w->error how the walk
 * ended (an enum ct_walk_end), w->reason the reason of an unsupported row,
 * and w->hash and w->check the two hashes of the frames, unfinished (see
 * finish_hashes).
 */
static __always_inline void walk_user_stack(struct walk_state *w, __u32 level,
					    struct ct_proc *proc, __u64 trampoline)
{
	__u64 rip = w->start_rip;
	struct ct_stack *stack = &w->stack;

	for (int slot = 0; slot < CT_PAGE_SLOTS; slot++)
		w->page_tag[slot] = 0;
	w->use_rule_cache = level == 0;
	w->trampoline = trampoline;
	start_walk(w, rip);
	if (trampoline && rip - trampoline < CT_XOL_SLOT_SIZE) {
		/* In the trampoline, the probed function has returned: the event
		 * is its caller's, at the return address, with the stack as the
		 * caller had it. */
		__u64 slot = 0;
		__u64 ret = uretprobe_return(0, &slot);
		if (ret) {
			stack->pcs[0] = ret;
			w->pc = ret;
			w->rsp = slot + 8;
			w->exact = 0;
		}
		w->unfit = 1;
	} else if (trampoline && rip - trampoline < CT_XOL_AREA_SIZE) {
		__u64 probed = uprobe_stepped_from(rip);
		if (probed) {
			stack->pcs[0] = probed;
			w->pc = probed;
		}
		w->unfit = 1;
	}

	__u32 cpu = bpf_get_smp_processor_id();
	__u32 pages_key = cpu * CT_NEST_LEVELS + level;
	struct ct_user_pages *pages = bpf_map_lookup_elem(&page_cache, &pages_key);
	struct ct_rule_cache *cache = bpf_map_lookup_elem(&rule_cache, &cpu);
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
		if (w->start_trap && stack->len == 1 && w->pc == rip &&
		    (w->error == CT_WALK_NO_ROW || w->error == CT_WALK_NO_MAPPING) &&
		    after_breakpoint(rip)) {
			/* at the breakpoint, which the kernel has not set rip
			 * back to yet */
			start_walk(w, rip - 1);
			w->unfit = 1;
			bpf_loop(CT_MAX_FRAMES / STEPS_PER_CALL + 1, walk_steps, &ctx, 0);
		}
	} else {
		w->error = CT_WALK_NO_PROC;
	}
	/* Every step names its frame before it can stop: only a walk that never
	 * stepped (no process) leaves its one frame as it was read. */
	if (w->named < stack->len)
		name_frame(w, 0, 0);
	stack->error = w->error;
	stack->reason = w->reason;
}

#endif /* WALK_BPF_H */
