// Clang's thread-safety annotations; no-ops on compilers without them. The analysis runs with
// clang's -Wthread-safety (`make check-thread-safety`) on the types of common/mutex.h, since
// libstdc++'s std::mutex carries no annotations.
#pragma once

#if defined(__clang__)
#define SLUICE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SLUICE_THREAD_ANNOTATION(x)
#endif

// The class is a lock ("mutex").
#define CAPABILITY(name) SLUICE_THREAD_ANNOTATION(capability(name))
// The class holds a lock for its lifetime (RAII).
#define SCOPED_CAPABILITY SLUICE_THREAD_ANNOTATION(scoped_lockable)
// The field is read and written only with `mu` held. (abseil's legacy header, which gRPC's pull
// in, defines the same annotation under this name; whichever comes first serves.)
#ifndef GUARDED_BY
#define GUARDED_BY(mu) SLUICE_THREAD_ANNOTATION(guarded_by(mu))
#endif
// The function must be called with `mu` held.
#define REQUIRES(...) SLUICE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The function takes `mu` itself; callers must not hold it.
#define EXCLUDES(...) SLUICE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function acquires / releases the lock (this object's when no argument is given).
#define ACQUIRE(...) SLUICE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) SLUICE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
