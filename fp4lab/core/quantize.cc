// Quantize-dequantize of one operand in one call: x_hat of fp4lab.core.quantize
// .quantize_dequantize for the block-scaled rules of fp4lab.core.scaling that carry no
// cross-element search (NVFP4 "te" without four-over-six, MX "floor" and "ceil"), called
// through XLA's FFI (fp4lab.core.cpu_kernels builds this file; fp4lab.core.kernel_route
// decides when).
//
// Input x, float32, the quantizer's blocked view, one group after another: pa block rows of t1
// rows of nb * t2 elements, where block (r, b) holds elements b*t2 .. b*t2 + t2 - 1 of rows
// r*t1 .. r*t1 + t1 - 1 (the view's block axes are its third and first from the end); `unb`
// elements make one call of the unbatched program (a vmapped call stacks calls in front). Also
// per call: the stochastic rounding key words (uint32, 2) and a given tensor amax (float32, 1),
// read only when `sr` and `given` say so. Output: x_hat in the same view, float32, and per
// call, with `count`, the fraction of its elements that saturated (grid value +-max and
// |x| > |x_hat|: fp4lab.core.stats' `saturated`, the exact count divided as
// operand_stats.cc divides it; 0 without `count`).
//
// Every value is the reference's bit for bit (the tests hold the two paths to the same bits):
// the same float32 operations in the same order, in the floating-point environment of XLA's
// own CPU code (round to nearest even, flush-to-zero, denormals-are-zero), which this kernel
// sets on every thread for the call; the few steps the reference computes exactly below
// 2**-126 (fp4lab.core.subnormal: the reciprocal of S_enc, s_b * S_dec, amax / max) are
// computed here from the bits in double precision (float_bits.h), where they are exact or
// singly rounded:
//
//   block amax   max of |x|'s bits, NaN read as +inf (scaling._amax)
//   scope amax   per call ("tensor"), per block row ("row"), or the given one
//   NVFP4 "te"   S_enc = min(2688 / amax_scope, FLT_MAX) (1 where 0), S_dec = RN(1 / S_enc)
//                s_b = e4m3(min(amax_b * (S_enc * (1 / max_elem)), FLT_MAX))
//                e_b = min(1 / (s_b * S_dec), FLT_MAX), through RN(s_b * S_dec) * 2**64 for
//                S_dec < 2**-60;  q = elem(x * e_b)
//   MX           e = floor(log2 amax_b) - emax_elem, or ceil(log2 RN(amax_b / max_elem)),
//                clamped; q = elem(x * 2**-e), scale 2**e
//   x_hat        ((q * 1/2) * (2 s_b)) * S_dec', the factors of subnormal.dequantize_factors
//
// With `rotate` (the in-place view with t2 = 1, t1 the Hadamard's size), the operand is first
// rotated along each block row's t1 rows as fp4lab.core.hadamard.rotate does it, into the
// output, and quantized there: x * sign (where signed), times 2**-hk from the bits (exact, a
// result below 2**-126 a signed zero), the butterflies h = 1, 2, .., t1 / 2 ((a, b) ->
// (a + b, a - b)), times `rest` where it is not 1. A third output as large as x receives the
// rotated operand (for the statistics, which measure it); else it holds one unused value.
//
// Stochastic rounding draws element i's bits as fp4lab.core.prng.random_bits does: y0 ^ y1 of
// threefry2x32(key, (0, c)), c the element's position in the moved layout (`stream` 0: its
// position in the view; 1: the in-place view (P, L/tx, tx, Q/ty, ty) of blocks.stream_index).
// The work is shared with XLA's thread pool in parts of whole block rows; every element's value
// depends on its block and scope only, so the number of threads never changes a bit. The
// element loops (quantize_loops.h) exist once per instruction set, and attribute `clone` picks
// one per call: every clone gives the same bits too.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cpu_env.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#include "float_bits.h"  // F, U, Nan, Min, the steps below 2**-126, Exponent, Pow2

