// The element loops of quantize.cc, compiled once per instruction set: quantize.cc includes
// this file in one namespace per clone (x86-64: `avx512f` and `avx2` under a target pragma,
// `baseline` with the build's own flags, SSE2 on x86-64 and NEON on aarch64), and picks one
// clone per call.
//
// The hot loops (the block amaxes, the element passes) are written in explicit vectors, GCC's
// and Clang's vector extensions: one source, each clone's copy at its registers' width
// (FP4LAB_Q_BYTES: 16 bytes for SSE2 and NEON, 32 for AVX2, 64 for AVX-512F; a vector wider
// than the registers had its comparisons scalarized by GCC 12), instead of leaving the
// vectorization to the auto-vectorizer, whose AVX2 and SSE2 code ran well behind its AVX-512
// code. The arithmetic is the scalar helpers' float32 operations in the same order, lane by
// lane (no contraction, no reassociation: -ffp-contract=off), and a vector conditional where
// they branch, so every clone gives the scalar code's bits (tests/core/test_fused.py in every
// clone; tests/core/test_kernels_build.py runs these loops built for aarch64 under emulation
// against the x86-64 build). Row tails shorter than a vector run the scalar helpers. No
// include guard: included once per clone, after the scalar helpers it inlines.

#define FP4LAB_V inline __attribute__((always_inline))
// FP4LAB_Q_BYTES, defined by quantize.cc for each clone: its vector registers' width
constexpr int kLanes = FP4LAB_Q_BYTES / 4;
// may_alias: a vector read from (or written to) the float arrays; aligned(4): anywhere in them
typedef float Vf __attribute__((vector_size(FP4LAB_Q_BYTES), aligned(4), may_alias));
typedef int32_t Vi __attribute__((vector_size(FP4LAB_Q_BYTES), aligned(4)));
typedef uint32_t Vu __attribute__((vector_size(FP4LAB_Q_BYTES), aligned(4)));

FP4LAB_V Vf LoadV(const float* p) { return *reinterpret_cast<const Vf*>(p); }
FP4LAB_V void StoreV(float* p, const Vf& v) { *reinterpret_cast<Vf*>(p) = v; }
// every lane v: v - (+0) is v for every v (-0 and NaN included), and a broadcast once folded
FP4LAB_V Vf SplatF(float v) { return v - Vf{}; }
FP4LAB_V Vi SplatI(int32_t v) { return Vi{} + v; }
FP4LAB_V Vu BitsOf(const Vf& v) { return (Vu)v; }  // the same bits (a vector cast)
FP4LAB_V Vf FloatOf(const Vu& b) { return (Vf)b; }
FP4LAB_V Vi MaxI(const Vi& a, const Vi& b) { return a > b ? a : b; }
// m ? a : b lane by lane, m a comparison's mask (-1 or 0 per lane)
FP4LAB_V Vf Select(const Vi& m, const Vf& a, const Vf& b) { return m ? a : b; }

