/*
 * Every byte the preloaded library and cargo-trace share in in-process
 * recording (CARGO_TRACE_HEAP): the region each process writes, the unwind
 * tables cargo-trace writes, and the messages on the socket between them.
 *
 * preload/src/layout.rs mirrors each struct here and asserts, at compile time,
 * that its size and every field offset equal what the C compiler gives (the
 * build compiles a program that prints them, from this very file), so a
 * change on one side only fails the build. Keep fields naturally aligned,
 * padding explicit, and one declaration per line: build.rs reads the structs
 * and enums of this file line by line.
 *
 * The region (a memfd the library creates, sent with the hello, mapped by
 * both sides; it stays readable after the process died):
 *   ctp_region              header, at 0
 *   ctp_ring[CTP_RINGS]      at rings_offset: one per thread, single producer
 *   ctp_stack_slot[...]      at slots_offset: the interned stacks' hash table
 *   u64[CTP_STACK_WORDS]     at words_offset: the stacks' records
 * A stack record: one word (frames | end << 32 | reason << 48) and its frames,
 * stored as the BPF walker stores them (CTP_FRAME_IN_OBJECT). A stack's id is
 * its record's word index + 1 (0: no stack).
 *
 * The tables (one memfd cargo-trace appends to, mapped read-only): ctp_table
 * headers, each followed by its pages, rows and rules, at the offsets the
 * mappings name. Same compact rows as the BPF maps (cargo_trace.h), in one
 * blob per table.
 */
#ifndef CTP_SHARED_H
#define CTP_SHARED_H

#include <stdint.h>

enum ctp_limits {
	CTP_MAGIC = 0x52505443, /* "CTPR" */
	CTP_VERSION = 2,
	CTP_MAX_FRAMES = 512,
	CTP_RINGS = 128,
	CTP_RING_EVENTS = 65536,
	CTP_STACK_SLOTS = 262144,
	CTP_STACK_WORDS = 8388608,
	CTP_MAX_MAPPINGS = 1024,
	CTP_PAGE_SHIFT = 16,
	CTP_STEP_WINDOW = 16,
	CTP_WALK_END_COUNT = 8,
	CTP_REGION_HEADER = 4096,
};

/* Rule kinds: the values of cargo_trace.h's ct_rule_kind. */
enum ctp_rule_kind {
	CTP_RULE_GAP = 0,
	CTP_RULE_CFA_RSP = 1,
	CTP_RULE_CFA_RBP = 2,
	CTP_RULE_PLT = 3,
	CTP_RULE_CFA_DEREF = 4,
	CTP_RULE_END = 5,
	CTP_RULE_SIGNAL = 6,
	CTP_RULE_UNSUPPORTED = 7,
	CTP_RULE_CFA_RSP_STEPS = 8,
	CTP_RULE_RETURN_IN_RDI = 9,
};

enum ctp_reg {
	CTP_REG_RBP = 6,
	CTP_REG_RSP = 7,
};

enum ctp_rbp_kind {
	CTP_RBP_SAME = 0,
	CTP_RBP_AT_CFA = 1,
	CTP_RBP_AT_RBP = 2,
};

enum ctp_sigframe {
	CTP_SIGFRAME_RBP = 120,
	CTP_SIGFRAME_RSP = 160,
	CTP_SIGFRAME_RIP = 168,
};

/* unwind_tables::UnsupportedReason::ReturnAddress */
enum ctp_reason {
	CTP_UNSUPPORTED_RETURN_ADDRESS = 5,
};

/* How a walk ended: unwind_tables::walk::WalkEnd, as ct_walk_end numbers it. */
enum ctp_walk_end {
	CTP_WALK_COMPLETE = 0,
	CTP_WALK_NO_PROC = 1,
	CTP_WALK_NO_MAPPING = 2,
	CTP_WALK_NO_ROW = 3,
	CTP_WALK_UNSUPPORTED = 4,
	CTP_WALK_READ_FAULT = 5,
	CTP_WALK_DEPTH_CAP = 6,
	CTP_WALK_BAD_RA = 7,
};

