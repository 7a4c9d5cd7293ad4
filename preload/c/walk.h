/*
 * The stack walk of docs/walk.md in plain C, over the tables of shared.h:
 * the same steps, ends and frames as the BPF walker (bpf-prog's walk.bpf.h)
 * and its userspace twin (unwind_tables::walk). Included by preload.c (the
 * library walks its own threads) and by walk_test.c (the differential test
 * walks a stopped process's snapshot).
 *
 * The includer defines, before including this file:
 *   struct walk_env;
 *   static const struct ctp_mapping *walk_mapping(struct walk_env *, uint64_t addr);
 *     the mapping holding addr, NULL if none does;
 *   static int walk_read(struct walk_env *, uint64_t addr, uint64_t *value);
 *     the word at addr, 0 on success, as bpf_probe_read_user (never faults);
 *   static const unsigned char *walk_tables(struct walk_env *);
 *     where the tables memfd is mapped;
 *   static int walk_cached(struct walk_env *, uint64_t lookup, struct ctp_rule *,
 *                          uint32_t *object, uint64_t *bias);
 *   static void walk_cache(struct walk_env *, uint64_t lookup, const struct ctp_rule *,
 *                          uint32_t object, uint64_t bias);
 *     a cache of the rules found (resolved at lookup: never CTP_RULE_CFA_RSP_STEPS)
 *     with their mapping's object and bias, in front of the mapping and row
 *     searches, as the BPF walker's rule cache; walk_cached is 1 on a hit.
 *
 * The walk also logs the words it read that its result depends on (address
 * and value) for the walk memo (record.h), and whether it depended on
 * anything else than its start and those words (unfit: then it is not
 * remembered). A caller's rbp read from the stack is logged only once a rule
 * uses it: code that keeps a loop variable in rbp saves a new value in every
 * iteration, which changes no frame unless an rbp-based rule reads it.
 */
#ifndef CTP_WALK_H
#define CTP_WALK_H

#include "shared.h"

enum walk_limits {
	WALK_LOG_WORDS = 256, /* words logged for the memo; more: unfit */
};

struct ctp_walk {
	uint32_t len;	 /* frames found */
	uint16_t end;	 /* enum ctp_walk_end */
	uint16_t reason; /* of an unsupported row */
	uint32_t nwords; /* words read (logged up to WALK_LOG_WORDS) */
	uint8_t unfit;	 /* the walk used more than its start and the words it read */
	uint8_t uses_rbp; /* ... it used the thread's rbp */
	uint8_t pad[2];
	uint64_t frames[CTP_MAX_FRAMES]; /* stored as CTP_FRAME_IN_OBJECT says */
	uint64_t word_addr[WALK_LOG_WORDS];
	uint64_t word_value[WALK_LOG_WORDS];
};

struct walk_state {
	uint64_t pc, rsp, rbp, rdi;
	int has_rdi;
	int exact;
	int rbp_from_regs; /* rbp is still the thread's, not one read */
	int rbp_unlogged;  /* rbp was read from rbp_at, and not logged yet */
	uint64_t rbp_at;
};

static inline void walk_log(struct ctp_walk *w, uint64_t addr, uint64_t value)
{
	uint32_t n = w->nwords;

	if (n < WALK_LOG_WORDS) {
		w->word_addr[n] = addr;
		w->word_value[n] = value;
	} else {
		w->unfit = 1;
	}
	w->nwords = n + 1;
}

/* A rule uses rbp: the walk depends on the thread's rbp, or on the word it
 * was read from. */
static inline void walk_use_rbp(struct ctp_walk *w, struct walk_state *s)
{
	if (s->rbp_from_regs) {
		w->uses_rbp = 1;
	} else if (s->rbp_unlogged) {
		walk_log(w, s->rbp_at, s->rbp);
		s->rbp_unlogged = 0;
	}
}

/* Reads the caller's rbp at addr (logged once used). */
static inline int walk_read_rbp(struct walk_env *env, struct walk_state *s, uint64_t addr,
				uint64_t *value)
{
	if (walk_read(env, addr, value))
		return -1;
	s->rbp_from_regs = 0;
	s->rbp_unlogged = 1;
	s->rbp_at = addr;
	return 0;
}

static inline int walk_read_logged(struct walk_env *env, struct ctp_walk *w, uint64_t addr,
				   uint64_t *value)
{
	if (walk_read(env, addr, value))
		return -1;
	uint32_t n = w->nwords;
	if (n < WALK_LOG_WORDS) {
		w->word_addr[n] = addr;
		w->word_value[n] = *value;
	} else {
		w->unfit = 1;
	}
	w->nwords = n + 1;
	return 0;
}

