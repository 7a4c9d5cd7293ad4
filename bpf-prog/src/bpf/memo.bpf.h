/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The walk memo, included by trace.bpf.c after walk.bpf.h: a thread that
 * meets the same stack again (a hot uprobe, a malloc storm, a sample in a
 * loop) gets its stack key without a walk.
 *
 * A walk is a function of its start (rip, rsp; rbp if a rule used it; rdi
 * if a CT_RULE_RETURN_IN_RDI rule did), of the process's mappings and their
 * tables (one ct_proc.generation names them: a set once registered never
 * changes, nor do tables), of the uretprobe trampoline's address, and of
 * the words of user memory it reads. A walk that used rdi, a return
 * instance of a uretprobe or a mapping found through bpf_find_vma depends
 * on more and is not remembered, nor one that read a misaligned word, more
 * than CT_MEMO_WORDS words, or words below its rsp or spread wider than a
 * page_cache element (w->unfit, memo_remember). For the others, the memo
 * keeps the start and every word read with its value; an event that starts
 * the same way reads those words again, in one bpf_probe_read_user of the
 * span they lie in, and if every one is unchanged the walk would read the
 * same words, take the same steps, and give the same frames, hashes and
 * end: the memo answers with the key the walk gave. Otherwise the event
 * walks, and the walk is remembered instead of the oldest of its set.
 *
 * Only walks that end CT_WALK_COMPLETE and whose stack store_stack found
 * known (in known_stacks, sent) without a loss are remembered, so an answer
 * also stands for store_stack's: nothing removes a key from known_stacks but
 * the withdrawal of a claim that was never sent, which store_stack's race
 * note describes for known_cache and which the memo shares. Like the rule
 * cache, the memo is used at nesting level 0 only: no two walks of a CPU
 * use it at once.
 */
#ifndef MEMO_BPF_H
#define MEMO_BPF_H

/* See CT_MEMO_SETS: an element per CPU, sized by userspace to the number of
 * possible CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_walk_memo);
	__uint(max_entries, 64);
} walk_memo SEC(".maps");

/* The set of this CPU's memo a walk from (tgid, rip, rsp) belongs to. */
static __always_inline struct ct_memo_set *memo_set(__u32 cpu, __u32 tgid, __u64 rip, __u64 rsp)
{
	struct ct_walk_memo *memo = bpf_map_lookup_elem(&walk_memo, &cpu);

	if (!memo)
		return NULL;
	__u64 mix = (rip ^ (rsp * 0xc2b2ae3d27d4eb4fULL) ^ tgid) * 0x9e3779b97f4a7c15ULL;
	return &memo->sets[(mix >> 40) & (CT_MEMO_SETS - 1)];
}

/*
 * Words compared or copied per bpf_loop iteration. The loops over an entry's
 * words are bpf_loop callbacks so that the verifier checks one chunk once,
 * not every iteration of every way (a plain loop's exits each go on through
 * the rest of the program: +80K instructions verified per program); a chunk
 * has no branch, and costs a call where a word costs about a nanosecond.
 */
#define MEMO_CHUNK 32

/* What compare_words and copy_words work on (bpf_loop's context lives on
 * the BPF stack). What they find goes to the walk's state (struct
 * walk_state's memo_*), map memory: values a callback leaves on its
 * caller's stack are part of the state the verifier must see converge from
 * one call to the next, and a running minimum or OR never does until its
 * range is all values (a copy_words checked 60 times, a third of a
 * program's budget). */
struct memo_words {
	struct ct_memo_entry *entry;
	__u64 *buf;	      /* compare_words: the words from `from` words above rsp on */
	struct walk_state *w; /* copy_words: the walk to remember; both: what they find */
	__u32 from;
	__u32 n; /* the entry's words */
};

static int compare_words(__u32 index, void *arg)
{
	struct memo_words *c = arg;
	struct ct_memo_entry *e = c->entry;
	__u64 *buf = c->buf;
	__u32 from = c->from, n = c->n;
	__u64 changed = 0;

	for (__u32 j = 0; j < MEMO_CHUNK; j++) {
		__u32 i = index * MEMO_CHUNK + j;
		/* the words past n, in the last chunk, count for nothing */
		__u64 counts = mask_if_negative((__s64)i - n);
		__u32 at = (e->offsets[i & (CT_MEMO_WORDS - 1)] - from) & (CT_MEMO_SPAN_WORDS - 1);
		changed |= (buf[at] ^ e->values[i & (CT_MEMO_WORDS - 1)]) & counts;
	}
	c->w->memo_changed |= changed;
	return changed != 0;
}