/* A frame in an object: CTP_FRAME_IN_OBJECT | object << 48 | ELF address. */
enum ctp_frame {
	CTP_FRAME_OBJECT_SHIFT = 48,
	CTP_MAX_OBJECTS = 32768,
};
#define CTP_FRAME_IN_OBJECT (1ULL << 63)

struct ctp_rule {
	uint8_t kind;
	uint8_t cfa_reg;
	uint8_t rbp_kind;
	uint8_t reason;
	int32_t cfa_off;
	int32_t rbp_off;
	uint32_t cfa_arg;
};

struct ctp_row {
	uint16_t addr_lo;
	uint16_t rule;
};

struct ctp_page {
	uint32_t first_row;
	uint32_t nrows;
};

/* One object's table; its pages, rows and rules follow, at the offsets given
 * (from this header), in the tables memfd. */
struct ctp_table {
	uint64_t first_page;
	uint32_t npages;
	uint32_t nrows;
	uint32_t nrules;
	uint32_t pages_at;
	uint32_t rows_at;
	uint32_t rules_at;
};

enum ctp_mapping_flags {
	CTP_MAPPING_NO_TABLE = 1, /* executable, no table (JIT code): NoRow */
};

#define CTP_NO_TABLE (~0ULL)

/* An executable mapping, as cargo-trace registers it for the BPF walker. */
struct ctp_mapping {
	uint64_t start;
	uint64_t end;
	uint64_t bias;
	uint64_t table; /* offset of its ctp_table in the tables memfd */
	uint32_t object; /* object id (0: none) */
	uint32_t flags;	 /* enum ctp_mapping_flags */
};

/* What a ring event is. */
enum ctp_event_kind {
	CTP_EV_ALLOC = 1,    /* address, size, stack */
	CTP_EV_FREE = 2,     /* address, before the allocator takes it back */
	CTP_EV_MMAP = 3,     /* address, size, stack: anonymous memory mapped */
	CTP_EV_MUNMAP = 4,   /* address, before it is unmapped */
	CTP_EV_RESIZING = 5, /* address (the old block, 0: none), size, stack: a realloc's entry */
	CTP_EV_RESIZED = 6,  /* address (0: failed or freed): its return */
	CTP_EV_FAILED = 7,   /* size: an allocation that returned NULL */
};

enum ctp_event_flags {
	CTP_EV_UNSAMPLED = 1, /* not counted: sampling or the size filter left it out */
};

struct ctp_event {
	uint64_t time; /* TSC ticks (the consumer makes them CLOCK_MONOTONIC ns) */
	uint64_t address;
	uint64_t size;
	uint32_t stack; /* stack id, 0: none */
	uint16_t kind;	/* enum ctp_event_kind */
	uint16_t flags; /* enum ctp_event_flags */
};

enum ctp_ring_state {
	CTP_RING_FREE = 0,     /* no thread: a new thread may take it */
	CTP_RING_OWNED = 1,    /* a thread's */
	CTP_RING_RELEASED = 2, /* its thread ended: free again once drained */
};

/* A thread's ring header. head is the producer's, tail the consumer's, each
 * on its own cache line; the counters are the producer's. */
struct ctp_ring {
	uint32_t state; /* enum ctp_ring_state */
	uint32_t tid;
	uint64_t owners; /* threads that owned it so far */
	uint64_t pad0[6];
	uint64_t head; /* events published */
	uint64_t pad1[7];
	uint64_t tail; /* events consumed */
	uint64_t pad2[7];
	uint64_t walks;	    /* stacks walked (memo misses) */
	uint64_t memo_hits; /* stacks the memo answered */
	uint64_t walk_ticks; /* TSC ticks spent walking */
	uint64_t walked_frames;
	uint64_t walk_ends[CTP_WALK_END_COUNT];
	uint64_t nested_lost;	   /* events lost: too deeply nested signal handlers */
	uint64_t not_stored;	   /* stacks not stored: the stack area was full */
	uint64_t waits;		   /* times the ring was full and the thread waited */
	uint64_t nested_events;	   /* events of a signal handler inside the recorder */
	uint64_t inside_calls;	   /* wrapped calls made inside a wrapped allocator's
				    * call (its own mmaps): part of it, not events */
	uint64_t memo_timed;	   /* memo answers timed (one in 1024) ... */
	uint64_t memo_ticks;	   /* ... and their TSC ticks */
	struct ctp_event events[CTP_RING_EVENTS];
};

