/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Off-CPU time (`cargo trace offcpu`), included by trace.bpf.c after its
 * event programs: on_off_cpu runs at every context switch (the sched_switch
 * raw tracepoint, on every CPU) and weighs the stacks of a traced thread by
 * the nanoseconds it spent off the CPU, as bcc's offcputime does:
 *
 *   prev (current) leaves:  its user and kernel stacks taken now, while its
 *                           memory is the current one, kept by thread id
 *                           with the time;
 *   next comes back:        now - that time counted as the event's amount
 *                           under those stacks, if at least
 *                           off_cpu_min_block_ns.
 *
 * The stacks cannot wait for the switch in: then the thread's memory is not
 * the current one, and a tracing program cannot read another process's.
 *
 * Now and then a thread is back on a CPU with no sched_switch naming it next
 * (seen here about twice in a thousand 10-ms sleeps, under load): its stay is
 * still there at its next switch out. It is counted then, as the time since
 * it left less the time it ran since (the scheduler's sum_exec_runtime at both
 * switch outs), which needs no switch in.
 * A thread switched out while exiting is never back: it is left out. A
 * preempted thread counts too (its time off the CPU is the target's time
 * lost all the same), as offcputime counts every state by default.
 */
#ifndef OFFCPU_BPF_H
#define OFFCPU_BPF_H

#define CT_PF_EXITING 0x00000004

/* Set by userspace before load (bpf_prog::Options::off_cpu_min_block_ns). */
const volatile __u64 off_cpu_min_block_ns = 0;

/* Traced threads off the CPU, by thread id (userspace sizes it: the
 * max_off_cpu_threads option). Every thread switched out
 * comes back, if only to die: its entry goes then. Not an LRU map: LRU hash
 * maps evict from their per-CPU lists long before they are full (one stay
 * in about ten runs of the offcpu test was lost so). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* thread id */
	__type(value, struct ct_off_cpu_start);
	__uint(max_entries, 65536);
} off_cpu_starts SEC(".maps");

/* A stay off the CPU that lasted away ns, counted under its stacks if long
 * enough. */
static __always_inline void count_stay(const struct ct_off_cpu_start *stay, __u64 away)
{
	struct event_stacks stacks = { stay->user_stack, stay->kernel_stack };

	if (away >= off_cpu_min_block_ns)
		count_event(stacks, stay->tgid, stay->probe_id, away);
}

/* A stay whose thread came back with no switch in seen, counted at its next
 * switch out (at now, the thread having run ran ns in all): away is the time
 * since it left less the time it ran since. */
static __always_inline void count_unseen(const struct ct_off_cpu_start *stay, __u64 now, __u64 ran)
{
	__u64 elapsed = now - stay->since, ran_since = ran - stay->ran;

	if (elapsed > ran_since)
		count_stay(stay, elapsed - ran_since);
}

/* The thread next_tid comes back: its stay, if one is kept, is counted. */
__noinline int end_stay(__u32 next_tid)
{
	struct ct_off_cpu_start *left = bpf_map_lookup_elem(&off_cpu_starts, &next_tid);

	if (left) {
		struct ct_off_cpu_start back = *left;

		bpf_map_delete_elem(&off_cpu_starts, &next_tid);
		count_stay(&back, bpf_ktime_get_ns() - back.since);
	}
	return 0;
}

/* The current thread tid leaves, exiting: never back, a stay of its still
 * open (ran: its sum_exec_runtime) is counted now. */
__noinline int end_exiting_stay(__u32 tid, __u64 ran)
{
	struct ct_off_cpu_start *unseen = bpf_map_lookup_elem(&off_cpu_starts, &tid);

	if (unseen) {
		struct ct_off_cpu_start back = *unseen;

		bpf_map_delete_elem(&off_cpu_starts, &tid);
		count_unseen(&back, bpf_ktime_get_ns(), ran);
	}
	return 0;
}

/* The current thread tid of tgid leaves: its stay starts now, under its
 * stacks, for probe_id. */
__noinline int start_stay(__u32 tid, __u32 tgid, __u64 user_stack, __u64 kernel_stack,
			  __u32 probe_id)
{
	struct task_struct *prev = bpf_get_current_task_btf();
	struct ct_off_cpu_start start = {
		.user_stack = user_stack,
		.kernel_stack = kernel_stack,
		/* after the walk: the walk is time on the CPU */
		.since = bpf_ktime_get_ns(),
		.ran = prev->se.sum_exec_runtime,
		.tgid = tgid,
		.probe_id = probe_id,
	};
	/* One map operation on the common path: a stay still there is the rare
	 * one whose switch in went unseen. */
	long err = bpf_map_update_elem(&off_cpu_starts, &tid, &start, BPF_NOEXIST);
	if (err == -EEXIST) {
		struct ct_off_cpu_start *unseen = bpf_map_lookup_elem(&off_cpu_starts, &tid);
		if (unseen) {
			struct ct_off_cpu_start back = *unseen;

			count_unseen(&back, start.since, start.ran);
		}
		err = bpf_map_update_elem(&off_cpu_starts, &tid, &start, BPF_ANY);
	}
	if (err)
		count_loss(CT_LOSS_OFF_CPU_FULL);
	return 0;
}

/* raw_tp sched_switch: args are (bool preempt, struct task_struct *prev,
 * struct task_struct *next, unsigned int prev_state). The stays' bookkeeping
 * is in global functions: their locals are then off the program's own
 * frame, which is under the walk's in the BPF stack's 512 bytes. */
SEC("raw_tp")
int on_off_cpu(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *next = (struct task_struct *)ctx->args[2];

	end_stay(BPF_CORE_READ(next, pid));

	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 tid = (__u32)pid_tgid;
	if (!tgid || !pid_wanted(tgid))
		return 0;
	struct task_struct *prev = bpf_get_current_task_btf();
	if (prev->flags & CT_PF_EXITING) {
		end_exiting_stay(tid, prev->se.sum_exec_runtime);
		return 0;
	}
	struct event_stacks stacks = take_stacks_from_kernel(ctx, tgid);
	start_stay(tid, tgid, stacks.user, stacks.kernel, bpf_get_attach_cookie(ctx));
	return 0;
}

#endif /* OFFCPU_BPF_H */