static int copy_words(__u32 index, void *arg)
{
	struct memo_words *c = arg;
	struct ct_memo_entry *e = c->entry;
	struct walk_state *w = c->w;
	__u32 n = c->n;
	__u64 reach = w->memo_reach, lowest = w->memo_lowest, highest = w->memo_highest;

	/* words past n, in the last chunk, are copied too, and never compared */
	for (__u32 j = 0; j < MEMO_CHUNK; j++) {
		__u32 i = index * MEMO_CHUNK + j;
		__u64 counts = mask_if_negative((__s64)i - n);
		__u64 distance = w->distances[i & (CT_MEMO_WORDS - 1)];
		__u64 word = distance / sizeof(__u64);
		e->offsets[i & (CT_MEMO_WORDS - 1)] = word;
		e->values[i & (CT_MEMO_WORDS - 1)] = w->values[i & (CT_MEMO_WORDS - 1)];
		reach |= distance & counts;
		/* word < lowest, word > highest: both below 2^61 */
		__u64 below = mask_if_negative(word - lowest) & counts;
		__u64 above = mask_if_negative(highest - word) & counts;
		lowest = (word & below) | (lowest & ~below);
		highest = (word & above) | (highest & ~above);
	}
	w->memo_reach = reach;
	w->memo_lowest = lowest;
	w->memo_highest = highest;
	return 0;
}

/*
 * The key the walk w is about to make (from w->start_rip, start_rsp and
 * start_rbp, with the uretprobe trampoline w->trampoline, in process tgid,
 * whose mappings are of generation `generation`) would give, from an entry
 * of set whose every word is unchanged; CT_STACK_NONE if none. pages is the
 * level-0 page_cache element, used as one flat buffer: walk_user_stack
 * forgets its pages at every walk. A global function, as memo_remember: the
 * verifier checks each once, and their frames are not under the walk's.
 */
__noinline __u64 memo_answer(struct walk_state *w, struct ct_memo_set *set,
			     struct ct_user_pages *pages, __u32 tgid, __u32 generation)
{
	if (!w || !set || !pages)
		return CT_STACK_NONE;
	__u64 *buf = pages->slots[0].words;
	__u64 rip = w->start_rip, rsp = w->start_rsp, rbp = w->start_rbp;
	__u64 trampoline = w->trampoline;
	/* the words buf holds: [from, to) above rsp */
	__u32 from = 0, to = 0;

	for (__u32 way = 0; way < CT_MEMO_WAYS; way++) {
		struct ct_memo_entry *e = &set->ways[way];
		if (e->generation != generation || e->rip != rip || e->rsp != rsp ||
		    e->tgid != tgid || e->trampoline != trampoline ||
		    (e->uses_rbp && e->rbp != rbp))
			continue;
		__u32 first = e->first, end = first + e->span;
		if (first < from || end > to) {
			__u32 size = e->span * sizeof(__u64);
			/* a bound the verifier can follow (see read_user) */
			asm volatile("" : "+r"(size));
			if (size > sizeof(*pages) || size == 0)
				return CT_STACK_NONE;
			if (bpf_probe_read_user(buf, size, (void *)(rsp + first * sizeof(__u64))))
				return CT_STACK_NONE;
			from = first;
			to = end;
		}
		struct memo_words c = {
			.entry = e, .buf = buf, .w = w, .from = from, .n = e->nwords
		};
		w->memo_changed = 0;
		bpf_loop((c.n + MEMO_CHUNK - 1) / MEMO_CHUNK, compare_words, &c, 0);
		if (w->memo_changed == 0)
			return e->key;
	}
	return CT_STACK_NONE;
}

/*
 * Remembers the walk in w (from w->start_rip, start_rsp and start_rbp) in
 * process tgid, which gave key, in place of the oldest entry of set, if the
 * memo can answer for it (see above; that key is known to userspace is the
 * caller's to say). What the words read allow is found while they are
 * copied: an entry that turns out not to fit is left empty, and the next
 * walk takes its place.
 */
__noinline int memo_remember(struct ct_memo_set *set, struct walk_state *w, __u32 tgid, __u64 key)
{
	if (!set || !w)
		return 0;
	__u32 n = w->nwords;

	if (w->error != CT_WALK_COMPLETE || w->unfit || n == 0 || n > CT_MEMO_WORDS)
		return 0;
	struct ct_memo_entry *e = &set->ways[set->next & (CT_MEMO_WAYS - 1)];
	struct memo_words c = { .entry = e, .w = w, .n = n };
	w->memo_reach = 0;
	w->memo_lowest = CT_MEMO_REACH;
	w->memo_highest = 0;
	bpf_loop((n + MEMO_CHUNK - 1) / MEMO_CHUNK, copy_words, &c, 0);
	__u64 reach = w->memo_reach, lowest = w->memo_lowest, highest = w->memo_highest;
	if ((reach & (sizeof(__u64) - 1)) || reach >= CT_MEMO_REACH * sizeof(__u64) ||
	    highest - lowest >= CT_MEMO_SPAN_WORDS) {
		e->generation = 0;
		return 0;
	}
	set->next += 1;
	e->rip = w->start_rip;
	e->rsp = w->start_rsp;
	e->rbp = w->start_rbp;
	e->trampoline = w->trampoline;
	e->key = key;
	e->tgid = tgid;
	e->generation = w->generation;
	e->nwords = n;
	e->first = lowest;
	e->span = highest - lowest + 1;
	e->uses_rbp = w->uses_rbp;
	return 0;
}

#endif /* MEMO_BPF_H */
