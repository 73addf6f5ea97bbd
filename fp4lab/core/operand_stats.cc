// The statistics of one quantized operand in one pass over x and its grid values:
// fp4lab.core.stats, method "fused", called through XLA's FFI (fp4lab.core.cpu_kernels builds
// this file on first use).
//
// Inputs, float32, one group after another (a vmapped call stacks groups in front): x and the
// element grid values q in the quantizer's blocked view, pa block rows of t1 rows of nb * t2
// elements, where block (r, b) holds elements b*t2 .. b*t2 + t2 - 1 of rows
// r*t1 .. r*t1 + t1 - 1 (the view's block axes are its third and first from the end); the
// block scales s, pa x nb (block (r, b)), and the outer scales o, pa x t1 (row i of block
// row r). x_hat = (q * s) * o, the quantizer's dequantization (fp4lab.core.quantize
// .dequantize_blocks) as the same two float32 multiplications, computed in the floating-point
// environment of the thread that calls the kernel (on XLA's CPU threads: flush-to-zero and
// denormals-are-zero, as in XLA's own code), which the pool's threads take on for the call;
// so x_hat here is the quantizer's x_hat bit for bit, never written to memory.
// Output, float32 per group: rel_err, bias, flush, saturated, underflow (fp4lab.schema.STATS
// less map4).
//
//   rel_err    sqrt(sum (x_hat - x)^2) / sqrt(sum x^2)   0 for an all-zero operand
//   bias       sum (x_hat - x) / sum |x|                 0 for an all-zero operand
//   flush      #(x != 0 and x_hat == 0) / max(#(x != 0), 1)
//   saturated  #(|q| == vmax and |x| > |x_hat|) / #elements
//   underflow  #(blocks with some x != 0 and every x_hat == 0) / #blocks
//
// rel_err and bias are NaN where x holds a NaN or an infinity. The float sums run in double
// precision over 8 lanes (element k of a row adds into lane k % 8) within parts of about 64K
// elements (whole block rows, fixed by the shape), which the threads of XLA's pool share;
// the parts are then added in order, lane by lane. So the products are exact and the sums
// the same IEEE operations in the same order whatever the number of threads and on every
// x86-64 CPU (built with -ffp-contract=off; the generic loop's AVX-512, AVX2 and baseline
// clones compute the same eight lanes, as one, two or four vector registers, and so does the
// AVX-512 loop of 16-wide masks, `RowsAvx512`, with the two halves of each vector in turn).
// The counts are exact; the fractions are correctly rounded float32 divisions.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "cpu_env.h"  // the calling thread's float environment, taken on by the helpers
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32), aligned(4)));
typedef double v8d __attribute__((vector_size(64), aligned(8)));  // lane l: element k % 8 == l

inline v8f Load(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline v8f Abs(const v8f& x) {
  v8f v = x;
  v8i bits;
  std::memcpy(&bits, &v, sizeof v);
  bits &= 0x7fffffff;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// exact; written lane by lane, which GCC turns into one conversion where the CPU has it
inline v8d Wide(const v8f& v) { return v8d{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}; }

inline v8f Splat(float v) { return v8f{} + v; }

inline bool Any(const v8i& m) {  // a lane of m is set: three shuffled ORs, then lane 0
  const v8i a = m | __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3);
  const v8i b = a | __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5);
  return (b[0] | b[1]) != 0;
}

inline void Or(int32_t* p, const v8i& m) {  // p[0..7] |= m
  v8i v;
  std::memcpy(&v, p, sizeof v);
  v |= m;
  std::memcpy(p, &v, sizeof v);
}

// The sums and counts of one group: eight lanes, and a scalar tail for rows whose length is
// not a multiple of 8 (and block widths that are neither 1 nor a multiple of 8).
struct Acc {
  v8d sxx = {}, see = {}, sab = {}, ser = {};
  v8i nz = {}, fl = {}, sat = {};
  double tail[4] = {0, 0, 0, 0};
  int64_t nz64 = 0, fl64 = 0, sat64 = 0, chunks = 0;

