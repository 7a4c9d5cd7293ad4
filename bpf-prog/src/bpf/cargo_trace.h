/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Every byte layout shared by the BPF programs and userspace.
 *
 * bpf-prog/src/layout.rs mirrors each struct here and asserts, at compile
 * time, that its size and field offsets equal those of the types libbpf-cargo
 * generates from this header's BTF, so a change on one side that is not made
 * on the other fails the build. Keep fields naturally aligned and padding
 * explicit.
 *
 * Unwind tables (compiled by the unwind-tables crate from .eh_frame):
 *   mapping (pid, address) -> table id + load bias
 *   table id -> ct_table { where its pages, rows and rules start }
 *   (pc - bias) >> 16 - first_page -> ct_page { first row, row count }
 *   binary search on the low 16 bits of the rows of that page; when no row of
 *   the page starts at or before pc, the row before the page's first governs.
 *   row -> rule index -> ct_rule { how to find the CFA, RBP and return address }
 *   A CT_RULE_CFA_RSP_STEPS rule also takes pc's offset past its row's start.
 * The walk itself is specified in docs/walk.md.
 */
#ifndef CARGO_TRACE_H
#define CARGO_TRACE_H

/*
 * Constants are enum members rather than #defines so that they reach the
 * object's BTF (see the anchors in trace.bpf.c), and from there the generated
 * skeleton that layout.rs checks its mirrors against.
 */
enum ct_limits {
	CT_MAX_FRAMES = 512,
	CT_MAX_MAPPINGS = 512,
	CT_PAGE_SHIFT = 16,
	CT_KSTACK_DEPTH = 127,
	/*
	 * The rows map holds chunks of rows rather than single rows: array map
	 * elements are padded to 8 bytes, so a 4-byte element would waste half
	 * the map, while a 4 KiB chunk has no padding and the mmapped map is
	 * one flat array of rows that userspace fills with memcpy.
	 */
	CT_ROWS_PER_CHUNK = 1024,
	/* Binary search steps: ceil(log2(n + 1)) for the largest n. */
	CT_ROW_SEARCH_STEPS = 17,     /* a 64 KiB page holds at most 65536 rows */
	CT_MAPPING_SEARCH_STEPS = 10, /* CT_MAX_MAPPINGS mappings */
	/* Slots tried after a stack hash collision (hash, hash + 1, ...). */
	CT_STACK_SLOTS = 4,
	/*
	 * The walk copies the user stack into a per-CPU cache of CT_PAGE_SLOTS
	 * slots, one page each (an element of the page_cache map holds the
	 * slots of one walk): one bpf_probe_read_user costs ~90 ns on the machines
	 * measured, about as much as the rest of a frame, so one copy must
	 * serve many frames. A copy runs from a 64-byte boundary CT_READ_BELOW
	 * bytes or less under the address read to the end of its page: the
	 * walk climbs the stack, and a frame's saved registers lie a little
	 * under its return address.
	 */
	CT_USER_PAGE_SIZE = 4096,
	CT_PAGE_SLOTS = 8,
	CT_READ_BELOW = 64,
	/*
	 * Walks in progress at once on one CPU. A uprobe program runs
	 * preemptible, with interrupts on: a perf event program (or, where the
	 * kernel preempts, another task's uprobe program) may walk while it
	 * is paused mid-walk. Each walk claims a level of its own, with its
	 * own scratch and page slots (the page_cache map has an element per
	 * level per possible CPU); only level 0 uses and fills
	 * the rule cache, so that no two walks ever write it at once.
	 */
	CT_NEST_LEVELS = 4,
	/*
	 * Rules found for (mappings generation, address), cached per CPU
	 * across events (an element of the rule_cache map per possible CPU):
	 * profiles see the same return addresses over and over, and a
	 * hit replaces the mapping search, the page lookup and the binary
	 * search of a frame. A set of mappings and its tables never change
	 * once registered, so entries never go stale.
	 */
	CT_RULE_CACHE_SLOTS = 4096,
	/*
	 * Stacks found stored, cached per CPU (an element of the known_cache
	 * map per possible CPU), direct-mapped by key: an event whose stacks
	 * were seen before, the common case, finds them with an array lookup
	 * instead of a hash map's.
	 */
	CT_KNOWN_CACHE_SLOTS = 4096,
	/*
	 * The steps of a CT_RULE_CFA_RSP_STEPS row lie 1..CT_STEP_WINDOW bytes
	 * past its start, all in the row's own 64 KiB page; row offsets are
	 * capped at this, and a row from an earlier page is that far behind.
	 */
	CT_STEP_WINDOW = 16,
	/*
	 * Walks remembered per CPU (an element of the walk_memo map per possible
	 * CPU; see memo.bpf.h): CT_MEMO_SETS sets of CT_MEMO_WAYS entries, a
	 * set chosen by the walk's start (tgid, rip, rsp), each entry with the
	 * words of user stack its walk read, at most CT_MEMO_WORDS of them
	 * (a 64-frame walk reads 64 to 128) within CT_MEMO_SPAN_WORDS words
	 * (the page_cache element an answer reads them into) starting less
	 * than CT_MEMO_REACH words above rsp (offsets are 16-bit).
	 */
	CT_MEMO_SETS = 16,
	CT_MEMO_WAYS = 4,
	CT_MEMO_WORDS = 256,
	CT_MEMO_SPAN_WORDS = CT_USER_PAGE_SIZE * CT_PAGE_SLOTS / 8,
	CT_MEMO_REACH = 1 << 16,
};