// The largest of v's lanes (lanes >= 0): halves folded onto each other down to 4 lanes
typedef int32_t V8i __attribute__((vector_size(32), aligned(4)));
typedef int32_t V4i __attribute__((vector_size(16), aligned(4)));
template <typename Half, typename Whole>
FP4LAB_V Half Fold(const Whole& v) {
  Half a, b;
  std::memcpy(&a, &v, sizeof a);
  std::memcpy(&b, reinterpret_cast<const char*>(&v) + sizeof a, sizeof b);
  return a > b ? a : b;
}
FP4LAB_V int32_t MaxLanes(const Vi& v) {
  V4i m;
  if constexpr (kLanes == 16) {
    m = Fold<V4i>(Fold<V8i>(v));
  } else if constexpr (kLanes == 8) {
    m = Fold<V4i>(v);
  } else {
    std::memcpy(&m, &v, sizeof m);
  }
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

FP4LAB_V int32_t SumLanes(const Vi& v) {
  int32_t s = 0;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// Round (quantize.cc) on a vector: formats.round_to_format onto the element grid, RNE or with
// the random bits `bits`; the same operations lane by lane, selects where Round chooses. Its
// comparisons are of non-negative floats (or a NaN against a number), made on their bits as
// signed integers, which order them alike (a NaN's bits above +inf's).
template <bool SR>
FP4LAB_V Vf RoundV(const Vf& v, const Elem& f, const Vu& bits) {
  const Vu b = BitsOf(v);
  const Vi ab = (Vi)(b & kAbs);
  const Vf av = FloatOf((Vu)ab);
  const Vf a = Select(ab < SplatI(int32_t(U(f.vmax))), av, SplatF(f.vmax));  // NaN: set at the end
  const Vi field = (Vi)(BitsOf(a) >> 23) & 0xff;
  const Vi k = MaxI(field, SplatI(f.kmin)) - f.mbits;
  const Vf q = FloatOf((Vu)(k << 23)), inv = FloatOf((Vu)((254 - k) << 23));
  const Vf y = a * inv;
  const Vf t = (y + 0x1p23f) - 0x1p23f;
  Vf r;
  if (SR) {  // y, t, u and y - lo are >= 0 and not NaN
    const Vf lo = Select((Vi)BitsOf(t) > (Vi)BitsOf(y), t - 1.0f, t);  // floor(y)
    const Vf u = __builtin_convertvector((Vi)(bits >> 8), Vf) * 0x1p-24f;
    r = lo + Select((Vi)BitsOf(u) < (Vi)BitsOf(y - lo), SplatF(1.0f), SplatF(0.0f));
  } else {
    r = t;
  }
  const Vf out = FloatOf(BitsOf(r * q) | (b & kSign));
  return Select(ab > SplatI(int32_t(kInf)), SplatF(Nan()), out);
}

// Saturated (quantize.cc) on a vector: -1 where the element saturated, else 0 (magnitude
// bits are below 2**31, so the signed comparisons order them as the unsigned ones do)
FP4LAB_V Vi SaturatedV(const Vf& x, const Vf& g, const Vf& h, uint32_t vbits) {
  const Vi ax = (Vi)(BitsOf(x) & kAbs), ah = (Vi)(BitsOf(h) & kAbs);
  const Vi ag = (Vi)(BitsOf(g) & kAbs), zero = {};
  const Vi at_max = ag == SplatI(int32_t(vbits)) ? SplatI(-1) : zero;
  const Vi finite_x = ax <= SplatI(int32_t(kInf)) ? at_max : zero;
  return ax > ah ? finite_x : zero;
}

// Bits (quantize.cc) of a vector of counters: the Threefry-2x32 hash of (0, c), y0 ^ y1
FP4LAB_V Vu RotlV(const Vu& v, int r) { return (v << r) | (v >> (32 - r)); }
FP4LAB_V Vu BitsV(uint32_t k0, uint32_t k1, uint32_t k2, const Vu& c) {
  Vu x0 = Vu{} + k0, x1 = c + k1;
  const uint32_t ks[3] = {k0, k1, k2};
#define FP4LAB_ROUND(r) \
  x0 += x1;             \
  x1 = RotlV(x1, r) ^ x0;
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

// BlockTerms of NVFP4 "te" for n blocks with amax bits m, where S_dec >= 2**-60 (no lift), in
// a loop without branches, so that the compiler vectorizes it
void TeTerms(const uint32_t* m, int64_t n, const ScopeTerms& s, float* mul,
                    float* scale2) {
  for (int64_t b = 0; b < n; ++b) {
    float s_b, scale;
    TeScale(m[b], s, &s_b, &scale);
    mul[b] = Min(1.0f / (s_b * s.s_dec), kFltMax);
    scale2[b] = ScaleFactor(scale, s);
  }
}

// The rotation of hadamard.rotate along the block rows' t1 = n rows (the in-place view with
// t2 = 1, a block row being one Hadamard block per column), block rows u0 .. u1 - 1 of X into
// O: x * sign (where signed), times 2**-k from the bits, the butterflies h = 1, 2, .., n / 2
// ((a, b) -> (a + b, a - b)), times `rest` where it is not 1: the module's operations in its
// order, so the same bits. Columns go in chunks that stay in the cache through the stages.
void Rotate(const float* X, float* O, const float* signs, const Params& p,
                            int64_t u0, int64_t u1) {
  const int64_t n = p.t1, row = p.nb, rows_per_call = p.unb / row;
  constexpr int64_t kChunk = 256;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t call = (u * n) / rows_per_call;
    const float* s = signs + call * n;
    for (int64_t c0 = 0; c0 < row; c0 += kChunk) {
      const int64_t w = std::min(kChunk, row - c0);
      for (int64_t i = 0; i < n; ++i) {
        const float* x = X + (u * n + i) * row + c0;
        float* o = O + (u * n + i) * row + c0;
        const float si = s[i];
        if (p.signed_) {
          for (int64_t j = 0; j < w; ++j) o[j] = TimesPow2(x[j] * si, -int32_t(p.hk));
        } else {
          for (int64_t j = 0; j < w; ++j) o[j] = TimesPow2(x[j], -int32_t(p.hk));
        }
      }
      for (int64_t h = 1; h < n; h *= 2) {
        for (int64_t i = 0; i < n; ++i) {
          if (i & h) continue;
          float* a = O + (u * n + i) * row + c0;
          float* b = O + (u * n + i + h) * row + c0;
          for (int64_t j = 0; j < w; ++j) {
            const float av = a[j], bv = b[j];
            a[j] = av + bv;
            b[j] = av - bv;
          }
        }
      }
      if (p.rest != 1.0f) {
        for (int64_t i = 0; i < n; ++i) {
          float* o = O + (u * n + i) * row + c0;
          for (int64_t j = 0; j < w; ++j) o[j] = o[j] * p.rest;
        }
      }
    }
  }
}

// The block amaxes (bits) of block rows u0 .. u1 - 1 (over all calls and groups): blocks whose
// width is a multiple of kLanes as vectors (one block's lanes folded at its end), others as
// scalars (t2 = 1: a vertical max, which the compiler vectorizes)
void BlockMax(const float* X, uint32_t* M, const Params& p, int64_t u0, int64_t u1) {
  const int64_t row = p.nb * p.t2, per = p.t2 / kLanes;
  constexpr int64_t kChunk = 32;  // blocks whose running maxima stay in the cache over t1 rows
  for (int64_t u = u0; u < u1; ++u) {
    uint32_t* m = M + u * p.nb;
    if (p.t2 % kLanes == 0 && p.t1 == 1) {
      const float* x = X + u * row;
      for (int64_t b = 0; b < p.nb; ++b) {
        Vi top = (Vi)(BitsOf(LoadV(x + b * p.t2)) & kAbs);
        for (int64_t v = 1; v < per; ++v) {
          top = MaxI(top, (Vi)(BitsOf(LoadV(x + b * p.t2 + v * kLanes)) & kAbs));
        }
        m[b] = std::min(uint32_t(MaxLanes(top)), kInf);
      }
      continue;
    }
    if (p.t2 % kLanes == 0) {
      for (int64_t b0 = 0; b0 < p.nb; b0 += kChunk) {
        const int64_t w = std::min(kChunk, p.nb - b0);
        Vi top[kChunk];
        for (int64_t b = 0; b < w; ++b) top[b] = Vi{};
        for (int64_t i = 0; i < p.t1; ++i) {
          const float* x = X + (u * p.t1 + i) * row + b0 * p.t2;
          for (int64_t b = 0; b < w; ++b) {
            for (int64_t v = 0; v < per; ++v) {
              top[b] = MaxI(top[b], (Vi)(BitsOf(LoadV(x + b * p.t2 + v * kLanes)) & kAbs));
            }
          }
        }
        for (int64_t b = 0; b < w; ++b) m[b0 + b] = std::min(uint32_t(MaxLanes(top[b])), kInf);
      }
      continue;
    }
    std::fill(m, m + p.nb, 0u);
    for (int64_t i = 0; i < p.t1; ++i) {
      const float* x = X + (u * p.t1 + i) * row;
      if (p.t2 == 1) {
        for (int64_t k = 0; k < row; ++k) m[k] = std::max(m[k], U(x[k]) & kAbs);
      } else {
        for (int64_t b = 0; b < p.nb; ++b) {
          uint32_t top = m[b];
          for (int64_t e = 0; e < p.t2; ++e) top = std::max(top, U(x[b * p.t2 + e]) & kAbs);
          m[b] = top;
        }
      }
    }
    for (int64_t b = 0; b < p.nb; ++b) m[b] = std::min(m[b], kInf);
  }
}

// x_hat of one row of n elements, element k with multiplier m[k] and scale factor s[k], and
// with kCount how many saturated (grid value +-max and |x| > |x_hat|: the statistics'
// `saturated`; else 0). x may be out (the rotated operand, quantized in place): each vector
// of x is read before the same elements of out are written, and no other.
template <bool kCount>
int64_t Row(const float* x, float* out, const float* __restrict m, const float* __restrict s,
            int64_t n, Elem f, float o) {
  const uint32_t vbits = U(f.vmax);
  Vi count = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    const Vf xk = LoadV(x + k), g = RoundV<false>(xk * LoadV(m + k), f, Vu{});
    const Vf h = ((g * 0.5f) * LoadV(s + k)) * o;
    StoreV(out + k, h);
    if (kCount) count -= SaturatedV(xk, g, h, vbits);
  }
  int32_t c = kCount ? SumLanes(count) : 0;
  for (; k < n; ++k) {
    const float xk = x[k], g = Round<false>(xk * m[k], f, 0);
    const float h = ((g * 0.5f) * s[k]) * o;
    out[k] = h;
    if (kCount) c += Saturated(xk, g, h, vbits);
  }
  return c;
}

// Row for blocks of kT2 elements (the block widths 16 of NVFP4 and 32 of MX, kT2 / kLanes
// vectors each), block b with multiplier m[b] and scale factor s[b]: the same operations on
// the same values as Row on the terms spread over the elements, without writing them out.
template <bool kCount, int kT2>
int64_t RowBlocks(const float* x, float* out, const float* __restrict m,
                  const float* __restrict s, int64_t nb, Elem f, float o) {
  static_assert(kT2 % kLanes == 0, "whole vectors per block");
  const uint32_t vbits = U(f.vmax);
  Vi count = {};
  for (int64_t b = 0; b < nb; ++b) {
    const float mb = m[b], sb = s[b];
    for (int v = 0; v < kT2 / kLanes; ++v) {
      const int64_t k = b * kT2 + v * kLanes;
      const Vf xk = LoadV(x + k), g = RoundV<false>(xk * mb, f, Vu{});
      const Vf h = ((g * 0.5f) * sb) * o;
      StoreV(out + k, h);
      if (kCount) count -= SaturatedV(xk, g, h, vbits);
    }
  }
  return kCount ? SumLanes(count) : 0;
}

// The same with stochastic rounding: element k's bits at counter c0 + k * step (uint32)
template <bool kCount>
int64_t RowSr(const float* x, float* out, const float* __restrict m, const float* __restrict s,
              int64_t n, Elem f, float o, uint32_t k0, uint32_t k1, uint32_t c0, uint32_t step) {
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  const uint32_t vbits = U(f.vmax);
  Vu counter;
  for (int l = 0; l < kLanes; ++l) counter[l] = c0 + uint32_t(l) * step;
  const uint32_t stride = uint32_t(kLanes) * step;
  Vi count = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes, counter += stride) {
    const Vu bits = BitsV(k0, k1, k2, counter);
    const Vf xk = LoadV(x + k), g = RoundV<true>(xk * LoadV(m + k), f, bits);
    const Vf h = ((g * 0.5f) * LoadV(s + k)) * o;
    StoreV(out + k, h);
    if (kCount) count -= SaturatedV(xk, g, h, vbits);
  }
  int32_t c = kCount ? SumLanes(count) : 0;
  for (; k < n; ++k) {
    const uint32_t bits = Bits(k0, k1, k2, c0 + uint32_t(k) * step);
    const float xk = x[k], g = Round<true>(xk * m[k], f, bits);
    const float h = ((g * 0.5f) * s[k]) * o;
    out[k] = h;
    if (kCount) c += Saturated(xk, g, h, vbits);
  }
  return c;
}

