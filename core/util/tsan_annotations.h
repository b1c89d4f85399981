#pragma once
// Hand-offs ThreadSanitizer cannot see by itself (through a library it does not instrument,
// e.g. Qt's event queue), declared to it: what one thread did before kvscopeRelease(x) happens
// before what another does after kvscopeAcquire(x). Nothing in other builds.

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
inline void kvscopeRelease(void* sync) { __tsan_release(sync); }
inline void kvscopeAcquire(void* sync) { __tsan_acquire(sync); }
#else
inline void kvscopeRelease(void*) {}
inline void kvscopeAcquire(void*) {}
#endif