  // Eight contiguous elements of x and q, with their block scales s and outer scales o: their
  // x_hat is (q * s) * o. Sets the lanes' masks of x != 0 and x_hat != 0.
  inline void Chunk(const float* xp, const float* qp, const v8f& s, const v8f& o, float vmax,
                    v8i& mx, v8i& mh) {
    const v8f x = Load(xp), q = Load(qp);
    const v8f h = (q * s) * o;
    const v8f ax = Abs(x), ah = Abs(h);
    const v8d xd = Wide(x), d = Wide(h) - xd;
    sxx += xd * xd;
    see += d * d;
    sab += Wide(ax);
    ser += d;
    mx = x != 0.0f;
    mh = h != 0.0f;
    nz -= mx;  // masks are -1 where true
    fl -= mx & ~mh;
    sat -= (Abs(q) == vmax) & (ax > ah);
    ++chunks;
  }

  // One element; returns its x_hat.
  inline float Scalar(float x, float v, float s, float o, float vmax) {
    const float h = (v * s) * o;
    const double xd = x, d = static_cast<double>(h) - xd;
    tail[0] += xd * xd;
    tail[1] += d * d;
    tail[2] += std::fabs(xd);
    tail[3] += d;
    const int64_t m = x != 0.0f;
    nz64 += m;
    fl64 += m & (h == 0.0f);
    sat64 += (std::fabs(v) == vmax) & (std::fabs(x) > std::fabs(h));
    return h;
  }

  inline void Flush() {  // the int32 lane counts into int64, before a lane could overflow
    for (int l = 0; l < 8; ++l) {
      nz64 += nz[l];
      fl64 += fl[l];
      sat64 += sat[l];
    }
    nz = fl = sat = v8i{};
    chunks = 0;
  }
};

// The per-CPU copies of the hot loop, picked at load time. A build may define FP4LAB_CLONES
// (empty: one copy for the -m flags it is built with; the clones' determinism test does) and
// FP4LAB_STATS_SYMBOL (the handler's name, so such a build registers beside the default one).
#ifndef FP4LAB_CLONES
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FP4LAB_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FP4LAB_CLONES
#endif
#endif
#ifndef FP4LAB_STATS_SYMBOL
#define FP4LAB_STATS_SYMBOL fp4lab_operand_stats
#endif

// The partial sums and counts of block rows r0 .. r1 - 1 of one group (pa block rows of t1
// rows of nb * t2 elements).
struct Part {
  Acc a;
  int64_t under = 0;
};

