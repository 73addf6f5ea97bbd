// The floating-point environment of a kernel's threads: read the calling thread's, set it on
// the pool's helpers for the call, restore theirs after (operand_stats.cc, quantize.cc).
//
// XLA's CPU code runs in round to nearest even with flush-to-zero and denormals-are-zero, so
// a float32 result below 2**-126 there is a zero, and so is such an operand. The kernels that
// promise XLA's bits compute in that environment on every thread:
//
//   x86-64   MXCSR: rounding bits 13-14 cleared (nearest even), FTZ (bit 15), DAZ (bit 6)
//   aarch64  FPCR: RMode bits 22-23 cleared (nearest even), FZ (bit 24), which flushes the
//            subnormal operands and results of single and double precision alike
//
// Other CPUs: no kernel (the build stops here, and fp4lab uses its jnp reference).

#ifndef FP4LAB_CPU_ENV_H_
#define FP4LAB_CPU_ENV_H_

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

namespace fp4lab_env {
using Env = uint32_t;
inline Env Get() { return _mm_getcsr(); }
inline void Set(Env e) { _mm_setcsr(e); }
inline Env Xla(Env e) { return (e & ~0x6000u) | 0x8040u; }
}  // namespace fp4lab_env

#elif defined(__aarch64__)

namespace fp4lab_env {
using Env = uint64_t;
inline Env Get() {
  uint64_t e;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(e));
  return e;
}
inline void Set(Env e) { __asm__ __volatile__("msr fpcr, %0" : : "r"(e)); }
inline Env Xla(Env e) { return (e & ~(uint64_t{3} << 22)) | (uint64_t{1} << 24); }
}  // namespace fp4lab_env

#else
#error "fp4lab's CPU kernels set the float environment of x86-64 and aarch64 CPUs only"
#endif

#endif  // FP4LAB_CPU_ENV_H_
