// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * cargo-trace's in-kernel stack walker and aggregator.
 *
 * Every event (uprobe, uretprobe, perf sample, tracepoint) takes the user
 * registers of the current thread, walks its stack with the unwind tables
 * userspace loaded (walk.bpf.h; docs/walk.md is the contract, shared with
 * unwind_tables::walk), sends the stack to userspace the first time it is
 * seen (the kernel keeps its hash) and adds the event to the counter of
 * (stack, kernel stack, process, probe). An event program is two calls:
 * take_stacks (walk and store the stacks, return their keys) and
 * count_event (add one event and an amount under those keys). Userspace
 * drains the new stacks from a ring buffer and reads the counts when it
 * wants.
 *
 * Where the time goes (benches/uprobe.rs measures it): helper calls are
 * dear where the kernel mitigates return speculation (~90 ns for one
 * bpf_probe_read_user on the machines measured), so the hot path avoids
 * them. Per event: the process lookup, one bpf_probe_read_user per 4 KiB
 * page of stack touched, a look in this CPU's cache of known stacks and a
 * lookup of the counter. Per frame, no helper call (see walk.bpf.h).
 *
 * What the verifier takes (Linux 6.18 checks a bpf_loop callback until its
 * state converges, and counts every frame of a call chain, callbacks
 * included, in one 512-byte stack): the walk and what surrounds it are
 * global functions (take_user_stack, memo_answer, memo_remember,
 * store_kernel_stack, unregistered_mapping, uretprobe_return, tell_frees,
 * the off-CPU stays' bookkeeping), each checked once
 * per program whatever its callers' state, with their locals off the event
 * program's frame; nothing a callback leaves on its caller's stack changes
 * from one call to the next; and values whose range depends on how a loop
 * ended are forgotten before they index (forget_range). A walking program
 * verifies in about 260K instructions of the million allowed, its deepest
 * chain of frames in about 430 bytes.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "cargo_trace.h"
#include "walk.bpf.h"
#include "memo.bpf.h"

#define CT_SIGSTOP 19
#define CT_PF_KTHREAD 0x00200000
#define CT_NR_RT_SIGRETURN 15 /* x86-64 */
#define CT_SYSCALL_INSN_LEN 2
/* orig_ax of a kernel entry by an exception without an error code (int3) */
#define CT_ORIG_AX_EXCEPTION ((__u64)-1)

#define EEXIST 17

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by userspace before load (bpf_prog::Options). */
const volatile __u8 filter_uprobes = 0; /* uprobes count only pids in pid_filter */
const volatile __u8 filter_events = 1;	/* same for perf events and tracepoints */
const volatile __u8 kernel_stacks = 1;	/* record kernel stacks of kernel-mode events */
const volatile __u8 use_walk_memo = 1;	/* the walk memo answers and remembers (memo.bpf.h) */

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
const volatile enum ct_frame anchor_frame;
const volatile enum ct_walk_end anchor_walk_end;
const volatile enum ct_loss anchor_loss;
const volatile enum ct_record_kind anchor_record_kind;
/* Records are written to the ring buffer, which has no value type. */
const volatile struct ct_count_record anchor_count_record;

/*
 * Stack storage. The kernel keeps only the stacks it has sent: key -> check
 * (16 bytes a stack, whatever its depth). A new stack goes to userspace
 * once, header and frames only, through the records ring buffer, which
 * userspace drains every few tens of milliseconds (bpf_prog's
 * Tracer::drain_records) into its own store. Elements are allocated on use:
 * the set costs what it holds.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);   /* stack key */
	__type(value, __u64); /* its ct_stack.check */
	__uint(max_entries, 1 << 20);
} known_stacks SEC(".maps");