// x_hat of block rows u0 .. u1 - 1: each block's terms spread over its elements, then the rows
void Quantize(const float* X, float* O, const uint32_t* M, const ScopeTerms* S,
                              const uint32_t* K, const Params& p, int64_t u0, int64_t u1,
                              std::atomic<int64_t>* saturated) {
  const int64_t row = p.nb * p.t2, rows_per_call = p.unb / row;
  const int64_t stream_n = p.pa * p.t1;  // the in-place view's quantized axis (L)
  std::vector<float> mul(row), scale2(row), block_mul(p.nb), block_scale2(p.nb);
  for (int64_t u = u0; u < u1; ++u) {
    const ScopeTerms& s = S[u];
    if (p.rule == kTe && s.s_dec >= 0x1p-60f) {
      TeTerms(M + u * p.nb, p.nb, s, block_mul.data(), block_scale2.data());
    } else {
      for (int64_t b = 0; b < p.nb; ++b) {
        BlockTerms(p, s, M[u * p.nb + b], &block_mul[b], &block_scale2[b]);
      }
    }
    const bool blocks = !p.sr && (p.t2 == 16 || p.t2 == 32);  // RowBlocks reads the blocks'
    if (p.t2 == 1) {
      std::copy(block_mul.begin(), block_mul.end(), mul.begin());
      std::copy(block_scale2.begin(), block_scale2.end(), scale2.begin());
    } else if (!blocks) {
      for (int64_t b = 0; b < p.nb; ++b) {
        std::fill(mul.begin() + b * p.t2, mul.begin() + (b + 1) * p.t2, block_mul[b]);
        std::fill(scale2.begin() + b * p.t2, scale2.begin() + (b + 1) * p.t2, block_scale2[b]);
      }
    }
    for (int64_t i = 0; i < p.t1; ++i) {
      const int64_t r = u * p.t1 + i;  // the row, over all calls
      const float* x = X + r * row;
      float* out = O + r * row;
      const int64_t call = r / rows_per_call, in_call = r % rows_per_call;
      if (blocks) {
        const auto row_fn = p.t2 == 16 ? (p.count ? RowBlocks<true, 16> : RowBlocks<false, 16>)
                                       : (p.count ? RowBlocks<true, 32> : RowBlocks<false, 32>);
        const int64_t c = row_fn(x, out, block_mul.data(), block_scale2.data(), p.nb, p.elem,
                                 s.outer);
        if (c) saturated[call] += c;
        continue;
      }
      if (!p.sr) {
        const auto row_fn = p.count ? Row<true> : Row<false>;
        const int64_t c = row_fn(x, out, mul.data(), scale2.data(), row, p.elem, s.outer);
        if (c) saturated[call] += c;
        continue;
      }
      // the counter of element k of this row: c0 + k * step (uint32 arithmetic, as the iotas)
      uint32_t c0, step;
      if (p.stream == 0) {
        c0 = uint32_t(in_call * row);
        step = 1;
      } else {  // in-place view: group g, block row a, row i within it
        const int64_t g = in_call / (p.pa * p.t1), ai = in_call % (p.pa * p.t1);
        c0 = uint32_t(g) * uint32_t(row) * uint32_t(stream_n) + uint32_t(ai);
        step = uint32_t(stream_n);
      }
      const auto row_fn = p.count ? RowSr<true> : RowSr<false>;
      const int64_t c = row_fn(x, out, mul.data(), scale2.data(), row, p.elem, s.outer,
                               K[2 * call], K[2 * call + 1], c0, step);
      if (c) saturated[call] += c;
    }
  }
}
