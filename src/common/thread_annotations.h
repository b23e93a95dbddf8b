// Clang's thread-safety annotations; no-ops on compilers without them.
#pragma once

#if defined(__clang__)
#define SLUICE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SLUICE_THREAD_ANNOTATION(x)
#endif

// The field is read and written only with `mu` held.
#define GUARDED_BY(mu) SLUICE_THREAD_ANNOTATION(guarded_by(mu))
// The function must be called with `mu` held.
#define REQUIRES(...) SLUICE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The function takes `mu` itself; callers must not hold it.
#define EXCLUDES(...) SLUICE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