/* The child-following uprobe (on_start_main) and glibc's struct r_debug. */
#define CT_START_MAIN_COOKIE 0xffffffffffffffffULL /* on __libc_start_main */
#define CT_R_DEBUG_STATE 24			   /* offsetof(struct r_debug, r_state) */
#define CT_RT_CONSISTENT 0

/* unwind_tables::UnsupportedReason::ReturnAddress, the reason a walk gives
 * for a CT_RULE_RETURN_IN_RDI row past its first frame. */
#define CT_UNSUPPORTED_RETURN_ADDRESS 5

/*
 * How a user frame is stored (ct_stack.pcs): where the walker found the
 * mapping holding it, as the ELF address in that mapping's object,
 *   CT_FRAME_IN_OBJECT | object << CT_FRAME_OBJECT_SHIFT | (pc - bias),
 * with object the mapping's ct_mapping.object (1 .. CT_MAX_OBJECTS - 1);
 * otherwise (no mapping, an object without an id, an ELF address of
 * CT_FRAME_OBJECT_SHIFT bits or more) as the runtime address itself, which
 * has the top bit clear. A stack is then the same, and hashed the same, in
 * every process that runs the same code, wherever ASLR put it: the kernel
 * and userspace keep one copy of it however many processes met it.
 */
#define CT_FRAME_IN_OBJECT (1ULL << 63)
enum ct_frame {
	CT_FRAME_OBJECT_SHIFT = 48,
	CT_MAX_OBJECTS = 1 << 15,
};

/* Reserved values of ct_count_key.stack_hash; stored stacks have keys >= CT_STACK_FIRST. */
enum ct_stack_key {
	CT_STACK_NONE = 0,	 /* no user stack was walked (kernel thread, counting probe) */
	CT_STACK_NOT_STORED = 1, /* walked, but CT_STACK_SLOTS colliding stacks held its keys */
	CT_STACK_FIRST = 2,
};

/* Rule kinds. Keep in sync with unwind_tables::Rule (see layout.rs). */
enum ct_rule_kind {
	CT_RULE_GAP = 0,	 /* no CFI covers this address */
	CT_RULE_CFA_RSP = 1,	 /* CFA = rsp + cfa_off */
	CT_RULE_CFA_RBP = 2,	 /* CFA = rbp + cfa_off */
	CT_RULE_PLT = 3,	 /* CFA = rsp + 8 + ((rip & 15) >= cfa_off ? 8 : 0) */
	CT_RULE_CFA_DEREF = 4,	 /* CFA = *(reg(cfa_reg) + cfa_off) + deref_add */
	CT_RULE_END = 5,	 /* return address undefined: outermost frame */
	CT_RULE_SIGNAL = 6,	 /* signal trampoline: ucontext at rsp */
	CT_RULE_UNSUPPORTED = 7, /* CFI this unwinder must not guess at */
	/*
	 * Pushes and pops merged into one row: CFA = rsp + cfa_off + 8 * (pushes
	 * - pops at or before pc), where bit k of cfa_arg's low (pushes) or high
	 * (pops) half is a step at row start + k + 1. See steps_moved.
	 */
	CT_RULE_CFA_RSP_STEPS = 8,
	/* Return address in rdi (glibc's vfork), CFA = rsp + cfa_off, rbp
	 * unchanged: known at the walk's first frame only. */
	CT_RULE_RETURN_IN_RDI = 9,
};