/* The frame stored for pc in a mapping of object with bias (object 0: the
 * runtime address), as name_frame does in walk.bpf.h. */
static inline uint64_t walk_frame(uint64_t pc, uint32_t object, uint64_t bias)
{
	uint64_t address = pc - bias;

	if (object && object < CTP_MAX_OBJECTS && address < 1ULL << CTP_FRAME_OBJECT_SHIFT)
		return CTP_FRAME_IN_OBJECT | (uint64_t)object << CTP_FRAME_OBJECT_SHIFT | address;
	return pc;
}

/* The rule governing ELF address addr in table t, NULL outside it (a gap);
 * *row_offset is addr's offset past the row's start, capped at
 * CTP_STEP_WINDOW (CompactTable::lookup_in_row). */
static inline const struct ctp_rule *walk_find_rule(const unsigned char *tables,
						    const struct ctp_table *t, uint64_t addr,
						    uint32_t *row_offset)
{
	uint64_t page_index = (addr >> CTP_PAGE_SHIFT) - t->first_page;

	if (page_index >= t->npages)
		return NULL;
	const unsigned char *base = (const unsigned char *)t;
	const struct ctp_page *page = (const struct ctp_page *)(base + t->pages_at) + page_index;
	const struct ctp_row *rows = (const struct ctp_row *)(base + t->rows_at);
	const struct ctp_rule *rules = (const struct ctp_rule *)(base + t->rules_at);
	uint16_t lo_bits = addr & 0xffff;
	/* the number of rows of the page starting at or before addr */
	uint32_t lo = 0, len = page->nrows;
	const struct ctp_row *first = rows + page->first_row;
	while (len > 0) {
		uint32_t half = len >> 1;
		if (first[lo + half].addr_lo <= lo_bits) {
			lo += half + 1;
			len -= half + 1;
		} else {
			len = half;
		}
	}
	(void)tables;
	const struct ctp_row *row;
	if (lo == 0) {
		/* the row before the page governs, from an earlier page */
		if (page->first_row == 0)
			return NULL;
		row = first - 1;
		*row_offset = CTP_STEP_WINDOW;
	} else {
		row = first + lo - 1;
		uint32_t offset = lo_bits - row->addr_lo;
		*row_offset = offset < CTP_STEP_WINDOW ? offset : CTP_STEP_WINDOW;
	}
	if (row->rule >= t->nrules)
		return NULL;
	return rules + row->rule;
}

/* Pushes minus pops of a CTP_RULE_CFA_RSP_STEPS row at row_offset. */
static inline int64_t walk_steps_moved(uint32_t steps, uint32_t row_offset)
{
	uint32_t happened = (1U << row_offset) - 1;

	return (int64_t)__builtin_popcount(steps & happened) -
	       (int64_t)__builtin_popcount((steps >> 16) & happened);
}

static inline int walk_stop(struct ctp_walk *w, uint16_t end)
{
	w->end = end;
	return 1;
}

/* One step of docs/walk.md: from the frame at s->pc to its caller; 1 once
 * the walk stopped (w->end says why). */
