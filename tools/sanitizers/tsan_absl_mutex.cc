// ThreadSanitizer and Debian's Abseil: libabsl_synchronization is not built
// with -fsanitize=thread, so TSan cannot see absl::Mutex lock and unlock and
// would report every access to data guarded by one as a race. Under
// --config=tsan the linker sends our calls to the Mutex and CondVar functions
// below (-Wl,--wrap, see BUILD.bazel), which call Abseil's and tell TSan
// what happened: releasing the mutex before it is given up (Unlock, and
// inside Await and CondVar::Wait), acquiring it once held again. That gives
// TSan the happens-before edges the mutex creates, which is what race
// detection needs; TSan's lock-order (deadlock) reports do not cover these
// mutexes.
//
// The names are Debian's Abseil 20220623 (inline namespace absl::debian3). If
// Abseil's ABI namespace changes, the __real_ references below fail to link:
// update the names with `nm -D libabsl_synchronization.so`.

#include <sanitizer/tsan_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#define ABSL_SYM(name) "_ZN4absl7debian3" name

namespace {

using absl::CondVar;
using absl::Condition;
using absl::Duration;
using absl::Mutex;
using absl::Time;

void Acquired(Mutex* mu) { __tsan_acquire(mu); }
void Releasing(Mutex* mu) { __tsan_release(mu); }

// Abseil evaluates a waiter's Condition holding the mutex, inside its own
// code (on the waiter's thread or on the one unlocking), and may give the
// mutex up right after: acquire before the condition reads what the mutex
// guards, release after.
struct Guarded {
  Mutex* mu;
  const Condition* condition;
};

bool AcquireAndEval(Guarded* g) {
  Acquired(g->mu);
  const bool met = g->condition->Eval();
  Releasing(g->mu);
  return met;
}

}  // namespace

// Each pair: Abseil's function (__real_) and ours (__wrap_), as free
// functions taking `this` first, as the x86-64 C++ ABI passes it.
#define WRAP(ret, sym, params) \
  extern "C++" ret Real_##sym params asm("__real_" ABSL_SYM(#sym)); \
  extern "C++" ret Wrap_##sym params asm("__wrap_" ABSL_SYM(#sym))

// void Mutex::Lock(), ReaderLock()
WRAP(void, 5Mutex4LockEv, (Mutex * mu));
void Wrap_5Mutex4LockEv(Mutex* mu) {
  Real_5Mutex4LockEv(mu);
  Acquired(mu);
}
WRAP(void, 5Mutex10ReaderLockEv, (Mutex * mu));
void Wrap_5Mutex10ReaderLockEv(Mutex* mu) {
  Real_5Mutex10ReaderLockEv(mu);
  Acquired(mu);
}

// void Mutex::Unlock(), ReaderUnlock()
WRAP(void, 5Mutex6UnlockEv, (Mutex * mu));
void Wrap_5Mutex6UnlockEv(Mutex* mu) {
  Releasing(mu);
  Real_5Mutex6UnlockEv(mu);
}
WRAP(void, 5Mutex12ReaderUnlockEv, (Mutex * mu));
void Wrap_5Mutex12ReaderUnlockEv(Mutex* mu) {
  Releasing(mu);
  Real_5Mutex12ReaderUnlockEv(mu);
}

// bool Mutex::TryLock(), ReaderTryLock()
WRAP(bool, 5Mutex7TryLockEv, (Mutex * mu));
bool Wrap_5Mutex7TryLockEv(Mutex* mu) {
  const bool locked = Real_5Mutex7TryLockEv(mu);
  if (locked) Acquired(mu);
  return locked;
}
WRAP(bool, 5Mutex13ReaderTryLockEv, (Mutex * mu));
bool Wrap_5Mutex13ReaderTryLockEv(Mutex* mu) {
  const bool locked = Real_5Mutex13ReaderTryLockEv(mu);
  if (locked) Acquired(mu);
  return locked;
}