// The Threefry-2x32 hash of the counter (0, c): prng.random_bits' y0 ^ y1
inline uint32_t Rotl(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }
inline uint32_t Bits(uint32_t k0, uint32_t k1, uint32_t k2, uint32_t c) {
  uint32_t x0 = k0, x1 = c + k1;
  const uint32_t ks[3] = {k0, k1, k2};
#define FP4LAB_ROUND(r) \
  x0 += x1;             \
  x1 = Rotl(x1, r) ^ x0;
#define FP4LAB_GROUP(a, b, c, d, g)              \
  FP4LAB_ROUND(a) FP4LAB_ROUND(b) FP4LAB_ROUND(c) \
  FP4LAB_ROUND(d) x0 += ks[(g + 1) % 3];          \
  x1 += ks[(g + 2) % 3] + uint32_t(g + 1);
  FP4LAB_GROUP(13, 15, 26, 6, 0)
  FP4LAB_GROUP(17, 29, 16, 24, 1)
  FP4LAB_GROUP(13, 15, 26, 6, 2)
  FP4LAB_GROUP(17, 29, 16, 24, 3)
  FP4LAB_GROUP(13, 15, 26, 6, 4)
#undef FP4LAB_GROUP
#undef FP4LAB_ROUND
  return x0 ^ x1;
}

// The element format: kmin the biased exponent of its smallest normal binade, mbits, max.
struct Elem {
  int32_t kmin, mbits;
  float vmax;
};

// formats.round_to_format of v onto the element grid, RNE or with the random bits `bits`.
// y = |v| / quantum lies in [0, 2**(mbits + 2)): (y + 2**23) - 2**23 is y rounded to the nearest
// integer, ties to even, as lax.round's RNE and std::nearbyint give it, without a library call.
template <bool SR>
inline float Round(float v, const Elem& f, uint32_t bits) {
  const float av = F(U(v) & kAbs);
  const float a = av < f.vmax ? av : f.vmax;  // NaN: set again at the end
  const int32_t field = int32_t(U(a) >> 23) & 0xff;
  const int32_t k = std::max(field, f.kmin) - f.mbits;
  const float q = F(uint32_t(k) << 23), inv = F(uint32_t(254 - k) << 23);
  const float y = a * inv;
  const float t = (y + 0x1p23f) - 0x1p23f;
  float r;
  if (SR) {
    const float lo = t > y ? t - 1.0f : t;  // floor(y)
    const float u = float(bits >> 8) * 0x1p-24f;
    r = lo + (u < y - lo ? 1.0f : 0.0f);
  } else {
    r = t;
  }
  const float out = F(U(r * q) | (U(v) & kSign));
  return v != v ? Nan() : out;
}

enum Rule : int64_t { kTe = 0, kMxFloor = 1, kMxCeil = 2 };
enum Scope : int64_t { kNone = 0, kTensor = 1, kRow = 2 };

// What one scope contributes to its blocks' arithmetic.
struct ScopeTerms {
  float t = 1.0f;      // S_enc * (1 / max_elem) (NVFP4), unused by MX
  float s_dec = 1.0f;  // S_dec
  float outer = 1.0f;  // x_hat's last factor: S_dec (lifted by 2**64 where subnormal) or NaN
  float down = 1.0f;   // 2**-64 where S_dec was lifted
};

struct Params {
  int64_t pa, t1, nb, t2, unb, rule, sr, stream, emax;
  Elem elem;
  float inv_max;
  int64_t hk = 0;        // the rotation's 2**-hk (with `rotate`)
  bool signed_ = false;  // the rotation multiplies by its signs first
  float rest = 1.0f;     // and by rest after the butterflies
  bool count = false;    // count the saturated elements
};

ScopeTerms TeScope(float amax_scope, bool has_scope, float inv_max) {
  ScopeTerms s;
  s.t = inv_max;  // S_enc = 1 without a scope
  if (!has_scope) return s;
  float s_enc = Min(2688.0f / amax_scope, kFltMax);
  if (s_enc == 0.0f) s_enc = 1.0f;
  s.s_dec = Reciprocal(s_enc);
  s.t = s_enc * inv_max;
  const float outer = (U(amax_scope) & kAbs) < kInf ? s.s_dec : Nan();  // finite scope
  if (BelowNormal(outer)) {
    s.outer = static_cast<float>(Exact(outer) * 0x1p64);  // subnormal.lift: exact
    s.down = 0x1p-64f;
  } else {
    s.outer = outer;
  }
  return s;
}