/* New stacks (struct ct_stack, cut to their frames) and counts the counts
 * map had no room for (struct ct_count_record). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} records SEC(".maps");

/* Allocated on use, like known_stacks: a large cap costs nothing until used,
 * and an event it cannot take goes through the records ring buffer. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ct_count_key);
	__type(value, struct ct_count);
	__uint(max_entries, 1 << 20);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, CT_WALK_END_COUNT);
} walk_ends SEC(".maps");

/* Walks the memo answered (see memo.bpf.h), counted in walk_ends too. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} memo_hits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, CT_LOSS_COUNT);
} losses SEC(".maps");

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

/* See CT_KNOWN_CACHE_SLOTS: an element per CPU, sized by userspace to the
 * number of possible CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_known_cache);
	__uint(max_entries, 64);
} known_cache SEC(".maps");

/* What an event's stacks are built in: the user stack's walk, and the kernel
 * stack. One per nesting level (see CT_NEST_LEVELS). */
struct event_scratch {
	struct walk_state walk;
	struct ct_stack kstack;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct event_scratch);
	__uint(max_entries, CT_NEST_LEVELS);
} scratch SEC(".maps");

/* Per CPU: bit l set while a walk holds level l. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} levels SEC(".maps");

static __always_inline void count_in(void *counters, __u32 index)
{
	__u64 *value = bpf_map_lookup_elem(counters, &index);

	if (value)
		*value += 1;
}

static __always_inline void count_loss(enum ct_loss loss)
{
	count_in(&losses, loss);
}

/*
 * Stack storage: each distinct stack sent once, by hash.
 */

/* Sends stack, under key, to userspace: its header and its frames only.
 * True if the ring buffer took it. */
static __always_inline bool send_stack(struct ct_stack *stack, __u64 key)
{
	__u32 len = stack->len;

	if (len > CT_MAX_FRAMES)
		len = CT_MAX_FRAMES;
	stack->kind = CT_RECORD_STACK;
	stack->key = key;
	__u64 size = sizeof(*stack) - sizeof(stack->pcs) + len * sizeof(__u64);
	return bpf_ringbuf_output(&records, stack, size, BPF_RB_NO_WAKEUP) == 0;
}

/*
 * Makes sure userspace has the stack, under hash or, after a collision, the
 * next free key; returns that key, or CT_STACK_NOT_STORED when
 * CT_STACK_SLOTS colliding stacks hold them all. A new stack is claimed in
 * known_stacks and then sent; if the ring buffer is full the claim is
 * withdrawn, so that the next event with this stack sends it again, and the
 * event is counted under the key all the same (CT_LOSS_STACK_RING_FULL: a
 * stack that never arrives is reported as such). A stack known_stacks has
 * no room for is sent without a claim, every time it is met.
 *
 * A stack known under hash itself goes into this CPU's cache, asked first,
 * and *settled is set: the stack is userspace's (or on its way) under its
 * own hash, and nothing was counted lost, so storing it again would change
 * nothing (the walk memo relies on it). One race makes an entry untrue:
 * another CPU that meets the stack between its claim and a failed send
 * caches it, and sends it no more; the stack then arrives when any other
 * CPU meets it after the ring buffer drained, and until it does userspace
 * shows those events under a lost stack. Two walks of one CPU (nesting
 * levels) may write an entry at once; a torn entry pairs a key with another
 * stack's check and misses.
 */
static __always_inline __u64 store_stack(struct ct_stack *stack, __u64 hash,
					 struct ct_known_cache *known, __u32 *settled)
{
	struct ct_known_entry *seen = &known->entries[hash & (CT_KNOWN_CACHE_SLOTS - 1)];
	__u64 check = stack->check;

	*settled = false;
	if (seen->key == hash && seen->check == check) {
		*settled = true;
		return hash;
	}
	for (int slot = 0; slot < CT_STACK_SLOTS; slot++) {
		__u64 key = hash + slot;
		__u64 *old = bpf_map_lookup_elem(&known_stacks, &key);

		if (!old) {
			long err = bpf_map_update_elem(&known_stacks, &key, &check, BPF_NOEXIST);
			if (err == 0) {
				if (send_stack(stack, key))
					goto known;
				bpf_map_delete_elem(&known_stacks, &key);
				count_loss(CT_LOSS_STACK_RING_FULL);
				return key;
			}
			if (err == -EEXIST)
				/* another CPU claimed this key just now */
				old = bpf_map_lookup_elem(&known_stacks, &key);
			if (!old) {
				count_loss(CT_LOSS_KNOWN_STACKS_FULL);
				if (send_stack(stack, key))
					goto cache;
				count_loss(CT_LOSS_STACK_RING_FULL);
				return key;
			}
		}
		if (*old == check)
			goto known;
		count_loss(CT_LOSS_HASH_COLLISION);
		continue;
known:
		*settled = slot == 0;
cache:
		if (slot == 0) {
			seen->key = hash;
			seen->check = check;
		}
		return key;
	}
	count_loss(CT_LOSS_STACK_NOT_STORED);
	return CT_STACK_NOT_STORED;
}