FP4LAB_CLONES void Rows(const float* __restrict X, const float* __restrict Q,
                        const float* __restrict S, const float* __restrict O, int64_t r0,
                        int64_t r1, int64_t t1, int64_t nb, int64_t t2, float vmax, Part& p) {
  Acc a;  // a local: its lanes stay in registers
  std::vector<int32_t> live(nb), hot(nb);
  const int64_t row = nb * t2;
  for (int64_t r = r0; r < r1; ++r) {
    std::fill(live.begin(), live.end(), 0);
    std::fill(hot.begin(), hot.end(), 0);
    const float* s = S + r * nb;  // the block scales of this block row
    for (int64_t i = 0; i < t1; ++i) {
      const int64_t off = (r * t1 + i) * row;
      const float *x = X + off, *q = Q + off;
      const float o = O[r * t1 + i];
      const v8f ov = Splat(o);
      v8i mx, mh;
      if (t2 % 8 == 0) {  // whole chunks inside each block
        for (int64_t b = 0; b < nb; ++b) {
          const v8f sv = Splat(s[b]);
          v8i ox = {}, oh = {};
          for (int64_t k = b * t2; k < (b + 1) * t2; k += 8) {
            a.Chunk(x + k, q + k, sv, ov, vmax, mx, mh);
            ox |= mx;
            oh |= mh;
          }
          live[b] |= Any(ox);
          hot[b] |= Any(oh);
        }
      } else if (t2 == 1) {  // one chunk spans eight blocks, each with its own scale
        int64_t k = 0;
        for (; k + 8 <= row; k += 8) {
          a.Chunk(x + k, q + k, Load(s + k), ov, vmax, mx, mh);
          Or(live.data() + k, mx);
          Or(hot.data() + k, mh);
        }
        for (; k < row; ++k) {
          const float h = a.Scalar(x[k], q[k], s[k], o, vmax);
          live[k] |= x[k] != 0.0f;
          hot[k] |= h != 0.0f;
        }
      } else {
        for (int64_t k = 0; k < row; ++k) {
          const float h = a.Scalar(x[k], q[k], s[k / t2], o, vmax);
          live[k / t2] |= x[k] != 0.0f;
          hot[k / t2] |= h != 0.0f;
        }
      }
      if (a.chunks > (int64_t{1} << 28)) a.Flush();
    }
    for (int64_t b = 0; b < nb; ++b) p.under += (live[b] != 0) & (hot[b] == 0);
  }
  a.Flush();
  p.a = a;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(FP4LAB_NO_AVX512)
#define FP4LAB_AVX512 1
#define FP4LAB_TARGET __attribute__((target("avx512f,popcnt")))

// The AVX-512 loop, for blocks whose width is a multiple of 16 (a 16-wide vector lies in one
// block) or 1 (a vector spans 16 blocks): the same sums as `Rows` (the low 8 elements of a
// vector into lanes 0..7, then the high 8 into lanes 0..7, as two of its chunks), the counts
// from 16-bit masks. Picked at run time where the CPU has AVX-512F (`PickRows`); a build with
// -DFP4LAB_NO_AVX512 leaves it out (the tests build the generic loop alone that way).
struct Sums512 {
  __m512d sxx, see, sab, ser;
};

FP4LAB_TARGET inline void Half(__m256 x8, __m256 h8, Sums512& z) {  // eight lanes, in order
  const __m512d xd = _mm512_cvtps_pd(x8), d = _mm512_sub_pd(_mm512_cvtps_pd(h8), xd);
  z.sxx = _mm512_add_pd(z.sxx, _mm512_mul_pd(xd, xd));
  z.see = _mm512_add_pd(z.see, _mm512_mul_pd(d, d));
  z.sab = _mm512_add_pd(z.sab, _mm512_abs_pd(xd));
  z.ser = _mm512_add_pd(z.ser, d);
}

FP4LAB_TARGET inline __m256 High(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// Sixteen elements (m: those that exist, 0xffff or 0x00ff: a last chunk of eight), their
// x_hat (q * s) * o; the counts into n (x != 0, flushed, saturated), the masks of x != 0 and
// x_hat != 0 into kx and kh.
FP4LAB_TARGET inline void Step(const float* xp, const float* qp, __m512 s, __m512 o,
                               __m512 vmax, __mmask16 m, Sums512& z, int64_t n[3],
                               __mmask16& kx, __mmask16& kh) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512 x = _mm512_maskz_loadu_ps(m, xp), q = _mm512_maskz_loadu_ps(m, qp);
  const __m512 h = _mm512_mul_ps(_mm512_mul_ps(q, s), o);
  const __m512 ax = _mm512_abs_ps(x), ah = _mm512_abs_ps(h);
  kx = _mm512_mask_cmp_ps_mask(m, x, zero, _CMP_NEQ_UQ);  // as C's x != 0: true for a NaN
  kh = _mm512_mask_cmp_ps_mask(m, h, zero, _CMP_NEQ_UQ);
  const __mmask16 top = _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(q), vmax, _CMP_EQ_OQ);
  const __mmask16 sat = _mm512_mask_cmp_ps_mask(top, ax, ah, _CMP_GT_OQ);
  n[0] += __builtin_popcount(_cvtmask16_u32(kx));
  n[1] += __builtin_popcount(_cvtmask16_u32(kx) & ~_cvtmask16_u32(kh));
  n[2] += __builtin_popcount(_cvtmask16_u32(sat));
  Half(_mm512_castps512_ps256(x), _mm512_castps512_ps256(h), z);
  if (m == 0xffff) Half(High(x), High(h), z);
}