// NVFP4 "te": block scale s_b = e4m3(min(amax_b * t, FLT_MAX)) (formats.round_scale onto E4M3:
// emin -6, 3 mantissa bits, max 448) and x_hat's scale (s_b, NaN for a non-finite amax)
inline void TeScale(uint32_t bmax, const ScopeTerms& s, float* s_b, float* scale) {
  const float v = Min(F(bmax) * s.t, kFltMax);
  const float a = Min(std::fabs(v), 448.0f);
  const int32_t field = int32_t(U(a) >> 23) & 0xff;
  const int32_t k = std::max(field, -6 + 127) - 3;
  const float inv = F(uint32_t(254 - k) << 23);
  const float y = a * inv;  // below 2**4: rounded to an integer, ties to even, as in Round
  const float r = (y + 0x1p23f) - 0x1p23f;
  *s_b = r / inv;
  *scale = (bmax < kInf ? r : Nan()) / inv;
}

// x_hat's scale factor: 2 * scale (read from the bits below 2**-126), times `down`
inline float ScaleFactor(float scale, const ScopeTerms& s) {
  const uint32_t b = U(scale);
  const float doubled = BelowNormal(scale) ? F(((b & kAbs) << 1) | (b & kSign)) : scale * 2.0f;
  return doubled * s.down;
}

// x's block (r, b) multiplier and x_hat's scale factor, from the block's amax bits
inline void BlockTerms(const Params& p, const ScopeTerms& s, uint32_t bmax, float* mul,
                       float* scale2) {
  const float amax_b = F(bmax);
  float scale;
  if (p.rule == kTe) {
    float s_b;
    TeScale(bmax, s, &s_b, &scale);
    const float plain = Min(1.0f / (s_b * s.s_dec), kFltMax);
    *mul = s.s_dec < 0x1p-60f ? Min((1.0f / ProductUp(s_b, s.s_dec)) * 0x1p64f, kFltMax) : plain;
  } else {
    int32_t e;
    if (p.rule == kMxFloor) {
      e = Exponent(amax_b > 0.0f ? amax_b : 1.0f) - int32_t(p.emax);
      e = amax_b > 0.0f ? std::max(-127, std::min(e, 127)) : -127;
    } else {
      e = CeilExponent(Divide(amax_b, p.elem.vmax));
    }
    e = std::min(e, 127 - int32_t(p.emax));
    *mul = Pow2(-e);
    scale = bmax < kInf ? Pow2(e) : Nan();
  }
  *scale2 = ScaleFactor(scale, s);
}

// Runs fn(i) for i in [0, n) on the calling thread and the pool's, each thread in XLA's float
// environment (cpu_env.h); returns when all are done. A helper that starts late finds nothing
// to take.
struct Shared {
  std::function<void(int64_t)> fn;
  int64_t n = 0;
  fp4lab_env::Env env = 0;
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mutex;
  std::condition_variable finished;
  void Run() {
    const fp4lab_env::Env own = fp4lab_env::Get();
    fp4lab_env::Set(env);
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      fn(i);
      if (done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(mutex);
        finished.notify_all();
      }
    }
    fp4lab_env::Set(own);
  }
};

void ParallelFor(ffi::ThreadPool& pool, int64_t n, std::function<void(int64_t)> fn) {
  if (n <= 0) return;
  auto shared = std::make_shared<Shared>();
  shared->fn = std::move(fn);
  shared->n = n;
  shared->env = fp4lab_env::Xla(fp4lab_env::Get());
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([shared] { shared->Run(); });
  shared->Run();
  std::unique_lock<std::mutex> lock(shared->mutex);
  shared->finished.wait(lock, [&] { return shared->done.load() == shared->n; });
}

// hadamard._times_pow2: v * 2**e (e <= 0) from the bits, a result below 2**-126 (or a
// subnormal v) a zero of v's sign, inf and NaN kept
inline float TimesPow2(float v, int32_t e) {
  if (e == 0) return v;
  const uint32_t b = U(v), field = (b >> 23) & 0xffu;
  if (field == 0xffu) return v;
  return field > uint32_t(-e) ? F(b - (uint32_t(-e) << 23)) : F(b & kSign);
}
// Whether an element saturated: its grid value g is +-max (bits vbits) and |x| > |x_hat|,
// compared as magnitude bits (the order of non-NaN floats; a NaN x or g is never counted, as
// the float comparisons give it), so that the loops stay free of branches
inline int32_t Saturated(float x, float g, float h, uint32_t vbits) {
  const uint32_t ax = U(x) & kAbs, ah = U(h) & kAbs;
  return int32_t(((U(g) & kAbs) == vbits) & (ax <= kInf) & (ax > ah));
}
// The element loops (quantize_loops.h), one copy per instruction set, each in its namespace.
// x86-64 with GCC or Clang: AVX-512F, AVX2 and the baseline (SSE2); elsewhere the baseline
// alone, built for the flags of the build (NEON on aarch64). Each call runs one clone: the
// best this CPU runs, or the one its `clone` attribute names (FP4LAB_CPU_CLONE, read by
// fp4lab.core.cpu_kernels), so the tests run every clone and the benchmarks a chosen one.
#define FP4LAB_Q_BYTES 16  // SSE2, NEON
namespace baseline {
#include "quantize_loops.h"
}  // namespace baseline
#undef FP4LAB_Q_BYTES