/* A finished stack hash as a stack key: clear of the reserved keys, and of
 * wrapping in store_stack. */
static __always_inline __u64 stack_key(__u64 hash)
{
	if (hash < CT_STACK_FIRST || hash > ~0ULL - CT_STACK_SLOTS)
		return CT_STACK_FIRST;
	return hash;
}

/* Finishes the hashes of stack (its frames' hash and check so far) over its
 * length and stop reason: sets stack->check, returns its key. */
static __always_inline __u64 finish_hashes(struct ct_stack *stack, __u64 hash, __u64 check)
{
	__u64 tail = ((__u64)stack->len << 32) | ((__u64)stack->error << 16) | stack->reason;

	stack->check = fmix64(check_step(check, tail));
	return stack_key(fmix64(hash_step(hash, tail)));
}

/*
 * Taking an event's stacks.
 */

/* Whether the current task is inside execve (where the kernel has it). */
static __always_inline bool current_in_execve(void)
{
	struct task_struct *task = bpf_get_current_task_btf();

	if (!bpf_core_field_exists(task->in_execve))
		return false;
	return BPF_CORE_READ_BITFIELD_PROBED(task, in_execve);
}

/*
 * Walks the user stack (see walk_user_stack) from the registers the caller
 * put in w->start_rip, start_rsp, start_rbp and start_rdi, counts how the
 * walk ended and stores the stack in known (this CPU's cache of known
 * stacks); returns its key. At nesting level 0 the walk memo may answer
 * instead (memo.bpf.h), a walk counted as it would have ended, and
 * remembers the walk otherwise. CT_STACK_NONE when the event has no user
 * stack after all: inside execve, a walk that fails found the image that
 * called execve gone (its registers, but the new image's memory) or the
 * new image not registered yet (registers at its entry point, where nothing
 * of it has run; also just after execve, in the kernel still: no process
 * but one that is loading). Such an event is counted as CT_LOSS_IN_EXEC,
 * with its kernel stack only, rather than as a walk that failed.
 *
 * A global function: the verifier checks it once per program, on its own,
 * whatever the state of its callers (the nesting level, the program's own
 * paths); inlined, each event program had the walk checked for every way
 * of reaching it, up to a million instructions on Linux 6.18. Its
 * registers come through w because a global function takes 5 arguments.
 */
__noinline __u64 take_user_stack(struct walk_state *w, struct ct_known_cache *known, __u32 level,
				 __u32 tgid)
{
	if (!w || !known)
		return CT_STACK_NONE;
	__u64 rip = w->start_rip, rsp = w->start_rsp;
	struct ct_proc *proc = bpf_map_lookup_elem(&procs, &tgid);
	__u64 trampoline = uretprobe_trampoline();

	if (use_walk_memo && level == 0 && proc) {
		__u32 cpu = bpf_get_smp_processor_id();
		__u32 pages_key = cpu * CT_NEST_LEVELS;
		struct ct_user_pages *pages = bpf_map_lookup_elem(&page_cache, &pages_key);
		struct ct_memo_set *memo = memo_set(cpu, tgid, rip, rsp);
		if (memo && pages) {
			w->trampoline = trampoline;
			__u64 key = memo_answer(w, memo, pages, tgid, proc->generation);
			if (key != CT_STACK_NONE) {
				count_in(&walk_ends, CT_WALK_COMPLETE);
				count_in(&memo_hits, 0);
				return key;
			}
		}
	}
	walk_user_stack(w, level, proc, trampoline);
	if (w->error != CT_WALK_COMPLETE &&
	    (current_in_execve() ||
	     (w->error == CT_WALK_NO_PROC && bpf_map_lookup_elem(&loading, &tgid)))) {
		count_loss(CT_LOSS_IN_EXEC);
		return CT_STACK_NONE;
	}
	count_in(&walk_ends, w->error);
	__u32 settled;
	__u64 key = store_stack(&w->stack, finish_hashes(&w->stack, w->hash, w->check), known,
				&settled);
	/* The CPU asked and the set looked up again: a value the verifier
	 * knows something of (the CPU below the map's size, a pointer or NULL)
	 * live across the walk would have it check the walk once for each. */
	if (use_walk_memo && w->use_rule_cache && settled) {
		struct ct_memo_set *memo =
			memo_set(bpf_get_smp_processor_id(), tgid, w->start_rip, w->start_rsp);
		if (memo)
			memo_remember(memo, w, tgid, key);
	}
	return key;
}

