/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Every byte layout shared by the BPF programs and userspace.
 *
 * bpf-prog/src/layout.rs mirrors each struct here with size and offset
 * assertions, so a change on one side that is not made on the other fails the
 * build. Keep fields naturally aligned and padding explicit.
 *
 * Unwind tables (compiled by the unwind-tables crate from .eh_frame):
 *   mapping (pid, address) -> table id + load bias
 *   table id -> ct_table { where its pages, rows and rules start }
 *   (pc - bias) >> 16 - first_page -> ct_page { first row, row count }
 *   binary search on the low 16 bits of the rows of that page; when no row of
 *   the page starts at or before pc, the row before the page's first governs.
 *   row -> rule index -> ct_rule { how to find the CFA, RBP and return address }
 */
#ifndef CARGO_TRACE_H
#define CARGO_TRACE_H

#define CT_MAX_FRAMES 512
#define CT_MAX_MAPPINGS 512
#define CT_PAGE_SHIFT 16
#define CT_MAX_PROBES 64
#define CT_KSTACK_DEPTH 127

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
#define CT_SIGFRAME_RBP 120
#define CT_SIGFRAME_RSP 160
#define CT_SIGFRAME_RIP 168

struct ct_rule {
	__u8 kind;     /* enum ct_rule_kind */
	__u8 cfa_reg;  /* enum ct_reg, for CT_RULE_CFA_DEREF */
	__u8 rbp_kind; /* enum ct_rbp_kind */
	__u8 reason;   /* unwind_tables::UnsupportedReason, for CT_RULE_UNSUPPORTED */
	__s32 cfa_off;
	__s32 rbp_off;
	__s32 deref_add;
};

/* One row: low 16 bits of its start address, and its rule index in the table. */
struct ct_row {
	__u16 addr_lo;
	__u16 rule;
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
	__u64 bias;	  /* runtime address - ELF virtual address */
	__u32 table_id;	  /* index into the tables map */
	__u32 flags;	  /* CT_MAPPING_* */
};

#define CT_MAPPING_NO_TABLE 1 /* executable, but no unwind table (e.g. JIT) */

/* Mappings of one process (tgid), sorted by start. */
struct ct_proc {
	__u32 nmappings;
	__u32 pad;
	struct ct_mapping mappings[CT_MAX_MAPPINGS];
};

/* Why a walk stopped early. Index into the walk_errors per-CPU array. */
enum ct_walk_error {
	CT_WALK_OK = 0,		 /* reached an end-of-stack rule */
	CT_WALK_NO_PROC = 1,	 /* process has no registered mappings */
	CT_WALK_NO_MAPPING = 2,	 /* pc is in no known executable mapping */
	CT_WALK_NO_ROW = 3,	 /* pc is in a gap of the table */
	CT_WALK_UNSUPPORTED = 4, /* the row is marked unsupported */
	CT_WALK_READ_FAULT = 5,	 /* bpf_probe_read_user failed */
	CT_WALK_DEPTH_CAP = 6,	 /* CT_MAX_FRAMES frames and still going */
	CT_WALK_STACK_MAP_FULL = 7, /* stacks map full: stack not stored */
	CT_WALK_COUNT_MAP_FULL = 8, /* counts map full: event not counted */
	CT_WALK_HASH_COLLISION = 9, /* distinct stacks with one hash; stored under the next slot */
	CT_WALK_BAD_RA = 10,	    /* return address 0 or CFA did not grow */
	CT_WALK_ERROR_COUNT = 11,
};

/* A user stack, stored once by hash. */
struct ct_stack {
	__u64 check;	/* second, independent hash of the frames: detects collisions */
	__u32 len;	/* frames in pcs */
	__u32 error;	/* enum ct_walk_error that ended the walk (0: complete) */
	__u64 pcs[CT_MAX_FRAMES]; /* pcs[0] = innermost; return addresses as read */
};

/* Aggregation key: one counter per (probe, process, user stack, kernel stack). */
struct ct_count_key {
	__u64 stack_hash; /* key in the stacks map; 0: no user stack */
	__s32 kstack_id;  /* id in the kernel stack trace map; <0: none */
	__u32 pid;	  /* tgid */
	__u32 probe_id;
	__u32 pad;
};

struct ct_count {
	__u64 events;
	__u64 bytes; /* probe-defined amount (e.g. allocation size) */
};

#endif /* CARGO_TRACE_H */
