/*
 * Hooks on allocator functions the wrappers cannot reach, included by
 * record.h (in-process recording only). See shared.h for the exchange with
 * cargo-trace, which says which functions and makes the bytes.
 *
 * A hooked function's entry is a `jmp rel32` to its slot's stub, in an area
 * this library maps within reach of that jump:
 *
 *   slot (HOOK_SLOT bytes, the area read-only and executable once written):
 *     +0   struct hook: the trampoline's address (the original function), the
 *          entry, the kind
 *     +24  stub: movabs $slot, %r11; jmp *0(%rip); .quad ctp_hook_entry
 *     +48  trampoline: the displaced instructions relocated, a jump back
 *
 * ctp_hook_entry pushes rbp, passes the slot and the frame (the caller's rbp,
 * then the return address into the program) to ctp_hooked, which records the
 * call as the wrapper of its kind records one, with the walk started where the
 * BPF path's probe of the function starts it (the BPF path's stack: the
 * function's entry, or the first instruction past moves that change neither
 * rsp, rbp nor memory, as the leaf frame, then its caller), and calls the
 * original through the trampoline. The hooked functions take at most four
 * arguments, so r8 and r9 are free to carry the slot and the frame.
 *
 * When: at the connection of each process image (its constructor, or its
 * first call if earlier), for the executable and the libraries loaded with
 * it, before main; for what a dlopen maps, when the dynamic linker calls
 * _dl_debug_state() with r_state RT_CONSISTENT: after it mapped the objects,
 * before it relocates them and runs their constructors. That function is a
 * lone `ret` in its 16 bytes of padding, hooked like the others (cargo-trace
 * checks the padding). Not a wrapper of dlopen: glibc's dlopen finds the
 * search paths (DT_RUNPATH, $ORIGIN) from its caller's return address, which
 * a wrapper would make the library's. A forked child keeps its parent's
 * hooks. Each entry is hooked once.
 *
 * Writes go through /proc/self/mem, which writes read-only text without
 * changing its protection (mprotect when it cannot be opened). An entry
 * whose 5 bytes lie in one aligned 8-byte word is written in one 8-byte
 * write; the kernel copies it with one store in practice, which a thread
 * running the entry meanwhile sees whole (none can at start, nor in an object
 * that dlopen has not returned yet).
 */
#include <link.h>
#include <sys/mman.h>

enum hook_limits {
	HOOK_SLOT = 128,
	HOOK_STUB_AT = 24,
	HOOK_CODE_AT = 48,
	HOOK_AREA = 64 * 1024,		 /* an area's bytes: 512 slots */
	HOOK_REACH = 1024 * 1024 * 1024, /* an area's distance from an entry, at most */
	HOOK_STEP = 1024 * 1024,	 /* between the places tried for an area */
	MAX_HOOKED = 1024,		 /* entries hooked in a process, at most */
	MAX_AREAS = 64,
};

/* What ctp_hooked reads of a slot. */
struct hook {
	uint64_t original; /* the trampoline */
	uint64_t leaf;	   /* where the walk starts (ctp_hook_target) */
	uint32_t kind; /* enum ctp_hook_kind */
	uint32_t pad;
};

_Static_assert(sizeof(struct hook) <= HOOK_STUB_AT, "a slot's head");
_Static_assert(HOOK_STUB_AT + 24 <= HOOK_CODE_AT, "a slot's stub");
_Static_assert(HOOK_CODE_AT + CTP_HOOK_ROOM <= HOOK_SLOT, "a slot's trampoline");
_Static_assert((uint64_t)MAX_AREAS * HOOK_AREA == HOOK_AREAS_BYTES, "the areas' bound");

/* The areas mapped and the entries hooked (kept across fork: the child has
 * them too). Touched under conn.lock or lookup_lock only. */
static struct {
	struct {
		uint64_t base;
		uint32_t used; /* slots */
	} areas[MAX_AREAS];
	uint32_t nareas;
	uint64_t hooked[MAX_HOOKED];
	uint32_t nhooked;
	int mem_fd;    /* /proc/self/mem, opened at the first write; -1: could not be */
	int mem_tried;
} hooks;

void ctp_hook_entry(void);


/* Writes len bytes at address, whatever its protection; 0 on success. */
static int write_code(uint64_t address, const void *bytes, size_t len)
{
	if (!hooks.mem_tried) {
		hooks.mem_tried = 1;
		hooks.mem_fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/mem", O_RDWR | O_CLOEXEC);
	}
	if (hooks.mem_fd >= 0 &&
	    syscall(SYS_pwrite64, hooks.mem_fd, bytes, len, (off_t)address) == (long)len)
		return 0;
	/* the fallback: the pages writable a moment, then read-only and executable again */
	uint64_t first = address & ~4095ULL;
	uint64_t end = (address + len + 4095) & ~4095ULL;
	if (mprotect((void *)first, end - first, PROT_READ | PROT_WRITE | PROT_EXEC))
		return -1;
	memcpy((void *)address, bytes, len);
	mprotect((void *)first, end - first, PROT_READ | PROT_EXEC);
	return 0;
}

