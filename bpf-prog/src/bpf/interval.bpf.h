/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * interval:UNIT:N, included by trace.bpf.c after its event programs. An
 * interval probe is one cpu-clock timer on one CPU, so that it fires N times
 * a period whatever the machine's size; the traced process runs on any CPU.
 * A firing while a traced process runs on the timer's CPU is counted with
 * its stacks, as a profile sample; any other firing is still the target's
 * (the user reads N firings a period while the target lives), counted under
 * interval_target with no stack (CT_LOSS_TARGET_ELSEWHERE says how many).
 *
 * The timer runs from its attach to its detach, but counts only while
 * interval_target is set: from the moment the target is let run to the end
 * of tracing, the span the session reports. Before, the target is held at
 * its entry while the rest is attached, which takes a second on a loaded
 * machine; after, the links are detached, which can take as long.
 */
#ifndef INTERVAL_BPF_H
#define INTERVAL_BPF_H

/* The target's tgid while tracing runs (Tracer::set_interval_target), 0
 * before and after: no firing is counted then. */
volatile __u32 interval_target = 0;

SEC("perf_event")
int on_interval(struct bpf_perf_event_data *ctx)
{
	__u32 target = interval_target;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (!target)
		return 0;
	if (tgid && pid_wanted(tgid)) {
		count_sample(ctx, tgid);
		return 0;
	}
	struct event_stacks none = { CT_STACK_NONE, CT_STACK_NONE };
	count_loss(CT_LOSS_TARGET_ELSEWHERE);
	count_event(none, target, bpf_get_attach_cookie(ctx), 0);
	return 0;
}

#endif /* INTERVAL_BPF_H */
