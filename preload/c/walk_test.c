/*
 * The walker of walk.h over a snapshot, for the differential test against
 * unwind_tables::walk (preload/tests/walk.rs): built as a test object of its
 * own (libctp-walk-test.so), never part of the library. Memory reads go
 * through the caller's function.
 */
#include <stddef.h>
#include <stdint.h>

#include "shared.h"

typedef int (*ctp_test_read)(void *ctx, uint64_t addr, uint64_t *value);

struct walk_env {
	const struct ctp_mapping *mappings;
	uint32_t nmappings;
	const unsigned char *tables;
	ctp_test_read read;
	void *ctx;
};

static const struct ctp_mapping *walk_mapping(struct walk_env *env, uint64_t addr)
{
	for (uint32_t i = 0; i < env->nmappings; i++)
		if (env->mappings[i].start <= addr && addr < env->mappings[i].end)
			return &env->mappings[i];
	return NULL;
}

static int walk_read(struct walk_env *env, uint64_t addr, uint64_t *value)
{
	return env->read(env->ctx, addr, value);
}

static const unsigned char *walk_tables(struct walk_env *env)
{
	return env->tables;
}

/* No rule cache: every frame searched, as the twin does. */
static int walk_cached(struct walk_env *env, uint64_t lookup, struct ctp_rule *rule,
		       uint32_t *object, uint64_t *bias)
{
	(void)env, (void)lookup, (void)rule, (void)object, (void)bias;
	return 0;
}

static void walk_cache(struct walk_env *env, uint64_t lookup, const struct ctp_rule *rule,
		       uint32_t object, uint64_t bias)
{
	(void)env, (void)lookup, (void)rule, (void)object, (void)bias;
}

#include "walk.h"

/* Walks from the registers; frames gets up to CTP_MAX_FRAMES frames. Returns
 * the number of frames, with the end and an unsupported row's reason. */
__attribute__((visibility("default"))) uint32_t
ctp_test_walk(const struct ctp_mapping *mappings, uint32_t nmappings, const unsigned char *tables,
	      ctp_test_read read, void *ctx, uint64_t rip, uint64_t rsp, uint64_t rbp, uint64_t rdi,
	      int has_rdi, uint64_t *frames, uint16_t *end, uint16_t *reason)
{
	static __thread struct ctp_walk w;
	struct walk_env env = { mappings, nmappings, tables, read, ctx };

	ctp_walk_stack(&env, &w, rip, rsp, rbp, rdi, has_rdi);
	for (uint32_t i = 0; i < w.len; i++)
		frames[i] = w.frames[i];
	*end = w.end;
	*reason = w.reason;
	return w.len;
}