/* Writes a hook's entry jump: in one aligned 8-byte write when it fits in one
 * word (see the top of this file). */
static int write_entry(uint64_t entry, const uint8_t *patch, size_t len)
{
	uint64_t word_at = entry & ~7ULL;
	if (len <= 8 && entry + len <= word_at + 8) {
		uint64_t word;
		memcpy(&word, (const void *)word_at, 8);
		memcpy((unsigned char *)&word + (entry - word_at), patch, len);
		return write_code(word_at, &word, 8);
	}
	return write_code(entry, patch, len);
}

static int within_reach(uint64_t a, uint64_t b)
{
	uint64_t distance = a > b ? a - b : b - a;
	return distance + HOOK_AREA <= HOOK_REACH;
}

/* A free slot within reach of entry, in an area mapped before or now; 0 if none. */
static uint64_t take_slot(uint64_t entry)
{
	for (uint32_t i = 0; i < hooks.nareas; i++)
		if (within_reach(hooks.areas[i].base, entry) &&
		    hooks.areas[i].used < HOOK_AREA / HOOK_SLOT)
			return hooks.areas[i].base + (uint64_t)hooks.areas[i].used++ * HOOK_SLOT;
	if (hooks.nareas == MAX_AREAS)
		return 0;
	/* below the object first (above it, a heap grows), then above, a step further
	 * each time; the kernel says where something is mapped already */
	uint64_t around = entry & ~(uint64_t)(HOOK_STEP - 1);
	for (uint64_t step = 1; step * HOOK_STEP < HOOK_REACH; step++) {
		for (int side = 0; side < 2; side++) {
			uint64_t hint = side == 0 ? around - step * HOOK_STEP : around + step * HOOK_STEP;
			if (hint < 0x10000 || !within_reach(hint, entry))
				continue;
			void *p = next.mmap((void *)hint, HOOK_AREA, PROT_READ | PROT_EXEC,
					    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
			if (p == MAP_FAILED)
				continue;
			if ((uint64_t)p != hint) {
				/* a kernel without MAP_FIXED_NOREPLACE put it elsewhere */
				if (!within_reach((uint64_t)p, entry)) {
					next.munmap(p, HOOK_AREA);
					continue;
				}
			}
			if (conn.region)
				__atomic_fetch_add(&conn.region->private_bytes, HOOK_AREA,
						   __ATOMIC_RELAXED);
			uint32_t i = hooks.nareas++;
			hooks.areas[i].base = (uint64_t)p;
			hooks.areas[i].used = 1;
			return (uint64_t)p;
		}
	}
	return 0;
}

static int is_hooked(uint64_t entry)
{
	for (uint32_t i = 0; i < hooks.nhooked; i++)
		if (hooks.hooked[i] == entry)
			return 1;
	return 0;
}

/* Receives one message of the kind wanted into buf; its length, or -1. */
static ssize_t receive_message(void *buf, size_t bytes, uint32_t kind)
{
	ssize_t got;
	do
		got = recv(conn.fd, buf, bytes, 0);
	while (got < 0 && errno == EINTR);
	if (got < (ssize_t)sizeof(uint32_t) || *(const uint32_t *)buf != kind)
		return -1;
	return got;
}

/*
 * Asks cargo-trace which functions to hook in the objects mapped now, and hooks
 * those not hooked yet. Called with the socket to itself (under conn.lock at
 * the connection, under lookup_lock after a dlopen), inside `internal`.
 */
static void place_hooks(void)
{
	size_t list_bytes = sizeof(struct ctp_msg_hook_list) +
			    CTP_MAX_HOOKS * sizeof(struct ctp_hook_target);
	size_t plan_bytes = sizeof(struct ctp_msg_hook_plan) +
			    CTP_MAX_HOOKS * sizeof(struct ctp_hook_where);
	size_t code_bytes = sizeof(struct ctp_msg_hook_code) +
			    CTP_MAX_HOOKS * sizeof(struct ctp_hook_code);
	size_t placed_bytes = sizeof(struct ctp_msg_hook_placed) + CTP_MAX_HOOKS * sizeof(uint64_t);
	size_t buf_bytes = (list_bytes + plan_bytes + code_bytes + placed_bytes + 4095) & ~4095UL;
	/* not counted in private_bytes: unmapped below */
	unsigned char *buf = next.mmap(NULL, buf_bytes, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return;
	struct ctp_msg_hook_list *list = (void *)buf;
	struct ctp_msg_hook_plan *plan = (void *)(buf + list_bytes);
	struct ctp_msg_hook_code *codes = (void *)(buf + list_bytes + plan_bytes);
	struct ctp_msg_hook_placed *placed = (void *)(buf + list_bytes + plan_bytes + code_bytes);
	struct ctp_hook_target *targets = (void *)(list + 1);
	struct ctp_hook_where *wheres = (void *)(plan + 1);
	struct ctp_hook_code *code = (void *)(codes + 1);
	uint64_t *failed = (void *)(placed + 1);

	struct ctp_msg_lookup ask = { .kind = CTP_MSG_HOOKS };
	if (send(conn.fd, &ask, sizeof(ask), MSG_NOSIGNAL) != (ssize_t)sizeof(ask))
		goto done;
	ssize_t got = receive_message(list, list_bytes, CTP_MSG_HOOK_LIST);
	if (got < (ssize_t)sizeof(*list) || list->ntargets > CTP_MAX_HOOKS ||
	    (size_t)got != sizeof(*list) + list->ntargets * sizeof(struct ctp_hook_target))
		goto done;
	uint32_t kinds[CTP_MAX_HOOKS];
	uint64_t leaves[CTP_MAX_HOOKS];
	*plan = (struct ctp_msg_hook_plan){ .kind = CTP_MSG_HOOK_PLAN };
	*placed = (struct ctp_msg_hook_placed){ .kind = CTP_MSG_HOOK_PLACED };
	for (uint32_t i = 0; i < list->ntargets; i++) {
		const struct ctp_hook_target *t = &targets[i];
		if (is_hooked(t->entry) || hooks.nhooked + plan->nhooks >= MAX_HOOKED)
			continue;
		uint64_t slot = take_slot(t->entry);
		if (!slot) {
			failed[placed->nfailed++] = t->entry;
			continue;
		}
		kinds[plan->nhooks] = t->kind;
		leaves[plan->nhooks] = t->leaf;
		wheres[plan->nhooks++] = (struct ctp_hook_where){
			.entry = t->entry,
			.stub = slot + HOOK_STUB_AT,
			.trampoline = slot + HOOK_CODE_AT,
			.room = CTP_HOOK_ROOM,
		};
	}
	if (plan->nhooks == 0)
		goto tell;
	size_t plan_len = sizeof(*plan) + plan->nhooks * sizeof(struct ctp_hook_where);
	if (send(conn.fd, plan, plan_len, MSG_NOSIGNAL) != (ssize_t)plan_len)
		goto done;
	got = receive_message(codes, code_bytes, CTP_MSG_HOOK_CODE);
	if (got < (ssize_t)sizeof(*codes) || codes->ncodes != plan->nhooks ||
	    (size_t)got != sizeof(*codes) + codes->ncodes * sizeof(struct ctp_hook_code))
		goto done;
	/* the slots first, every one of them whole, then the entries that jump there */
	for (uint32_t i = 0; i < codes->ncodes; i++) {
		const struct ctp_hook_code *c = &code[i];
		const struct ctp_hook_where *w = &wheres[i];
		if (c->refused || c->entry != w->entry || c->code_len > CTP_HOOK_ROOM ||
		    c->patch_len > CTP_HOOK_PATCH)
			continue;
		unsigned char slot[HOOK_SLOT];
		memset(slot, 0xcc, sizeof(slot));
		uint64_t base = w->stub - HOOK_STUB_AT;
		struct hook h = { .original = w->trampoline, .leaf = leaves[i], .kind = kinds[i] };
		memcpy(slot, &h, sizeof(h));
		unsigned char *stub = slot + HOOK_STUB_AT;
		uint64_t target = (uint64_t)(uintptr_t)&ctp_hook_entry;
		stub[0] = 0x49; /* movabs $base, %r11 */
		stub[1] = 0xbb;
		memcpy(stub + 2, &base, 8);
		stub[10] = 0xff; /* jmp *0(%rip) */
		stub[11] = 0x25;
		memset(stub + 12, 0, 4);
		memcpy(stub + 16, &target, 8);
		memcpy(slot + HOOK_CODE_AT, c->code, c->code_len);
		if (write_code(base, slot, sizeof(slot))) {
			failed[placed->nfailed++] = w->entry;
			continue;
		}
		if (write_entry(w->entry, c->patch, c->patch_len)) {
			failed[placed->nfailed++] = w->entry;
			continue;
		}
		hooks.hooked[hooks.nhooked++] = w->entry;
		placed->placed++;
	}
tell:;
	size_t placed_len = sizeof(*placed) + placed->nfailed * sizeof(uint64_t);
	send(conn.fd, placed, placed_len, MSG_NOSIGNAL);
done:
	next.munmap(buf, buf_bytes);
}

/* The dynamic linker's objects are consistent again (a dlopen mapped some): hooks
 * what they bring. */
static void hook_dlopened(void)
{
	if (!recording_mode || conn.state != CONN_UP || internal ||
	    _r_debug.r_state != RT_CONSISTENT)
		return;
	internal++;
	spin_lock(&conn.lookup_lock);
	if (conn.state == CONN_UP)
		place_hooks();
	spin_unlock(&conn.lookup_lock);
	internal--;
}

/* A hooked function, called by its stub through ctp_hook_entry: records the call
 * as the wrapper of its kind would and calls the original. Not static: the
 * entry calls it. */
__attribute__((visibility("hidden"), used)) uint64_t
ctp_hooked(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3, const struct hook *h,
	   const uint64_t *frame)
{
	typedef uint64_t (*original_fn)(uint64_t, uint64_t, uint64_t, uint64_t);
	original_fn original = (original_fn)(uintptr_t)h->original;

	if (h->kind == CTP_HOOK_DEBUG_STATE) {
		hook_dlopened();
		return original(a0, a1, a2, a3);
	}
	/* inside a wrapped or hooked call (an allocator calling its own API), the
	 * library's own calls (and dlsym's), or no recording: straight through */
	if (in_call || internal || !recording_mode) {
		if (in_call)
			inside_call();
		return original(a0, a1, a2, a3);
	}
	/* where the BPF path's probe walks from: its pc, the return address above */
	uint64_t rip = h->leaf, rsp = (uint64_t)(uintptr_t)(frame + 1), rbp = frame[0];
	uint64_t r, size;
	switch (h->kind) {
	case CTP_HOOK_FREE:
		if (a0)
			ctp_record_hooked(CTP_EV_FREE, a0, 0, rip, rsp, rbp);
		in_call++;
		r = original(a0, a1, a2, a3);
		in_call--;
		return r;
	case CTP_HOOK_REALLOC:
	case CTP_HOOK_REALLOC_ARRAY:
		if (h->kind == CTP_HOOK_REALLOC)
			size = a1;
		else if (__builtin_mul_overflow(a1, a2, &size))
			return original(a0, a1, a2, a3); /* fails, the block untouched */
		ctp_record_hooked(CTP_EV_RESIZING, a0, size, rip, rsp, rbp);
		in_call++;
		r = original(a0, a1, a2, a3);
		in_call--;
		ctp_record_hooked(CTP_EV_RESIZED, r, 0, rip, rsp, rbp);
		return r;
	case CTP_HOOK_XALLOCX:
		/* resized in place (a realloc that did not move, of the usable size
		 * capped at size + extra), or not at all */
		in_call++;
		r = original(a0, a1, a2, a3);
		in_call--;
		if (a0 && r >= a1) {
			uint64_t most = a1 + a2 < a1 ? UINT64_MAX : a1 + a2;
			ctp_record_hooked(CTP_EV_RESIZING, a0, r < most ? r : most, rip, rsp,
					  rbp);
			ctp_record_hooked(CTP_EV_RESIZED, a0, 0, rip, rsp, rbp);
		}
		return r;
	case CTP_HOOK_POSIX_MEMALIGN:
		in_call++;
		r = original(a0, a1, a2, a3);
		in_call--;
		ctp_record_hooked(CTP_EV_ALLOC,
				  (uint32_t)r == 0 ? *(const uint64_t *)(uintptr_t)a0 : 0, a2, rip,
				  rsp, rbp);
		return r;
	case CTP_HOOK_SIZE_ARG1:
		size = a1;
		break;
	case CTP_HOOK_CALLOC:
		size = a0 * a1;
		break;
	default:
		size = a0;
		break;
	}
	in_call++;
	r = original(a0, a1, a2, a3);
	in_call--;
	ctp_record_hooked(CTP_EV_ALLOC, r, size, rip, rsp, rbp);
	return r;
}

/* ctp_hook_entry: where every stub goes, with r11 = its slot, the stack as at the
 * hooked function's entry. rbp pushed: the frame ctp_hooked reads is the
 * entry's rbp and the return address. */
__asm__(".text\n"
	".globl ctp_hook_entry\n"
	".hidden ctp_hook_entry\n"
	".type ctp_hook_entry, @function\n"
	"ctp_hook_entry:\n"
	".cfi_startproc\n"
	"\tpushq %rbp\n"
	".cfi_adjust_cfa_offset 8\n"
	".cfi_rel_offset %rbp, 0\n"
	"\tmovq %r11, %r8\n"
	"\tmovq %rsp, %r9\n"
	"\tcall ctp_hooked\n"
	"\tpopq %rbp\n"
	".cfi_adjust_cfa_offset -8\n"
	".cfi_restore %rbp\n"
	"\tret\n"
	".cfi_endproc\n"
	".size ctp_hook_entry, .-ctp_hook_entry\n");