/* DWARF register numbers for the registers a rule may name. */
enum ct_reg {
	CT_REG_RBP = 6,
	CT_REG_RSP = 7,
};

enum ct_rbp_kind {
	CT_RBP_SAME = 0,   /* rbp is unchanged in the caller */
	CT_RBP_AT_CFA = 1, /* caller's rbp = *(CFA + rbp_off) */
	CT_RBP_AT_RBP = 2, /* caller's rbp = *(rbp + rbp_off) (DRAP frames) */
};

/* struct ucontext_t offsets at rsp inside __restore_rt (x86-64). */
enum ct_sigframe {
	CT_SIGFRAME_RBP = 120,
	CT_SIGFRAME_RSP = 160,
	CT_SIGFRAME_RIP = 168,
};

struct ct_rule {
	__u8 kind;     /* enum ct_rule_kind */
	__u8 cfa_reg;  /* enum ct_reg, for CT_RULE_CFA_DEREF */
	__u8 rbp_kind; /* enum ct_rbp_kind */
	__u8 reason;   /* unwind_tables::UnsupportedReason, for CT_RULE_UNSUPPORTED */
	__s32 cfa_off;
	__s32 rbp_off;
	/* CT_RULE_CFA_DEREF: added to the word read (as __s32);
	 * CT_RULE_CFA_RSP_STEPS: pushes (bits 0-15) and pops (bits 16-31) */
	__u32 cfa_arg;
};

/* One row: low 16 bits of its start address, and its rule index in the table. */
struct ct_row {
	__u16 addr_lo;
	__u16 rule;
};

/* One element of the rows map: rows [i * CT_ROWS_PER_CHUNK, (i + 1) * ...). */
struct ct_row_chunk {
	struct ct_row rows[CT_ROWS_PER_CHUNK];
};

/* The end of one page of user stack, from an offset the walk keeps
 * (walk_scratch.page_lo). */
struct ct_user_page {
	__u64 words[CT_USER_PAGE_SIZE / 8];
};

/* One element of the page_cache map: the page slots of one walk (one
 * nesting level of one CPU), all behind one lookup per walk. */
struct ct_user_pages {
	struct ct_user_page slots[CT_PAGE_SLOTS];
};

struct ct_rule_cache_entry {
	__u64 addr;	  /* runtime address looked up */
	__u32 generation; /* ct_proc.generation of the mappings it was found in; 0: empty */
	__u32 object;	  /* ct_mapping.object of the mapping holding addr */
	__u64 bias;	  /* ct_mapping.bias of that mapping */
	struct ct_rule rule; /* the rule at addr (never CT_RULE_CFA_RSP_STEPS) */
};

/* One element of the rule_cache map: one CPU's cache, behind one lookup
 * per walk. */
struct ct_rule_cache {
	struct ct_rule_cache_entry entries[CT_RULE_CACHE_SLOTS];
};

/*
 * A walk remembered (see memo.bpf.h): where it started, in which process
 * and mappings, the stack key it gave, and every word of user memory it
 * read. Walks that end CT_WALK_COMPLETE only.
 */
struct ct_memo_entry {
	__u64 rip;
	__u64 rsp;
	__u64 rbp;	  /* compared only if the walk used the thread's (uses_rbp) */
	__u64 trampoline; /* the process's uretprobe trampoline then (0: none) */
	__u64 key;	  /* the stack's key: known to userspace when remembered */
	__u32 tgid;
	__u32 generation; /* ct_proc.generation of the mappings walked; 0: empty */
	__u16 nwords;	  /* words read */
	__u16 first;	  /* the lowest word read, in words above rsp */
	__u16 span;	  /* words from first to the highest word read, inclusive */
	__u16 uses_rbp;
	__u16 offsets[CT_MEMO_WORDS]; /* each word read, in words above rsp */
	__u64 values[CT_MEMO_WORDS];  /* ... and its value */
};

/* The entries of one set, and the way the next walk remembered takes. */
struct ct_memo_set {
	__u64 next;
	struct ct_memo_entry ways[CT_MEMO_WAYS];
};

/* One element of the walk_memo map: one CPU's memo, behind one lookup per
 * walk. */
