// The statistics of one quantized operand in one pass over x, x_hat and the grid values:
// fp4lab.core.stats, method "fused", called through XLA's FFI (fp4lab.core.cpu_kernels builds
// this file on first use).
//
// Inputs, float32, one group after another (a vmapped call stacks groups in front): x, x_hat
// and the element grid values v in the quantizer's blocked view, pa block rows of t1 rows of
// nb * t2 elements, where block (r, b) holds elements b*t2 .. b*t2 + t2 - 1 of rows
// r*t1 .. r*t1 + t1 - 1 (the view's block axes are its third and first from the end).
// Output, float32 per group: rel_err, bias, flush, saturated, underflow (fp4lab.schema.STATS
// less map4).
//
//   rel_err    sqrt(sum (x_hat - x)^2) / sqrt(sum x^2)   0 for an all-zero operand
//   bias       sum (x_hat - x) / sum |x|                 0 for an all-zero operand
//   flush      #(x != 0 and x_hat == 0) / max(#(x != 0), 1)
//   saturated  #(|v| == vmax and |x| > |x_hat|) / #elements
//   underflow  #(blocks with some x != 0 and every x_hat == 0) / #blocks
//
// rel_err and bias are NaN where x holds a NaN or an infinity. The float sums run in double
// precision over 8 lanes (element k of a row adds into lane k % 8) within parts of about 64K
// elements (whole block rows, fixed by the shape), which the threads of XLA's pool share;
// the parts are then added in order, lane by lane. So the products are exact and the sums
// the same IEEE operations in the same order whatever the number of threads and on every
// x86-64 CPU (built with -ffp-contract=off; the AVX-512, AVX2 and baseline clones compute the
// same eight lanes, as one, two or four vector registers). The counts are exact; the fractions
// are correctly rounded float32 divisions.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

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

inline v8d Wide(const v8f& v) { return __builtin_convertvector(v, v8d); }  // exact

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

  // Eight contiguous elements; sets the lanes' masks of x != 0 and x_hat != 0.
  inline void Chunk(const float* xp, const float* hp, const float* vp, float vmax, v8i& mx,
                    v8i& mh) {
    const v8f x = Load(xp), h = Load(hp), v = Load(vp), ax = Abs(x), ah = Abs(h);
    const v8d xd = Wide(x), d = Wide(h) - xd;
    sxx += xd * xd;
    see += d * d;
    sab += Wide(ax);
    ser += d;
    mx = x != 0.0f;
    mh = h != 0.0f;
    nz -= mx;  // masks are -1 where true
    fl -= mx & (h == 0.0f);
    sat -= (Abs(v) == vmax) & (ax > ah);
    ++chunks;
  }

  inline void Scalar(float x, float h, float v, float vmax) {
    const double xd = x, d = static_cast<double>(h) - xd;
    tail[0] += xd * xd;
    tail[1] += d * d;
    tail[2] += std::fabs(xd);
    tail[3] += d;
    const int64_t m = x != 0.0f;
    nz64 += m;
    fl64 += m & (h == 0.0f);
    sat64 += (std::fabs(v) == vmax) & (std::fabs(x) > std::fabs(h));
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

FP4LAB_CLONES void Rows(const float* __restrict X, const float* __restrict H,
                        const float* __restrict V, int64_t r0, int64_t r1, int64_t t1, int64_t nb,
                        int64_t t2, float vmax, Part& p) {
  Acc a;  // a local: its lanes stay in registers
  std::vector<int32_t> live(nb), hot(nb);
  const int64_t row = nb * t2;
  for (int64_t r = r0; r < r1; ++r) {
    std::fill(live.begin(), live.end(), 0);
    std::fill(hot.begin(), hot.end(), 0);
    for (int64_t i = 0; i < t1; ++i) {
      const int64_t off = (r * t1 + i) * row;
      const float *x = X + off, *h = H + off, *v = V + off;
      v8i mx, mh;
      if (t2 % 8 == 0) {  // whole chunks inside each block
        for (int64_t b = 0; b < nb; ++b) {
          v8i ox = {}, oh = {};
          for (int64_t k = b * t2; k < (b + 1) * t2; k += 8) {
            a.Chunk(x + k, h + k, v + k, vmax, mx, mh);
            ox |= mx;
            oh |= mh;
          }
          live[b] |= Any(ox);
          hot[b] |= Any(oh);
        }
      } else if (t2 == 1) {  // one chunk spans eight blocks
        int64_t k = 0;
        for (; k + 8 <= row; k += 8) {
          a.Chunk(x + k, h + k, v + k, vmax, mx, mh);
          Or(live.data() + k, mx);
          Or(hot.data() + k, mh);
        }
        for (; k < row; ++k) {
          a.Scalar(x[k], h[k], v[k], vmax);
          live[k] |= x[k] != 0.0f;
          hot[k] |= h[k] != 0.0f;
        }
      } else {
        for (int64_t k = 0; k < row; ++k) {
          a.Scalar(x[k], h[k], v[k], vmax);
          live[k / t2] |= x[k] != 0.0f;
          hot[k / t2] |= h[k] != 0.0f;
        }
      }
      if (a.chunks > (int64_t{1} << 28)) a.Flush();
    }
    for (int64_t b = 0; b < nb; ++b) p.under += (live[b] != 0) & (hot[b] == 0);
  }
  a.Flush();
  p.a = a;
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
  const float *X, *H, *V;
  int64_t per, rows, nparts, pa, t1, nb, t2, total;
  float vmax;
  std::vector<Part> parts;
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mutex;
  std::condition_variable finished;

  void Run() {
    for (int64_t c; (c = next.fetch_add(1)) < total;) {
      const int64_t g = c / nparts, r0 = (c % nparts) * rows;
      Rows(X + g * per, H + g * per, V + g * per, r0, std::min(pa, r0 + rows), t1, nb, t2, vmax,
           parts[c]);
      if (done.fetch_add(1) + 1 == total) {
        std::lock_guard<std::mutex> lock(mutex);
        finished.notify_all();
      }
    }
  }
};

ffi::Error OperandStats(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> xhat,
                        ffi::Buffer<ffi::F32> vals, ffi::ResultBuffer<ffi::F32> out, int64_t pa,
                        int64_t t1, int64_t nb, int64_t t2, float vmax) {
  const int64_t per = pa * t1 * nb * t2;
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (pa <= 0 || t1 <= 0 || nb <= 0 || t2 <= 0 || n % per != 0 ||
      xhat.element_count() != x.element_count() || vals.element_count() != x.element_count() ||
      static_cast<int64_t>(out->element_count()) != 5 * (n / per)) {
    return ffi::Error::InvalidArgument(
        "fp4lab_operand_stats: the buffers do not match the blocked view (pa, t1, nb, t2)");
  }
  const int64_t groups = n / per;
  auto work = std::make_shared<Work>();
  Work& w = *work;
  w.X = x.typed_data();
  w.H = xhat.typed_data();
  w.V = vals.typed_data();
  w.per = per;
  w.pa = pa;
  w.t1 = t1;
  w.nb = nb;
  w.t2 = t2;
  w.vmax = vmax;
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
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("pa")
                                  .Attr<int64_t>("t1")
                                  .Attr<int64_t>("nb")
                                  .Attr<int64_t>("t2")
                                  .Attr<float>("vmax"));