/* One slot of the stacks' hash table: written once, hash last. */
struct ctp_stack_slot {
	uint64_t hash; /* 0: empty */
	uint32_t id;
	uint32_t pad;
};

struct ctp_region {
	uint32_t magic;
	uint32_t version;
	uint32_t pid;
	uint32_t nrings;
	uint64_t region_bytes; /* the memfd's size: the bound of what is shared */
	uint64_t rings_offset;
	uint64_t ring_bytes;
	uint64_t slots_offset;
	uint64_t nslots;
	uint64_t words_offset;
	uint64_t nwords;
	uint64_t private_bytes; /* the library's own memory besides the region, now */
	uint64_t private_bound; /* ... and at most */
	uint64_t words_used;	/* stack records so far (under stack_lock) */
	uint32_t stacks;	/* stacks stored */
	uint32_t stack_lock;
	uint64_t no_ring;     /* events lost: no free ring for their thread */
	uint64_t stacks_full; /* stacks not stored: no room */
	uint64_t lookups;     /* mappings asked of cargo-trace */
	uint32_t detached;    /* cargo-trace went away: the library passes through */
	uint32_t ring_limit;  /* rings [0, ring_limit) were ever taken */
	/* cargo-trace's: bumped when the process's mappings changed otherwise than by
	 * a new library the library will ask for (one unmapped, another mapped over
	 * it): the next walk asks for the mappings again. On a line of its own: every
	 * walk reads it. */
	uint64_t pad[5];
	uint32_t mappings_epoch;
	uint32_t pad2;
	uint64_t pad3[7];
};

/* Messages on the socket (SOCK_SEQPACKET). */
enum ctp_msg_kind {
	CTP_MSG_HELLO = 1,    /* library -> cargo-trace, with the region's fd */
	CTP_MSG_MAPPINGS = 2, /* cargo-trace -> library, with the tables' fd */
	CTP_MSG_LOOKUP = 3,   /* library -> cargo-trace: the mapping at pc? */
	CTP_MSG_HOOKS = 4,	 /* library -> cargo-trace: which functions to hook? */
	CTP_MSG_HOOK_LIST = 5,	 /* cargo-trace -> library: these (ctp_hook_target) */
	CTP_MSG_HOOK_PLAN = 6,	 /* library -> cargo-trace: where each goes (ctp_hook_where) */
	CTP_MSG_HOOK_CODE = 7,	 /* cargo-trace -> library: what to write (ctp_hook_code) */
	CTP_MSG_HOOK_PLACED = 8, /* library -> cargo-trace: what was placed, no answer */
};

/* Every message starts with its kind. */
struct ctp_msg_hello {
	uint32_t kind;
	uint32_t magic;
	uint32_t version;
	uint32_t pid;
	uint64_t region_bytes;
	uint32_t flags; /* enum ctp_hello_flags */
	uint32_t pad;
};

/* Where a connection comes from. CTP_HELLO_FORKED: a forked child of a process
 * that recorded, before any exec, not a process image of its own (an image
 * connects at its start). */
enum ctp_hello_flags {
	CTP_HELLO_FORKED = 1,
};

/* What the library records (bpf_prog::AllocOptions that apply in-process).
 * CTP_OPT_WRAPPERS_PASS: an allocator named (alloc:jemalloc) whose functions are
 * all hooked: the wrappers record nothing and pass every call through with a tail
 * jump (preload.c's PASS_THROUGH). */
enum ctp_option_flags {
	CTP_OPT_NO_MEMO = 1,	   /* walk every stack (the benchmark's walk figures) */
	CTP_OPT_WRAPPERS_PASS = 2, /* only the hooks record */
};

struct ctp_options {
	uint32_t sample_every;
	uint32_t flags; /* enum ctp_option_flags */
	uint64_t sample_bytes;
	uint64_t min_size;
	uint64_t max_size;
};

/* The process's mappings, all of them (the answer to a hello or a lookup),
 * followed by nmappings struct ctp_mapping. */