// void Mutex::LockWhen(const Condition&), ReaderLockWhen(const Condition&)
WRAP(void, 5Mutex8LockWhenERKNS0_9ConditionE, (Mutex * mu, const Condition& c));
void Wrap_5Mutex8LockWhenERKNS0_9ConditionE(Mutex* mu, const Condition& c) {
  Guarded g{mu, &c};
  const Condition with_acquire(&AcquireAndEval, &g);
  Real_5Mutex8LockWhenERKNS0_9ConditionE(mu, with_acquire);
  Acquired(mu);
}
WRAP(void, 5Mutex14ReaderLockWhenERKNS0_9ConditionE, (Mutex * mu, const Condition& c));
void Wrap_5Mutex14ReaderLockWhenERKNS0_9ConditionE(Mutex* mu, const Condition& c) {
  Guarded g{mu, &c};
  const Condition with_acquire(&AcquireAndEval, &g);
  Real_5Mutex14ReaderLockWhenERKNS0_9ConditionE(mu, with_acquire);
  Acquired(mu);
}

// bool Mutex::LockWhenWithTimeout(const Condition&, Duration), ...WithDeadline(.., Time):
// the mutex is held on return either way.
WRAP(bool, 5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE,
     (Mutex * mu, const Condition& c, Duration d));
bool Wrap_5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE(Mutex* mu, const Condition& c,
                                                                      Duration d) {
  Guarded g{mu, &c};
  const Condition with_acquire(&AcquireAndEval, &g);
  const bool met = Real_5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE(mu, with_acquire, d);
  Acquired(mu);
  return met;
}
WRAP(bool, 5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE,
     (Mutex * mu, const Condition& c, Time t));
bool Wrap_5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE(Mutex* mu, const Condition& c,
                                                                   Time t) {
  Guarded g{mu, &c};
  const Condition with_acquire(&AcquireAndEval, &g);
  const bool met = Real_5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE(mu, with_acquire, t);
  Acquired(mu);
  return met;
}

// void Mutex::Await(const Condition&); bool AwaitWithTimeout(.., Duration),
// AwaitWithDeadline(.., Time): called holding the mutex, which they give up
// while waiting and hold again on return.
WRAP(void, 5Mutex5AwaitERKNS0_9ConditionE, (Mutex * mu, const Condition& c));
void Wrap_5Mutex5AwaitERKNS0_9ConditionE(Mutex* mu, const Condition& c) {
  Releasing(mu);
  Guarded g{mu, &c};
  const Condition with_acquire(&AcquireAndEval, &g);
  Real_5Mutex5AwaitERKNS0_9ConditionE(mu, with_acquire);
  Acquired(mu);
}
WRAP(bool, 5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE,
     (Mutex * mu, const Condition& c, Duration d));
bool Wrap_5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(Mutex* mu, const Condition& c,
                                                                   Duration d) {
  Releasing(mu);
  Guarded g{mu, &c};
  const Condition with_acquire(&AcquireAndEval, &g);
  const bool met = Real_5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(mu, with_acquire, d);
  Acquired(mu);
  return met;
}
WRAP(bool, 5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE,
     (Mutex * mu, const Condition& c, Time t));
bool Wrap_5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(Mutex* mu, const Condition& c,
                                                                Time t) {
  Releasing(mu);
  Guarded g{mu, &c};
  const Condition with_acquire(&AcquireAndEval, &g);
  const bool met = Real_5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(mu, with_acquire, t);
  Acquired(mu);
  return met;
}

// void CondVar::Wait(Mutex*); bool WaitWithTimeout(Mutex*, Duration),
// WaitWithDeadline(Mutex*, Time).
WRAP(void, 7CondVar4WaitEPNS0_5MutexE, (CondVar * cv, Mutex* mu));
void Wrap_7CondVar4WaitEPNS0_5MutexE(CondVar* cv, Mutex* mu) {
  Releasing(mu);
  Real_7CondVar4WaitEPNS0_5MutexE(cv, mu);
  Acquired(mu);
}
WRAP(bool, 7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE,
     (CondVar * cv, Mutex* mu, Duration d));
bool Wrap_7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(CondVar* cv, Mutex* mu, Duration d) {
  Releasing(mu);
  const bool timed_out = Real_7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(cv, mu, d);
  Acquired(mu);
  return timed_out;
}
WRAP(bool, 7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE, (CondVar * cv, Mutex* mu, Time t));
bool Wrap_7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(CondVar* cv, Mutex* mu, Time t) {
  Releasing(mu);
  const bool timed_out = Real_7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(cv, mu, t);
  Acquired(mu);
  return timed_out;
}