FP4LAB_TARGET void RowsAvx512(const float* __restrict X, const float* __restrict Q,
                              const float* __restrict S, const float* __restrict O, int64_t r0,
                              int64_t r1, int64_t t1, int64_t nb, int64_t t2, float vmax,
                              Part& p) {
  Sums512 z = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
               _mm512_setzero_pd()};
  Acc a;  // the scalar tail's sums and counts
  int64_t n[3] = {0, 0, 0};
  const bool wide = t2 % 16 == 0;  // else t2 == 1: one bit per block (column) in 16-bit words
  const int64_t row = nb * t2, words = wide ? nb : (nb + 15) / 16;
  std::vector<uint32_t> live(words), hot(words);
  const __m512 vm = _mm512_set1_ps(vmax);
  for (int64_t r = r0; r < r1; ++r) {
    std::fill(live.begin(), live.end(), 0);
    std::fill(hot.begin(), hot.end(), 0);
    const float* s = S + r * nb;
    for (int64_t i = 0; i < t1; ++i) {
      const int64_t off = (r * t1 + i) * row;
      const float *x = X + off, *q = Q + off;
      const float o = O[r * t1 + i];
      const __m512 ov = _mm512_set1_ps(o);
      __mmask16 kx, kh;
      if (wide) {
        for (int64_t b = 0; b < nb; ++b) {
          const __m512 sv = _mm512_set1_ps(s[b]);
          uint32_t ox = 0, oh = 0;
          for (int64_t k = b * t2; k < (b + 1) * t2; k += 16) {
            Step(x + k, q + k, sv, ov, vm, 0xffff, z, n, kx, kh);
            ox |= _cvtmask16_u32(kx);
            oh |= _cvtmask16_u32(kh);
          }
          live[b] |= ox != 0;
          hot[b] |= oh != 0;
        }
        continue;
      }
      int64_t k = 0;
      for (; k + 8 <= row; k += 16) {  // chunks of 16, and a last one of 8
        const __mmask16 m = k + 16 <= row ? 0xffff : 0x00ff;
        Step(x + k, q + k, _mm512_maskz_loadu_ps(m, s + k), ov, vm, m, z, n, kx, kh);
        live[k / 16] |= _cvtmask16_u32(kx);
        hot[k / 16] |= _cvtmask16_u32(kh);
      }
      k = row - row % 8;
      for (; k < row; ++k) {  // fewer than 8 left: the scalar tail, as `Rows`
        const float h = a.Scalar(x[k], q[k], s[k], o, vmax);
        live[k / 16] |= uint32_t{x[k] != 0.0f} << (k % 16);
        hot[k / 16] |= uint32_t{h != 0.0f} << (k % 16);
      }
    }
    for (int64_t w = 0; w < words; ++w) p.under += __builtin_popcount(live[w] & ~hot[w]);
  }
  std::memcpy(&a.sxx, &z.sxx, sizeof a.sxx);
  std::memcpy(&a.see, &z.see, sizeof a.see);
  std::memcpy(&a.sab, &z.sab, sizeof a.sab);
  std::memcpy(&a.ser, &z.ser, sizeof a.ser);
  a.nz64 += n[0];
  a.fl64 += n[1];
  a.sat64 += n[2];
  p.a = a;
}
#endif

using RowsFn = void (*)(const float*, const float*, const float*, const float*, int64_t,
                        int64_t, int64_t, int64_t, int64_t, float, Part&);

// The loop for blocks of width t2 on this CPU.
RowsFn PickRows(int64_t t2) {
#ifdef FP4LAB_AVX512
  if ((t2 % 16 == 0 || t2 == 1) && __builtin_cpu_supports("avx512f")) return RowsAvx512;
#endif
  return Rows;
}

// The statistics of one group from its parts, combined in the parts' order lane by lane.
void Finish(const Part* parts, int64_t nparts, int64_t elements, int64_t blocks, float* out) {
  v8d acc[4] = {};
  double tail[4] = {0, 0, 0, 0};
  int64_t nz = 0, fl = 0, sat = 0, under = 0;
  for (int64_t c = 0; c < nparts; ++c) {
    const Part& p = parts[c];
    acc[0] += p.a.sxx;
    acc[1] += p.a.see;
    acc[2] += p.a.sab;
    acc[3] += p.a.ser;
    for (int j = 0; j < 4; ++j) tail[j] += p.a.tail[j];
    nz += p.a.nz64;
    fl += p.a.fl64;
    sat += p.a.sat64;
    under += p.under;
  }
  double s[4] = {0, 0, 0, 0};  // lanes 0..7 in order, then the tail
  for (int q = 0; q < 4; ++q) {
    for (int l = 0; l < 8; ++l) s[q] += acc[q][l];
    s[q] += tail[q];
  }
  const double nx = std::sqrt(s[0]);
  const bool finite = std::isfinite(s[0]) && std::isfinite(s[2]);
  out[0] = !finite ? NAN : static_cast<float>(nx > 0 ? std::sqrt(s[1]) / nx : 0.0);
  out[1] = !finite ? NAN : static_cast<float>(s[2] > 0 ? s[3] / s[2] : 0.0);
  out[2] = static_cast<float>(fl) / static_cast<float>(nz > 0 ? nz : 1);
  out[3] = static_cast<float>(sat) / static_cast<float>(elements);
  out[4] = static_cast<float>(under) / static_cast<float>(blocks);
}