struct ct_walk_memo {
	struct ct_memo_set sets[CT_MEMO_SETS];
};

/* A stack found stored: its key and its ct_stack.check. */
struct ct_known_entry {
	__u64 key;
	__u64 check;
};

/* One element of the known_cache map: one CPU's cache, behind one lookup
 * per event. */
struct ct_known_cache {
	struct ct_known_entry entries[CT_KNOWN_CACHE_SLOTS];
};

struct ct_page {
	__u32 first_row; /* global index into the rows map */
	__u32 nrows;	 /* rows starting in this 64 KiB page */
};

struct ct_table {
	__u64 first_page; /* lowest (pc >> CT_PAGE_SHIFT) the table covers */
	__u32 pages_base; /* global index of its first page */
	__u32 npages;
	__u32 rows_base; /* global index of its first row */
	__u32 nrows;
	__u32 rules_base; /* global index of its first rule */
	__u32 nrules;
};

struct ct_mapping {
	__u64 start; /* runtime address range [start, end) */
	__u64 end;
	__u64 bias;	/* runtime address - ELF virtual address */
	__u32 table_id; /* index into the tables map */
	__u32 flags;	/* CT_MAPPING_* */
	__u32 object;	/* the mapped object's id (see CT_FRAME_IN_OBJECT); 0: none */
	__u32 pad;
};

enum ct_mapping_flags {
	/* Executable, but no unwind table (e.g. JIT code): a pc in it ends the
	 * walk with CT_WALK_NO_ROW, as a gap of a table would. */
	CT_MAPPING_NO_TABLE = 1,
};

/*
 * An object file as userspace loaded it, by where a mapping of it starts in the
 * file: the walker's way through code a process mapped that userspace has not
 * registered for it yet (a library ld.so is still loading, whose code it runs
 * already: IFUNC resolvers, libc's early init). The kernel's own VMA of the pc
 * gives the file (device as the kernel numbers it, inode) and the page offset
 * the VMA starts at; this gives the rest of a ct_mapping.
 */
struct ct_file_key {
	__u64 dev; /* the superblock's s_dev: major << 20 | minor */
	__u64 inode;
	__u64 pgoff; /* the VMA's vm_pgoff: its start's file offset / 4096 */
};

struct ct_file_object {
	__u64 bias_from_start; /* load bias - VMA start (wrapping) */
	__u32 table_id;
	__u32 flags;  /* CT_MAPPING_* */
	__u32 object; /* as ct_mapping.object */
	__u32 pad;
};

/* Mappings of one process (tgid), sorted by start, disjoint. */
struct ct_proc {
	__u32 nmappings;
	/* Unique to this set of mappings (never 0): userspace numbers every
	 * set it registers, a forked child shares its parent's. */
	__u32 generation;
	struct ct_mapping mappings[CT_MAX_MAPPINGS];
};

/*
 * How a walk ended: unwind_tables::walk::WalkEnd (an unsupported row's reason
 * travels beside it, in ct_stack.reason). Index into the walk_ends per-CPU
 * array: every walk adds 1 to exactly one entry, so their sum is the number
 * of walks.
 */
enum ct_walk_end {
	CT_WALK_COMPLETE = 0,	 /* reached an end-of-stack rule */
	CT_WALK_NO_PROC = 1,	 /* process has no registered mappings */
	CT_WALK_NO_MAPPING = 2,	 /* pc is in no known executable mapping */
	CT_WALK_NO_ROW = 3,	 /* pc is in a gap of the table */
	CT_WALK_UNSUPPORTED = 4, /* the row is marked unsupported */
	CT_WALK_READ_FAULT = 5,	 /* bpf_probe_read_user failed */
	CT_WALK_DEPTH_CAP = 6,	 /* CT_MAX_FRAMES frames and still going */
	CT_WALK_BAD_RA = 7,	 /* return address 0 or CFA did not grow */
	CT_WALK_END_COUNT = 8,
};

/*
 * Events that lost something, or came close, apart from how their walk
 * ended: index into the losses per-CPU array (bpf_prog::Loss). A map or
 * ring buffer that fills has its entry here.
 */