#if defined(__x86_64__) && defined(__GNUC__)
#define FP4LAB_Q_X86_CLONES 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define FP4LAB_Q_BYTES 32
namespace avx2 {
#include "quantize_loops.h"
}  // namespace avx2
#undef FP4LAB_Q_BYTES
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
#define FP4LAB_Q_BYTES 64
namespace avx512f {
#include "quantize_loops.h"
}  // namespace avx512f
#undef FP4LAB_Q_BYTES
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

// The clones, numbered as the `clone` attribute names them (0: the best this CPU runs).
enum Clone : int64_t { kBest = 0, kBaseline = 1, kAvx2 = 2, kAvx512f = 3 };

struct Loops {
  void (*rotate)(const float*, float*, const float*, const Params&, int64_t, int64_t);
  void (*block_max)(const float*, uint32_t*, const Params&, int64_t, int64_t);
  void (*quantize)(const float*, float*, const uint32_t*, const ScopeTerms*, const uint32_t*,
                   const Params&, int64_t, int64_t, std::atomic<int64_t>*);
};

// The clones this library holds and this CPU runs, as bits 1 << clone.
int64_t Runnable() {
  int64_t bits = int64_t{1} << kBaseline;
#ifdef FP4LAB_Q_X86_CLONES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) bits |= int64_t{1} << kAvx2;
  if (__builtin_cpu_supports("avx512f")) bits |= int64_t{1} << kAvx512f;
#endif
  return bits;
}

// The loops of `clone` (kBest: the widest this CPU runs); false where the CPU cannot run it.
bool PickLoops(int64_t clone, Loops* loops) {
  const int64_t runnable = Runnable();
  if (clone == kBest) clone = runnable >> kAvx512f & 1 ? kAvx512f : runnable >> kAvx2 & 1 ? kAvx2 : kBaseline;
  if (clone < kBaseline || clone > kAvx512f || !(runnable >> clone & 1)) return false;
#ifdef FP4LAB_Q_X86_CLONES
  if (clone == kAvx512f) {
    *loops = {avx512f::Rotate, avx512f::BlockMax, avx512f::Quantize};
    return true;
  }
  if (clone == kAvx2) {
    *loops = {avx2::Rotate, avx2::BlockMax, avx2::Quantize};
    return true;
  }
#endif
  *loops = {baseline::Rotate, baseline::BlockMax, baseline::Quantize};
  return true;
}

constexpr int64_t kPartElements = int64_t{1} << 15;

