/* sbx-reseed.node: lets a node process parked in an L1 template make its user-space randomness
 * fresh in each clone, before any of the clone's code runs (docs/security.md, "Randomness in
 * clones").
 *
 * A node started in the template holds three generators that every clone would otherwise share,
 * each seeded once when the process started:
 *   - OpenSSL's DRBGs (crypto.randomBytes, randomUUID, getRandomValues, key generation, and the
 *     entropy V8 asks node for): the primary DRBG is reseeded from the kernel (which the clone's
 *     RESEED made fresh) plus fresh bytes as additional input; the per-thread public and private
 *     DRBGs (libuv's pool threads included) reseed from it on their next use, because their
 *     parent's reseed count changed, and this thread's two are reseeded here at once as well;
 *   - V8's per-isolate generator (base::RandomNumberGenerator, from which every context seeds its
 *     Math.random and objects get their identity hashes): given a new seed;
 *   - the Math.random state of the current (main) context: cleared, so that its next call seeds
 *     it from the isolate's generator just reseeded, as a fresh context does.
 * V8 has no public API for the last two; node's builds (Debian's libnode.so.108, the official
 * node 22 binary) export the internal functions that do it, found here with dlsym. `ready()`
 * says whether all of them are there: the bootstrap parks a node in a template only then
 * (guest/src/bootstrap.c). What stays
 * shared is listed in docs/security.md (the string hash seed, address-space layout).
 *
 * Loaded with process.dlopen(); the N-API functions it calls are node's stable C ABI, declared
 * here so that the build needs no node headers. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

/* N-API: opaque handles and the few entry points used (node_api.h, ABI-stable since node 8). */
typedef struct napi_env__ *napi_env;
typedef struct napi_value__ *napi_value;
typedef struct napi_callback_info__ *napi_callback_info;
typedef int napi_status; /* napi_ok == 0 */
typedef napi_value (*napi_callback)(napi_env env, napi_callback_info info);
#define NAPI_AUTO_LENGTH SIZE_MAX

napi_status napi_create_function(napi_env env, const char *utf8name, size_t length,
				 napi_callback cb, void *data, napi_value *result);
napi_status napi_set_named_property(napi_env env, napi_value object, const char *utf8name,
				    napi_value value);
napi_status napi_get_boolean(napi_env env, bool value, napi_value *result);
napi_status napi_get_undefined(napi_env env, napi_value *result);
napi_status napi_throw_error(napi_env env, const char *code, const char *msg);
__attribute__((visibility("default"))) napi_value napi_register_module_v1(napi_env env,
									napi_value exports);

/* The internal functions, by their Itanium-mangled names. Member functions take `this` first;
 * v8::Local<T> and v8::internal::Context are one pointer-sized word, passed and returned in a
 * register. A Local is the address of a handle slot that holds the object's tagged address. */
typedef void *(*isolate_get_current_fn)(void);
typedef void **(*isolate_get_current_context_fn)(void *isolate);
typedef void *(*isolate_rng_fn)(void *internal_isolate);
typedef void (*rng_set_seed_fn)(void *rng, int64_t seed);
typedef void (*math_random_reset_fn)(uintptr_t native_context);
typedef void *(*rand_get0_fn)(void *libctx);
typedef int (*evp_rand_reseed_fn)(void *ctx, int prediction_resistance, const unsigned char *ent,
				  size_t ent_len, const unsigned char *adin, size_t adin_len);

static struct {
	isolate_get_current_fn isolate_get_current;
	isolate_get_current_context_fn get_current_context;
	isolate_rng_fn isolate_rng;
	rng_set_seed_fn rng_set_seed;
	math_random_reset_fn math_random_reset;
	rand_get0_fn rand_get0_primary, rand_get0_public, rand_get0_private;
	evp_rand_reseed_fn evp_rand_reseed;
	const char *missing; /* the first symbol not found, or NULL */
} sym;

/* dlsym returns void *; POSIX guarantees it converts to a function pointer. */
#define LOOKUP(field, name)                                                       \
	do {                                                                      \
		void *p_ = dlsym(RTLD_DEFAULT, name);                             \
		if (p_ == NULL && sym.missing == NULL)                            \
			sym.missing = name;                                       \
		memcpy(&sym.field, &p_, sizeof(p_));                              \
	} while (0)