struct ctp_msg_mappings {
	uint32_t kind;
	uint32_t nmappings;
	struct ctp_options options;
};

struct ctp_msg_lookup {
	uint32_t kind;
	uint32_t pad;
	uint64_t pc;
};

/*
 * Hooks: allocator functions the library's wrappers cannot reach (an allocator
 * linked into the executable, an allocator's own API in a library) get a jump
 * at their entry to a stub of the library's, which records the call and calls
 * the function's first instructions, relocated into a trampoline, then the
 * rest of it. cargo-trace decides which functions (from each object's symbols)
 * and makes the bytes (it decodes the code); the library maps the room for the
 * stubs and trampolines within reach of a jump from the entry, and writes.
 *
 *   library                                     cargo-trace
 *   HOOKS ------------------------------------->  the functions of the objects
 *        <------------ HOOK_LIST (targets) ----   mapped now
 *   maps room near each entry
 *   HOOK_PLAN (entry, stub, trampoline) ------->  decodes, relocates
 *        <------------ HOOK_CODE (bytes) ------
 *   writes trampolines, then entries
 *   HOOK_PLACED (entries not placed) ---------->
 */
enum ctp_hook_limits {
	CTP_MAX_HOOKS = 256,	    /* functions in one message at most */
	CTP_HOOK_PATCH = 8,	    /* the entry's bytes written at most */
	CTP_HOOK_ROOM = 80,	    /* a trampoline's bytes at most */
};

/* How a hooked function's arguments read: bpf_prog::AllocKind's shapes. */
enum ctp_hook_kind {
	CTP_HOOK_SIZE_ARG0 = 1,	     /* malloc(size), mallocx(size, flags), mi_malloc_aligned */
	CTP_HOOK_SIZE_ARG1 = 2,	     /* aligned_alloc(align, size), memalign */
	CTP_HOOK_CALLOC = 3,	     /* calloc(n, size) */
	CTP_HOOK_REALLOC = 4,	     /* realloc(p, size), rallocx(p, size, flags) */
	CTP_HOOK_REALLOC_ARRAY = 5,  /* reallocarray(p, n, size) */
	CTP_HOOK_POSIX_MEMALIGN = 6, /* posix_memalign(&p, align, size) */
	CTP_HOOK_FREE = 7,	     /* free(p), sdallocx(p, size, flags), mi_free */
	CTP_HOOK_XALLOCX = 8,	     /* xallocx(p, size, extra, flags) */
	CTP_HOOK_DEBUG_STATE = 9,    /* ld.so's _dl_debug_state(): objects mapped or unmapped */
};

struct ctp_hook_target {
	uint64_t entry;
	uint64_t leaf; /* where the walk starts: the BPF path's probe (entry, or past moves) */
	uint32_t kind; /* enum ctp_hook_kind */
	uint32_t pad;
};

struct ctp_msg_hook_list {
	uint32_t kind;
	uint32_t ntargets; /* followed by this many struct ctp_hook_target */
};

struct ctp_hook_where {
	uint64_t entry;
	uint64_t stub;	     /* where the entry's jump goes */
	uint64_t trampoline; /* where the relocated instructions go */
	uint32_t room;	     /* the trampoline's bytes at most */
	uint32_t pad;
};

struct ctp_msg_hook_plan {
	uint32_t kind;
	uint32_t nhooks; /* followed by this many struct ctp_hook_where */
};

struct ctp_hook_code {
	uint64_t entry;
	uint32_t refused; /* 0: hook it; else cargo-trace refused it (it says why) */
	uint16_t patch_len;
	uint16_t code_len;
	uint8_t patch[CTP_HOOK_PATCH];
	uint8_t code[CTP_HOOK_ROOM];
};

struct ctp_msg_hook_code {
	uint32_t kind;
	uint32_t ncodes; /* followed by this many struct ctp_hook_code */
};

struct ctp_msg_hook_placed {
	uint32_t kind;
	uint32_t placed;
	uint32_t nfailed; /* followed by this many u64: entries that could not be written */
	uint32_t pad;
};

#endif /* CTP_SHARED_H */