// Parts of about this many elements (whole block rows): their boundaries, and so the order of
// every sum, depend on the shape alone, never on the number of threads that computed them.
constexpr int64_t kPartElements = int64_t{1} << 16;

// The work of one call, shared by the calling thread and the pool's: parts are taken in turn
// from `next`; the caller waits until every part is done. A task that starts after that finds
// nothing left to take (it holds this state, so the state outlives the call).
struct Work {
  const float *X, *Q, *S, *O;
  int64_t per, rows, nparts, pa, t1, nb, t2, total;
  float vmax;
  RowsFn rows_fn = Rows;
  fp4lab_env::Env env = 0;  // the calling thread's float environment, taken on by helpers
  std::vector<Part> parts;
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mutex;
  std::condition_variable finished;

  void Run() {
    const fp4lab_env::Env own = fp4lab_env::Get();
    fp4lab_env::Set(env);  // x_hat's multiplications as the calling thread computes them
    for (int64_t c; (c = next.fetch_add(1)) < total;) {
      const int64_t g = c / nparts, r0 = (c % nparts) * rows;
      rows_fn(X + g * per, Q + g * per, S + g * pa * nb, O + g * pa * t1, r0,
              std::min(pa, r0 + rows), t1, nb, t2, vmax, parts[c]);
      if (done.fetch_add(1) + 1 == total) {
        std::lock_guard<std::mutex> lock(mutex);
        finished.notify_all();
      }
    }
    fp4lab_env::Set(own);
  }
};

ffi::Error OperandStats(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> q,
                        ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> outer,
                        ffi::ResultBuffer<ffi::F32> out, int64_t pa, int64_t t1, int64_t nb,
                        int64_t t2, float vmax) {
  const int64_t per = pa * t1 * nb * t2;
  const int64_t n = static_cast<int64_t>(x.element_count());
  const int64_t groups = per > 0 ? n / per : 0;
  if (pa <= 0 || t1 <= 0 || nb <= 0 || t2 <= 0 || n % per != 0 ||
      static_cast<int64_t>(q.element_count()) != n ||
      static_cast<int64_t>(scale.element_count()) != groups * pa * nb ||
      static_cast<int64_t>(outer.element_count()) != groups * pa * t1 ||
      static_cast<int64_t>(out->element_count()) != 5 * groups) {
    return ffi::Error::InvalidArgument(
        "fp4lab_operand_stats: the buffers do not match the blocked view (pa, t1, nb, t2)");
  }
  auto work = std::make_shared<Work>();
  Work& w = *work;
  w.X = x.typed_data();
  w.Q = q.typed_data();
  w.S = scale.typed_data();
  w.O = outer.typed_data();
  w.env = fp4lab_env::Get();
  w.per = per;
  w.pa = pa;
  w.t1 = t1;
  w.nb = nb;
  w.t2 = t2;
  w.vmax = vmax;
  w.rows_fn = PickRows(t2);
  w.rows = std::max<int64_t>(1, kPartElements / (t1 * nb * t2));
  w.nparts = (pa + w.rows - 1) / w.rows;
  w.total = groups * w.nparts;
  w.parts.resize(w.total);
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), w.total - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work] { work->Run(); });
  w.Run();
  {
    std::unique_lock<std::mutex> lock(w.mutex);
    w.finished.wait(lock, [&] { return w.done.load() == w.total; });
  }
  for (int64_t g = 0; g < groups; ++g) {
    Finish(w.parts.data() + g * w.nparts, w.nparts, per, pa * nb, out->typed_data() + 5 * g);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FP4LAB_STATS_SYMBOL, OperandStats,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("pa")
                                  .Attr<int64_t>("t1")
                                  .Attr<int64_t>("nb")
                                  .Attr<int64_t>("t2")
                                  .Attr<float>("vmax"));