/* The first of two names found (a function whose mangled name changed between V8 versions). */
#define LOOKUP_EITHER(field, name, later_name)                                    \
	do {                                                                      \
		if (dlsym(RTLD_DEFAULT, name) != NULL)                            \
			LOOKUP(field, name);                                      \
		else                                                              \
			LOOKUP(field, later_name);                                \
	} while (0)

static void lookup_all(void)
{
	LOOKUP(isolate_get_current, "_ZN2v87Isolate10GetCurrentEv");
	LOOKUP(get_current_context, "_ZN2v87Isolate17GetCurrentContextEv");
	LOOKUP(isolate_rng, "_ZN2v88internal7Isolate23random_number_generatorEv");
	LOOKUP(rng_set_seed, "_ZN2v84base21RandomNumberGenerator7SetSeedEl");
	/* V8 10.2 (node 18) takes a Context; V8 12.4 (node 22) a Tagged<Context>: a class holding
	 * the same one word (the context's address), trivially copyable, so passed the same way. */
	LOOKUP_EITHER(math_random_reset, "_ZN2v88internal10MathRandom12ResetContextENS0_7ContextE",
		      "_ZN2v88internal10MathRandom12ResetContextENS0_6TaggedINS0_7ContextEEE");
	LOOKUP(rand_get0_primary, "RAND_get0_primary");
	LOOKUP(rand_get0_public, "RAND_get0_public");
	LOOKUP(rand_get0_private, "RAND_get0_private");
	LOOKUP(evp_rand_reseed, "EVP_RAND_reseed");
}

static napi_value undefined(napi_env env)
{
	napi_value v = NULL;
	napi_get_undefined(env, &v);
	return v;
}

static napi_value js_ready(napi_env env, napi_callback_info info)
{
	(void)info;
	napi_value v = NULL;
	napi_get_boolean(env, sym.missing == NULL, &v);
	return v;
}

static int fresh_bytes(uint8_t *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = getrandom(buf + got, n - got, 0);
		if (r <= 0)
			return -1; /* EINTR included: the caller throws, the run does not start */
		got += (size_t)r;
	}
	return 0;
}

/* What reseed() does; a message for the exception, or NULL. */
static const char *reseed_all(uint8_t seed[48])
{
	if (fresh_bytes(seed, 48) < 0)
		return "getrandom failed";
	/* OpenSSL: the primary DRBG (fresh entropy from its source plus 32 bytes of additional
	 * input), then this thread's two children at once. */
	void *drbgs[3] = {sym.rand_get0_primary(NULL), sym.rand_get0_public(NULL),
			  sym.rand_get0_private(NULL)};
	for (size_t i = 0; i < 3; i++) {
		const uint8_t *adin = i == 0 ? seed : seed + 32;
		size_t adin_len = i == 0 ? 32 : 8;
		if (drbgs[i] == NULL || sym.evp_rand_reseed(drbgs[i], 0, NULL, 0, adin, adin_len) != 1)
			return "EVP_RAND_reseed failed";
	}
	/* V8: the isolate's generator, then the main context's Math.random state. */
	void *isolate = sym.isolate_get_current();
	void **context_slot = isolate ? sym.get_current_context(isolate) : NULL;
	void *rng = isolate ? sym.isolate_rng(isolate) : NULL;
	if (context_slot == NULL || rng == NULL)
		return "no current isolate or context";
	int64_t v8_seed;
	memcpy(&v8_seed, seed + 40, sizeof(v8_seed));
	sym.rng_set_seed(rng, v8_seed);
	sym.math_random_reset((uintptr_t)*context_slot);
	return NULL;
}

static napi_value js_reseed(napi_env env, napi_callback_info info)
{
	(void)info;
	if (sym.missing != NULL) {
		napi_throw_error(env, NULL, sym.missing);
		return NULL;
	}
	uint8_t seed[48];
	const char *failed = reseed_all(seed);
	explicit_bzero(seed, sizeof(seed));
	if (failed != NULL) {
		napi_throw_error(env, NULL, failed);
		return NULL;
	}
	return undefined(env);
}

__attribute__((visibility("default"))) napi_value napi_register_module_v1(napi_env env,
									napi_value exports)
{
	lookup_all();
	static const struct {
		const char *name;
		napi_callback cb;
	} fns[] = {{"ready", js_ready}, {"reseed", js_reseed}};
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
		napi_value f = NULL;
		if (napi_create_function(env, fns[i].name, NAPI_AUTO_LENGTH, fns[i].cb, NULL, &f) != 0 ||
		    napi_set_named_property(env, exports, fns[i].name, f) != 0)
			return NULL;
	}
	return exports;
}