enum ct_loss {
	CT_LOSS_STACK_NOT_STORED = 0, /* its hash and the CT_STACK_SLOTS - 1 next keys
				       * held other stacks: counted without its stack */
	CT_LOSS_COUNT_MAP_FULL = 1,   /* counts map full (or out of memory): counted
				       * through the records ring buffer instead */
	CT_LOSS_HASH_COLLISION = 2,   /* distinct stacks with one hash; stored under the
				       * next slot */
	CT_LOSS_KSTACK_LOST = 3,      /* no kernel stack: bpf_get_stack failed */
	CT_LOSS_TOO_NESTED = 4,	      /* CT_NEST_LEVELS walks in progress on the CPU:
				       * counted without its stacks */
	CT_LOSS_IN_EXEC = 5,	      /* inside execve with no user stack to walk (see
				       * take_user_stack): counted with its kernel stack
				       * only, and not as a walk */
	CT_LOSS_STACK_RING_FULL = 6,  /* the records ring buffer had no room for a new
				       * stack: counted under its key, the stack left
				       * unknown for a later event to send */
	CT_LOSS_KNOWN_STACKS_FULL = 7, /* the known_stacks set had no room: the stack is
					* sent again each time it is met */
	CT_LOSS_COUNT_LOST = 8,	      /* counts map and ring buffer both full: the event
				       * was not counted */
	CT_LOSS_PID_FILTER_FULL = 9,  /* a child of a traced process was not followed */
	CT_LOSS_PROCS_FULL = 10,      /* a child could not take its parent's mappings */
	CT_LOSS_NEW_IMAGES_FULL = 11, /* a process that exec'd or loaded libraries was
				       * not stopped for its mappings to be registered */
	/* Events with no user stack to walk, counted with their kernel stack only,
	 * and not as walks: */
	CT_LOSS_EXITING = 12,	      /* a process whose memory exit released */
	CT_LOSS_KERNEL_THREAD = 13,   /* a kernel thread */
	CT_LOSS_TARGET_ELSEWHERE = 14, /* an interval firing while no traced process ran
					* on the timer's CPU: the target's, without stacks */
	CT_LOSS_OFF_CPU_FULL = 15,    /* a thread's stay off the CPU not counted: the
				       * map of threads off the CPU was full */
	CT_LOSS_COUNT = 16,
};

/* What a record of the records ring buffer is (its first 4 bytes). */
enum ct_record_kind {
	CT_RECORD_STACK = 1, /* a struct ct_stack, its pcs cut to len */
	CT_RECORD_COUNT = 2, /* a struct ct_count_record */
};

/*
 * A user stack, or a kernel stack (at most CT_KSTACK_DEPTH frames, error 0),
 * as it is sent to userspace, once, through the records ring buffer: this
 * header and the first len pcs. The kernel keeps only its key and check
 * (known_stacks).
 */
struct ct_stack {
	__u32 kind;		  /* CT_RECORD_STACK */
	__u32 len;		  /* frames in pcs */
	__u64 key;		  /* its key (ct_count_key.stack_hash or kstack_hash) */
	__u64 check;		  /* second, independent hash of the frames: detects collisions */
	__u16 error;		  /* enum ct_walk_end of the walk (0: complete) */
	__u16 reason;		  /* for CT_WALK_UNSUPPORTED: the row's ct_rule.reason */
	__u32 pad;
	__u64 pcs[CT_MAX_FRAMES]; /* pcs[0] = innermost; return addresses as read */
};

/* Aggregation key: one counter per (probe, process, user stack, kernel stack). */
struct ct_count_key {
	__u64 stack_hash;  /* key of the user stack (enum ct_stack_key) */
	__u64 kstack_hash; /* key of the kernel stack; CT_STACK_NONE: none */
	__u32 pid;	   /* tgid */
	__u32 probe_id;	   /* the attach cookie */
};

struct ct_count {
	__u64 events;
	__u64 amount; /* sum of a probe-defined amount per event (e.g. bytes allocated) */
};

/* An event the counts map had no room for, sent through the records ring
 * buffer: userspace adds it to the counter of key. */
struct ct_count_record {
	__u32 kind; /* CT_RECORD_COUNT */
	__u32 pad;
	struct ct_count_key key;
	struct ct_count count;
};

/*
 * Heap profiling (alloc.bpf.h): the malloc family's calls paired with their
 * returns and with the frees of their blocks.
 *
 *   entry (uprobe)   -> stack walked once, key kept per thread with the size
 *   return (uretprobe) -> alloc_live[{pid, address}] = block; stats += size
 *   free (uprobe)    -> alloc_live entry removed at entry; stats += free
 *   stats per {user stack, pid, probe}; totals per {pid, probe}
 *
 * An attach cookie is the probe id | kind << CT_ALLOC_KIND_SHIFT: the kind
 * says where the function's arguments are.
 */