/*
 * Stores the kernel stack of `bytes` bytes in k (as bpf_get_stack gave it)
 * as take_user_stack does the user stack; returns its key. A global
 * function: its loop is verified once, and not on the event program's
 * stack.
 */
__noinline __u64 store_kernel_stack(struct ct_stack *k, struct ct_known_cache *known, __u32 len)
{
	if (!k || !known)
		return CT_STACK_NONE;
	__u64 hash = 0, check = 0x2545f4914f6cdd1dULL;
	for (__u32 i = 0; i < CT_KSTACK_DEPTH; i++) {
		if (i >= len)
			break;
		hash = hash_step(hash, k->pcs[i]);
		check = check_step(check, k->pcs[i]);
	}
	k->len = len;
	k->error = CT_WALK_COMPLETE;
	k->reason = 0;
	__u32 settled;
	return store_stack(k, finish_hashes(k, hash, check), known, &settled);
}

/*
 * Takes the kernel stack of the event into k and stores it; returns its
 * key, or CT_STACK_NONE if the kernel gave none.
 */
static __always_inline __u64 take_kernel_stack(struct ct_stack *k, struct ct_known_cache *known,
					       void *ctx)
{
	long bytes = bpf_get_stack(ctx, k->pcs, CT_KSTACK_DEPTH * sizeof(__u64), 0);

	if (bytes <= 0) {
		count_loss(CT_LOSS_KSTACK_LOST);
		return CT_STACK_NONE;
	}
	return store_kernel_stack(k, known, bytes / sizeof(__u64));
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

/* The keys an event is counted under (struct ct_count_key without its
 * probe): CT_STACK_NONE for a stack it does not have. */
struct event_stacks {
	__u64 user;
	__u64 kernel;
};

/*
 * Walks and stores the event's stacks, in a nesting level of its own: the
 * user stack walked from rip, rsp, rbp, rdi (none if rip is 0; trap: the
 * thread entered the kernel by an exception, see after_breakpoint), the
 * kernel stack of kctx (none if NULL). Without a free level, the event has no
 * stacks (CT_LOSS_TOO_NESTED).
 */
static __always_inline struct event_stacks take_stacks(void *kctx, __u32 tgid, __u64 rip,
						       __u64 rsp, __u64 rbp, __u64 rdi, bool trap)
{
	struct event_stacks keys = { CT_STACK_NONE, CT_STACK_NONE };
	__u32 zero = 0;
	__u32 *held = rip || kctx ? bpf_map_lookup_elem(&levels, &zero) : NULL;

	if (!held)
		return keys;
	__u32 level = claim_level(held);
	if (level >= CT_NEST_LEVELS) {
		count_loss(CT_LOSS_TOO_NESTED);
		return keys;
	}
	__u32 cpu = bpf_get_smp_processor_id();
	struct ct_known_cache *known = bpf_map_lookup_elem(&known_cache, &cpu);
	struct event_scratch *s = bpf_map_lookup_elem(&scratch, &level);
	if (s && known) {
		if (rip) {
			s->walk.start_rip = rip;
			s->walk.start_rsp = rsp;
			s->walk.start_rbp = rbp;
			s->walk.start_rdi = rdi;
			s->walk.start_trap = trap;
			keys.user = take_user_stack(&s->walk, known, level, tgid);
		}
		if (kctx)
			keys.kernel = take_kernel_stack(&s->kstack, known, kctx);
	}
	__sync_fetch_and_and(held, ~(1U << level));
	return keys;
}

/* Adds one event and amount to the counter of (stacks, tgid, probe_id). */
static __always_inline void count_event(struct event_stacks stacks, __u32 tgid, __u32 probe_id,
					__u64 amount)
{
	struct ct_count_key key = {
		.stack_hash = stacks.user,
		.kstack_hash = stacks.kernel,
		.pid = tgid,
		.probe_id = probe_id,
	};
	struct ct_count *count = bpf_map_lookup_elem(&counts, &key);

	if (!count) {
		struct ct_count first = { .events = 1, .amount = amount };
		long err = bpf_map_update_elem(&counts, &key, &first, BPF_NOEXIST);
		if (err == 0)
			return;
		if (err == -EEXIST)
			count = bpf_map_lookup_elem(&counts, &key);
		if (!count) {
			/* no room (or no memory just now): userspace adds it. Built
			 * in the ring buffer: a copy on the BPF stack would add its
			 * 56 bytes to every event program's share of the 512. */
			struct ct_count_record *record =
				bpf_ringbuf_reserve(&records, sizeof(*record), 0);
			if (!record) {
				count_loss(CT_LOSS_COUNT_LOST);
				return;
			}
			record->kind = CT_RECORD_COUNT;
			record->pad = 0;
			record->key = key;
			record->count = first;
			bpf_ringbuf_submit(record, BPF_RB_NO_WAKEUP);
			count_loss(CT_LOSS_COUNT_MAP_FULL);
			return;
		}
	}
	__sync_fetch_and_add(&count->events, 1);
	if (amount)
		__sync_fetch_and_add(&count->amount, amount);
}

/*
 * The event programs.
 */
static __always_inline bool pid_wanted(__u32 tgid)
{
	return bpf_map_lookup_elem(&pid_filter, &tgid) != NULL;
}

/* The stacks of an event that fired in kernel mode: its kernel stack (unless
 * turned off), and the user registers saved at kernel entry. Kernel threads,
 * and processes whose memory exit released, have none (rip 0: no user
 * stack), and are counted as what they are. */
static __always_inline struct event_stacks take_stacks_from_kernel(void *ctx, __u32 tgid)
{
	struct task_struct *task = bpf_get_current_task_btf();
	void *kctx = kernel_stacks ? ctx : NULL;

	if (!task->mm) {
		count_loss(task->flags & CT_PF_KTHREAD ? CT_LOSS_KERNEL_THREAD : CT_LOSS_EXITING);
		return take_stacks(kctx, tgid, 0, 0, 0, 0, false);
	}
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	__u64 ip = regs->ip;
	/* In rt_sigreturn, rip is past the signal trampoline's last instruction,
	 * the syscall, and so outside its unwind info: walk from the syscall. */
	if (regs->orig_ax == CT_NR_RT_SIGRETURN)
		ip -= CT_SYSCALL_INSN_LEN;
	return take_stacks(kctx, tgid, ip, regs->sp, regs->bp, regs->di,
			   regs->orig_ax == CT_ORIG_AX_EXCEPTION);
}

/* uprobe and uretprobe: ctx holds the user registers (at a uretprobe, rip
 * is already the return address and rsp the caller's). */
#define USER_PROBE_PROGRAM(name, section)                                                    \
	SEC(section)                                                                         \
	int name(struct pt_regs *ctx)                                                        \
	{                                                                                    \
		__u32 tgid = bpf_get_current_pid_tgid() >> 32;                               \
		if (filter_uprobes && !pid_wanted(tgid))                                     \
			return 0;                                                            \
		struct event_stacks stacks =                                                 \
			take_stacks(NULL, tgid, ctx->ip, ctx->sp, ctx->bp, ctx->di, false);  \
		count_event(stacks, tgid, bpf_get_attach_cookie(ctx), 0);                    \
		return 0;                                                                    \
	}

USER_PROBE_PROGRAM(on_uprobe, "uprobe")
USER_PROBE_PROGRAM(on_uretprobe, "uretprobe")

/* Counts without walking: the baseline the benchmark compares against. */
SEC("uprobe")
int on_uprobe_count(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct event_stacks none = { CT_STACK_NONE, CT_STACK_NONE };

	if (filter_uprobes && !pid_wanted(tgid))
		return 0;
	count_event(none, tgid, bpf_get_attach_cookie(ctx), 0);
	return 0;
}

/* Counts a perf sample of process tgid with its stacks. */
static __always_inline void count_sample(struct bpf_perf_event_data *ctx, __u32 tgid)
{
	__u64 ip = ctx->regs.ip;
	struct event_stacks stacks;
	if ((__s64)ip < 0)
		/* kernel half of the address space: sampled in kernel mode */
		stacks = take_stacks_from_kernel(ctx, tgid);
	else
		stacks = take_stacks(NULL, tgid, ip, ctx->regs.sp, ctx->regs.bp, ctx->regs.di,
				     false);
	count_event(stacks, tgid, bpf_get_attach_cookie(ctx), 0);
}

SEC("perf_event")
int on_perf_event(struct bpf_perf_event_data *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (filter_events && !pid_wanted(tgid))
		return 0;
	count_sample(ctx, tgid);
	return 0;
}

/* Events that fire in the kernel, in the context of some task, whose user
 * stack is the one saved at kernel entry: tracepoints, kprobes and
 * kretprobes, raw tracepoints. */
#define KERNEL_EVENT_PROGRAM(name, section)                                                  \
	SEC(section)                                                                         \
	int name(void *ctx)                                                                  \
	{                                                                                    \
		__u32 tgid = bpf_get_current_pid_tgid() >> 32;                               \
		if (filter_events && !pid_wanted(tgid))                                      \
			return 0;                                                            \
		struct event_stacks stacks = take_stacks_from_kernel(ctx, tgid);             \
		count_event(stacks, tgid, bpf_get_attach_cookie(ctx), 0);                    \
		return 0;                                                                    \
	}

KERNEL_EVENT_PROGRAM(on_tracepoint, "tracepoint")
KERNEL_EVENT_PROGRAM(on_kprobe, "kprobe")
KERNEL_EVENT_PROGRAM(on_raw_tracepoint, "raw_tp")

#include "offcpu.bpf.h"
#include "interval.bpf.h"

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
/* 16 bytes a report: room for 4096 processes stopped at once, resized by
 * userspace to the processes traced (--max-processes). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 10);
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
/* Set by userspace as its session ends (Tracer::end_following): no process is
 * stopped any more, nothing reading the reports. The links may outlive that
 * moment a little (their release is left to run on its own). */
volatile __u8 following_ended = 0;

static __always_inline void stop_for_mappings(__u32 tgid)
{
	if (following_ended)
		return;
	__u32 *slot = bpf_ringbuf_reserve(&new_images, sizeof(*slot), 0);

	if (!slot) {
		/* userspace finds it by polling, later: its first steps
		 * may run before its mappings are known */
		count_loss(CT_LOSS_NEW_IMAGES_FULL);
		return;
	}
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
	if (bpf_map_update_elem(&pid_filter, &child_tgid, &one, BPF_ANY)) {
		/* not followed */
		count_loss(CT_LOSS_PID_FILTER_FULL);
		return 0;
	}
	bpf_map_update_elem(&parents, &child_tgid, &parent_tgid, BPF_ANY);
	struct ct_proc *proc = bpf_map_lookup_elem(&procs, &parent_tgid);
	if (proc && bpf_map_update_elem(&procs, &child_tgid, proc, BPF_ANY))
		/* its walks end with CT_WALK_NO_PROC until userspace registers it */
		count_loss(CT_LOSS_PROCS_FULL);
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

/* The heap profiler: on_alloc, on_resize, on_alloc_return, on_free. */
#include "alloc.bpf.h"
