// The element loops of quantize.cc, compiled once per instruction set: quantize.cc includes
// this file in one namespace per clone (x86-64: `avx512f` and `avx2` under a target pragma,
// `baseline` with the build's own flags, SSE2 on x86-64 and NEON on aarch64), and picks one
// clone per call. Every loop is free of branches on the data (selects and bit operations
// only), so the compiler vectorizes it in each clone; the arithmetic is the same float32
// operations in the same order in all of them (no contraction, no reassociation), so every
// clone gives the same bits (tests/core/test_fused.py). No include guard: included
// once per clone, after the scalar helpers it inlines.

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

// The block amaxes (bits) of block rows u0 .. u1 - 1 (over all calls and groups)
void BlockMax(const float* X, uint32_t* M, const Params& p, int64_t u0, int64_t u1) {
  const int64_t row = p.nb * p.t2;
  for (int64_t u = u0; u < u1; ++u) {
    uint32_t* m = M + u * p.nb;
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
// `saturated`; else 0). x may be out (the rotated operand, quantized in place): element k is
// read, then written, and no other, so the loops carry no dependence (ivdep: vectorized
// without an overlap check).
template <bool kCount>
int64_t Row(const float* x, float* out, const float* __restrict m, const float* __restrict s,
            int64_t n, Elem f, float o) {
  const uint32_t vbits = U(f.vmax);
  int32_t c = 0;
#pragma GCC ivdep
  for (int64_t k = 0; k < n; ++k) {
    const float xk = x[k], g = Round<false>(xk * m[k], f, 0);
    const float h = ((g * 0.5f) * s[k]) * o;
    out[k] = h;
    if (kCount) c += Saturated(xk, g, h, vbits);
  }
  return c;
}

// Row for blocks of kT2 elements (the block widths 16 of NVFP4 and 32 of MX), block b with
// multiplier m[b] and scale factor s[b]: the same operations on the same values as Row on the
// terms spread over the elements, without writing the spread terms out and reading them back.
template <bool kCount, int kT2>
int64_t RowBlocks(const float* x, float* out, const float* __restrict m,
                  const float* __restrict s, int64_t nb, Elem f, float o) {
  const uint32_t vbits = U(f.vmax);
  int32_t c = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const float mb = m[b], sb = s[b];
    const float* xb = x + b * kT2;
    float* ob = out + b * kT2;
#pragma GCC ivdep
    for (int e = 0; e < kT2; ++e) {
      const float xk = xb[e], g = Round<false>(xk * mb, f, 0);
      const float h = ((g * 0.5f) * sb) * o;
      ob[e] = h;
      if (kCount) c += Saturated(xk, g, h, vbits);
    }
  }
  return c;
}

// The same with stochastic rounding: element k's bits at counter c0 + k * step
template <bool kCount>
int64_t RowSr(const float* x, float* out, const float* __restrict m, const float* __restrict s,
              int64_t n, Elem f, float o, uint32_t k0, uint32_t k1, uint32_t c0, uint32_t step) {
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  const uint32_t vbits = U(f.vmax);
  int32_t c = 0;
#pragma GCC ivdep
  for (int64_t k = 0; k < n; ++k) {
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