enum ct_alloc_limits {
	CT_ALLOC_BUCKETS = 48,	  /* log2 buckets of a size or lifetime histogram */
	CT_ALLOC_NEST = 8,	  /* allocator calls in progress at once on one thread */
	CT_ALLOC_KIND_SHIFT = 32, /* see above */
	CT_ALLOC_WEIGHT_SHIFT = 16, /* fixed point of the estimated counts */
	CT_ALLOC_LIVE_FILTER_BITS = 16, /* slots of alloc_live_filter: 1 << this */
	CT_FREE_LOG = 16,	  /* frees a thread logs before it tells them (see below) */
};

/* Where a function's size and addresses are (x86-64 argument registers). */
enum ct_alloc_kind {
	CT_ALLOC_SIZE_ARG0 = 0,	     /* malloc(size), valloc, pvalloc, mallocx(size, flags) */
	CT_ALLOC_SIZE_ARG1 = 1,	     /* aligned_alloc(align, size), memalign(align, size) */
	CT_ALLOC_CALLOC = 2,	     /* calloc(n, size) */
	CT_ALLOC_REALLOC = 3,	     /* realloc(ptr, size), rallocx(ptr, size, flags) */
	CT_ALLOC_REALLOCARRAY = 4,   /* reallocarray(ptr, n, size) */
	CT_ALLOC_POSIX_MEMALIGN = 5, /* posix_memalign(&ptr, align, size): ptr read at return */
	CT_ALLOC_FREE = 6,	     /* free(ptr), sdallocx(ptr, ...), dallocx(ptr, flags) */
	CT_ALLOC_MMAP = 7,	     /* mmap(addr, len, prot, flags, fd, off): anonymous only */
	CT_ALLOC_MUNMAP = 8,	     /* munmap(addr, len): the mapping made at addr */
	CT_ALLOC_XALLOCX = 9,	     /* xallocx(ptr, size, extra, flags): resized in place,
				      * returns the usable size (see alloc.bpf.h) */
	CT_ALLOC_KIND_COUNT = 10,
};

/* What the heap programs could not pair or keep: index into the per-CPU
 * alloc_counters array (bpf_prog::AllocCounter). */
enum ct_alloc_counter {
	CT_ALLOC_UNKNOWN_FREES = 0, /* frees of addresses no tracked block holds */
	CT_ALLOC_FAILED = 1,	    /* allocations that returned NULL */
	CT_ALLOC_LIVE_FULL = 2,	    /* blocks not tracked: the live map was full */
	CT_ALLOC_STATS_FULL = 3,    /* events not counted: the stats map was full */
	CT_ALLOC_NO_ENTRY = 4,	    /* returns whose entry was not kept (too nested, or
				     * attached while the call was in progress) */
	CT_ALLOC_REUSED = 5,	    /* an address returned again with no free seen: the
				     * old block is counted freed then */
	CT_ALLOC_LOGS_UNREAD = 6,   /* free logs the kernel could not read at their
				     * thread's exit or exec: their frees not counted */
	CT_ALLOC_COUNTER_COUNT = 7,
};

/* Aggregation key of the heap statistics. */
struct ct_alloc_key {
	__u64 stack; /* user stack key in the stacks map, as ct_count_key.stack_hash */
	__u32 pid;   /* tgid */
	__u32 probe_id;
};

/* What one stack of one process allocated and freed. */
struct ct_alloc_stats {
	__u64 allocs;
	__u64 bytes;
	__u64 frees; /* of its blocks, wherever they were freed */
	__u64 freed_bytes;
	__u64 temporaries;     /* frees within the temporary threshold of the allocation */
	__u64 untracked;       /* blocks the live map had no room for (never freed here) */
	__u64 untracked_bytes;
	__s64 live_bytes;      /* of its tracked blocks */
	__u64 live_birth_us;   /* sum of the birth times (us) of its tracked live blocks */
	__u64 changed_seq;     /* ct_alloc_proc.seq at its last change */
	__s64 peak_live_bytes; /* its live bytes at the process's last peak, if it
				* changed since (see alloc.bpf.h) */
	/* Sampling only: what the sampled events stand for (allocations and frees in
	 * 1/65536ths, bytes), each weighed by the inverse of its chance to be sampled. */
	__u64 est_allocs;
	__u64 est_bytes;
	__u64 est_frees;
	__u64 est_freed_bytes;
	__u64 size_hist[CT_ALLOC_BUCKETS]; /* bucket k: sizes of bit length k */
	__u64 life_hist[CT_ALLOC_BUCKETS]; /* same, of the lifetimes (ns) of freed blocks */
};