ffi::Error QuantizeBlocks(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U32> key,
                          ffi::Buffer<ffi::F32> amax, ffi::Buffer<ffi::F32> signs,
                          ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> sat,
                          ffi::ResultBuffer<ffi::F32> rotated,
                          int64_t pa, int64_t t1, int64_t nb,
                          int64_t t2, int64_t unb, int64_t rule, int64_t scope, int64_t given,
                          int64_t sr, int64_t stream, int64_t kmin, int64_t mbits, int64_t emax,
                          float vmax, float inv_max, int64_t rotate, int64_t hk, int64_t sign,
                          float rest, int64_t count, int64_t clone) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  const int64_t block_row = t1 * nb * t2;
  if (pa <= 0 || t1 <= 0 || nb <= 0 || t2 <= 0 || unb <= 0 || unb % (pa * block_row) != 0 ||
      n % unb != 0 || static_cast<int64_t>(out->element_count()) != n || rule < 0 || rule > 2 ||
      scope < 0 || scope > 2) {
    return ffi::Error::InvalidArgument("fp4lab_quantize: the buffers do not match the view");
  }
  const int64_t calls = n / unb;
  if (static_cast<int64_t>(key.element_count()) != 2 * calls ||
      static_cast<int64_t>(amax.element_count()) != calls ||
      static_cast<int64_t>(sat->element_count()) != calls) {
    return ffi::Error::InvalidArgument(
        "fp4lab_quantize: one key, one amax and one saturation count per call");
  }
  if (rotate && (t2 != 1 || hk < 0 || hk > 30 ||
                 static_cast<int64_t>(signs.element_count()) != calls * t1)) {
    return ffi::Error::InvalidArgument("fp4lab_quantize: a rotation needs t2 = 1 and t1 signs");
  }
  Loops loops;
  if (!PickLoops(clone, &loops)) {
    return ffi::Error::InvalidArgument(
        "fp4lab_quantize: this library or this CPU has no such clone (fp4lab_quantize_clones)");
  }
  Params p{pa, t1, nb, t2, unb, rule, sr, stream, emax,
           Elem{int32_t(kmin), int32_t(mbits), vmax}, inv_max, hk, sign != 0, rest, count != 0};
  const int64_t units = n / block_row, per_call = unb / block_row;
  const int64_t grain = std::max<int64_t>(1, kPartElements / block_row);
  const int64_t parts = (units + grain - 1) / grain;
  const float* X = x.typed_data();
  float* O = out->typed_data();
  if (rotate) {  // the rotated operand goes to `rotated` where asked, else to the output,
                 // and is quantized from there
    float* R = static_cast<int64_t>(rotated->element_count()) == n ? rotated->typed_data() : O;
    ParallelFor(pool, parts, [&](int64_t c) {
      loops.rotate(X, R, signs.typed_data(), p, c * grain, std::min(units, (c + 1) * grain));
    });
    X = R;
  }
  std::vector<uint32_t> bmax(units * nb);
  ParallelFor(pool, parts, [&](int64_t c) {
    loops.block_max(X, bmax.data(), p, c * grain, std::min(units, (c + 1) * grain));
  });
  // the scopes: one per call ("tensor", or the given amax), per block row ("row"), or none
  std::vector<ScopeTerms> terms(units);
  const float* A = amax.typed_data();
  for (int64_t call = 0; call < calls; ++call) {
    const int64_t u0 = call * per_call;
    uint32_t top = 0;
    if (scope == kTensor && !given) {
      for (int64_t j = u0 * nb; j < (u0 + per_call) * nb; ++j) top = std::max(top, bmax[j]);
    }
    const float whole = given ? A[call] : F(top);
    for (int64_t u = u0; u < u0 + per_call; ++u) {
      float amax_scope = whole;
      if (scope == kRow) {
        uint32_t r = 0;
        for (int64_t b = 0; b < nb; ++b) r = std::max(r, bmax[u * nb + b]);
        amax_scope = F(r);
      }
      terms[u] = rule == kTe ? TeScope(amax_scope, scope != kNone, inv_max) : ScopeTerms{};
    }
  }
  const uint32_t* K = key.typed_data();
  std::vector<std::atomic<int64_t>> saturated(calls);  // exact counts, in any order
  for (auto& c : saturated) c = 0;
  ParallelFor(pool, parts, [&](int64_t c) {
    loops.quantize(X, O, bmax.data(), terms.data(), K, p, c * grain, std::min(units, (c + 1) * grain),
             saturated.data());
  });
  float* S = sat->typed_data();
  for (int64_t call = 0; call < calls; ++call) {
    S[call] = static_cast<float>(saturated[call].load()) / static_cast<float>(unb);
  }
  return ffi::Error::Success();
}

}  // namespace

// The clones of the element loops that this library holds and this CPU runs: bit 1 << c for
// clone c (1 baseline, 2 avx2, 3 avx512f), what fp4lab.core.cpu_kernels offers.
extern "C" int64_t fp4lab_quantize_clones() { return Runnable(); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(fp4lab_quantize, QuantizeBlocks,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("pa")
                                  .Attr<int64_t>("t1")
                                  .Attr<int64_t>("nb")
                                  .Attr<int64_t>("t2")
                                  .Attr<int64_t>("unb")
                                  .Attr<int64_t>("rule")
                                  .Attr<int64_t>("scope")
                                  .Attr<int64_t>("given")
                                  .Attr<int64_t>("sr")
                                  .Attr<int64_t>("stream")
                                  .Attr<int64_t>("kmin")
                                  .Attr<int64_t>("mbits")
                                  .Attr<int64_t>("emax")
                                  .Attr<float>("vmax")
                                  .Attr<float>("inv_max")
                                  .Attr<int64_t>("rotate")
                                  .Attr<int64_t>("hk")
                                  .Attr<int64_t>("sign")
                                  .Attr<float>("rest")
                                  .Attr<int64_t>("count")
                                  .Attr<int64_t>("clone"));