static inline int walk_step(struct walk_env *env, struct ctp_walk *w, struct walk_state *s)
{
	uint64_t lookup = s->exact ? s->pc : s->pc - 1;
	struct ctp_rule resolved;
	uint32_t object;
	uint64_t bias;
	const struct ctp_rule *rule = &resolved;

	if (walk_cached(env, lookup, &resolved, &object, &bias)) {
		w->frames[w->len - 1] = walk_frame(s->pc, object, bias);
	} else {
		const struct ctp_mapping *m = walk_mapping(env, lookup);
		if (!m) {
			w->frames[w->len - 1] = s->pc;
			return walk_stop(w, CTP_WALK_NO_MAPPING);
		}
		w->frames[w->len - 1] = walk_frame(s->pc, m->object, m->bias);
		if ((m->flags & CTP_MAPPING_NO_TABLE) || m->table == CTP_NO_TABLE)
			return walk_stop(w, CTP_WALK_NO_ROW);
		const unsigned char *tables = walk_tables(env);
		const struct ctp_table *t = (const struct ctp_table *)(tables + m->table);
		uint32_t row_offset = 0;
		const struct ctp_rule *found =
			walk_find_rule(tables, t, lookup - m->bias, &row_offset);
		if (!found)
			return walk_stop(w, CTP_WALK_NO_ROW);
		resolved = *found;
		if (resolved.kind == CTP_RULE_CFA_RSP_STEPS) {
			resolved.kind = CTP_RULE_CFA_RSP;
			resolved.cfa_off += 8 * walk_steps_moved(found->cfa_arg, row_offset);
		}
		walk_cache(env, lookup, &resolved, m->object, m->bias);
	}

	uint64_t rsp = s->rsp, rbp = s->rbp, cfa = 0, ra = 0;
	int exact = 0;
	switch (rule->kind) {
	case CTP_RULE_CFA_RSP:
		cfa = rsp + (int64_t)rule->cfa_off;
		break;
	case CTP_RULE_CFA_RBP:
		walk_use_rbp(w, s);
		cfa = rbp + (int64_t)rule->cfa_off;
		break;
	case CTP_RULE_PLT:
		cfa = rsp + 8 + ((s->pc & 15) >= (uint64_t)rule->cfa_off ? 8 : 0);
		break;
	case CTP_RULE_CFA_DEREF: {
		int from_rbp = rule->cfa_reg == CTP_REG_RBP;
		if (from_rbp)
			walk_use_rbp(w, s);
		if (walk_read_logged(env, w, (from_rbp ? rbp : rsp) + (int64_t)rule->cfa_off, &cfa))
			return walk_stop(w, CTP_WALK_READ_FAULT);
		cfa += (int64_t)(int32_t)rule->cfa_arg;
		break;
	}
	case CTP_RULE_END:
		return walk_stop(w, CTP_WALK_COMPLETE);
	case CTP_RULE_RETURN_IN_RDI:
		if (w->len != 1 || !s->has_rdi) {
			w->reason = CTP_UNSUPPORTED_RETURN_ADDRESS;
			return walk_stop(w, CTP_WALK_UNSUPPORTED);
		}
		ra = s->rdi;
		cfa = rsp + (int64_t)rule->cfa_off;
		w->unfit = 1;
		goto push;
	case CTP_RULE_SIGNAL:
		if (walk_read_logged(env, w, rsp + CTP_SIGFRAME_RIP, &ra) ||
		    walk_read_logged(env, w, rsp + CTP_SIGFRAME_RSP, &cfa) ||
		    walk_read_rbp(env, s, rsp + CTP_SIGFRAME_RBP, &rbp))
			return walk_stop(w, CTP_WALK_READ_FAULT);
		exact = 1;
		goto push;
	case CTP_RULE_UNSUPPORTED:
		w->reason = rule->reason;
		return walk_stop(w, CTP_WALK_UNSUPPORTED);
	case CTP_RULE_GAP:
		return walk_stop(w, CTP_WALK_NO_ROW);
	default:
		return walk_stop(w, CTP_WALK_UNSUPPORTED);
	}

	if (walk_read_logged(env, w, cfa - 8, &ra))
		return walk_stop(w, CTP_WALK_READ_FAULT);
	if (rule->rbp_kind == CTP_RBP_AT_CFA) {
		if (walk_read_rbp(env, s, cfa + (int64_t)rule->rbp_off, &rbp))
			return walk_stop(w, CTP_WALK_READ_FAULT);
	} else if (rule->rbp_kind == CTP_RBP_AT_RBP) {
		walk_use_rbp(w, s);
		if (walk_read_rbp(env, s, rbp + (int64_t)rule->rbp_off, &rbp))
			return walk_stop(w, CTP_WALK_READ_FAULT);
	}
	if (cfa <= rsp)
		return walk_stop(w, CTP_WALK_BAD_RA);

push:
	if (ra == 0)
		return walk_stop(w, CTP_WALK_BAD_RA);
	if (w->len >= CTP_MAX_FRAMES)
		return walk_stop(w, CTP_WALK_DEPTH_CAP);
	w->frames[w->len++] = ra;
	s->pc = ra;
	s->rsp = cfa;
	s->rbp = rbp;
	s->exact = exact;
	return 0;
}

/* Walks from the registers into w; rdi is known at the first frame only if
 * has_rdi (unwind_tables::walk::Registers::rdi). */
static inline void ctp_walk_stack(struct walk_env *env, struct ctp_walk *w, uint64_t rip,
				  uint64_t rsp, uint64_t rbp, uint64_t rdi, int has_rdi)
{
	struct walk_state s = {
		.pc = rip,
		.rsp = rsp,
		.rbp = rbp,
		.rdi = rdi,
		.has_rdi = has_rdi,
		.exact = 1,
		.rbp_from_regs = 1,
	};

	w->len = 1;
	w->frames[0] = rip;
	w->end = CTP_WALK_COMPLETE;
	w->reason = 0;
	w->nwords = 0;
	w->unfit = 0;
	w->uses_rbp = 0;
	while (!walk_step(env, w, &s))
		;
}

#endif /* CTP_WALK_H */