/* Totals of one process (and probe). */
struct ct_alloc_proc_key {
	__u32 pid;
	__u32 probe_id;
};

struct ct_alloc_proc {
	__s64 live_bytes;
	__s64 peak_bytes;
	__u64 seq;	/* changes of live bytes so far */
	__u64 peak_seq; /* seq of the change that reached peak_bytes */
	__u64 allocs;
	__u64 frees;
	__u64 bytes;
	__u64 freed_bytes;
	__u64 unknown_frees;
	__u64 pad;
};

/* A live block, by process and address. */
struct ct_live_key {
	__u64 address;
	__u32 pid;
	__u32 pad;
};

struct ct_live_block {
	__u64 size;
	__u64 stack;
	__u64 born_ns; /* bpf_ktime_get_ns at the allocation's return */
	__u32 probe_id;
	__u32 pad;
};

/* An allocator call in progress on a thread, from its entry to its return. */
struct ct_alloc_call {
	__u64 sp;    /* rsp at entry: the return finds its call by it */
	__u64 size;
	__u64 stack; /* key of the stack walked at entry */
	__u64 out;   /* posix_memalign: where the address is written; xallocx: extra */
	__u64 old;   /* realloc, xallocx: the block resized (0: none) */
	struct ct_live_block old_block; /* ... as it was live, if old_known */
	__u32 kind;  /* enum ct_alloc_kind */
	__u32 flags; /* CT_CALL_* */
	__u32 probe_id; /* from the entry's cookie: the return does not read its own */
	__u32 pad;
};

enum ct_alloc_call_flags {
	CT_CALL_NESTED = 1,    /* inside another allocator call: not counted */
	CT_CALL_OLD_KNOWN = 2, /* old_block holds the realloc'ed block */
	CT_CALL_UNSAMPLED = 4, /* left out by sampling or by size: not counted */
};

/* Task storage: the allocator calls in progress on one thread, innermost last. */
/* One free of a thread's log (see struct ct_free_log below). */
struct ct_free_entry {
	__u64 address;
	__u64 ns; /* CLOCK_MONOTONIC, as bpf_ktime_get_ns */
};

struct ct_alloc_thread {
	__u32 depth;
	__u32 tgid; /* the thread's process, wanted (pid_filter) when this was created */
	struct ct_alloc_call calls[CT_ALLOC_NEST];
	__u64 free_log;	      /* user address of the thread's struct ct_free_log; 0: none */
	__u32 log_probe_id;   /* the probe whose site registered it */
	__u32 pad;
	/* the entries of its log being told (tell_frees): read here at once */
	struct ct_free_entry told[CT_FREE_LOG];
};

/*
 * The preloaded library's log of one thread's frees (cargo-trace/preload/
 * preload.c), in the thread's memory: each free is logged, with the time,
 * before the block goes back to the allocator, and the log is told to the
 * kernel at the thread's next allocation (whose site carries it), when it is
 * full, and at the thread's exit or exec (registered at its first free).
 * The site of a free is a breakpoint; an entry of the log is two stores.
 */
struct ct_free_log {
	__u32 n; /* entries logged and not told yet */
	__u32 registered;
	struct ct_free_entry entries[CT_FREE_LOG];
};

/*
 * Off-CPU time (offcpu.bpf.h): where a traced thread left the CPU, kept
 * until it comes back. Kernel-side only: userspace reads the counts.
 */
struct ct_off_cpu_start {
	__u64 user_stack;   /* key of the user stack at the switch out */
	__u64 kernel_stack; /* key of its kernel stack */
	__u64 since;	    /* bpf_ktime_get_ns() once the stacks were taken */
	__u64 ran;	    /* the thread's time on a CPU until then (ns) */
	__u32 tgid;
	__u32 probe_id; /* the attach cookie */
};

#endif /* CARGO_TRACE_H */
