// The quantizer kernel's element loops as a program of their own, for the bits across CPUs
// (tests/core/test_kernels_build.py): built for x86-64 with the build's compiler and for
// aarch64-linux with ziglang's Clang, run natively and under qemu-aarch64, the two outputs must
// be the same lines.
//
// It includes quantize.cc itself (its anonymous namespace is this file's) and runs, on one
// thread in XLA's float environment (cpu_env.h: FTZ/DAZ on x86-64, FPCR.FZ on aarch64), what
// one kernel call runs: the rotation where asked, the block amaxes, the scopes' terms and the
// element pass, in every clone this build holds and this CPU runs (x86-64: SSE2, AVX2,
// AVX-512F; aarch64: NEON). The inputs are made from integer bits (no libm, so the same on
// every CPU): exact grid points and ties, zeros of both signs, subnormals, whole blocks below
// 2**-126, scopes whose S_dec is subnormal, FLT_MAX, infinities and NaNs, and magnitudes over
// the whole float range. Each line: the case, the clone, an FNV-1a hash of x_hat's bits (a NaN
// counted as one NaN, as the tests compare), the saturated count, and x_hat's first values.
// Also one line of the environment itself: a float product below 2**-126, flushed to zero.

#include "quantize.cc"

#include <cstdio>
#include <string>

namespace {

uint64_t state = 0x9E3779B97F4A7C15ull;
uint64_t Next() {  // splitmix64
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
float Value(uint32_t sign, uint32_t field, uint32_t mant) {
  return F((sign << 31) | (field << 23) | (mant & 0x7fffffu));
}
// A random sign and mantissa with the exponent field `field` (the draws in a fixed order: the
// order in which a call's arguments are evaluated differs between compilers)
float Random(uint32_t field) {
  const uint32_t sign = Next() & 1;
  return Value(sign, field, uint32_t(Next()));
}
float Around(int32_t e) { return Random(uint32_t(e + 127)); }  // |v| in [2**e, 2**(e+1))

// Rows of kinds as tests/core/test_fused.py's _edges: kind = row % 10
std::vector<float> Edges(int64_t rows, int64_t cols, bool bad) {
  static const uint32_t grid[] = {0x3e800000u, 0x3f000000u, 0x3f400000u, 0x3fa00000u,
                                  0x3fe00000u, 0x40200000u, 0x40600000u, 0x40a00000u,
                                  0x40c00000u, 0x40e00000u};  // .25 .5 .75 1.25 1.75 2.5 3.5 5 6 7
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * cols;
    const int kind = int(r % 10);
    const int32_t shift = int32_t(Next() % 40) - 20;
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t sign = Next() & 1;
      float v;
      if (kind == 0) {  // exact grid points and ties, times 2**shift
        v = F(grid[Next() % 10] + (uint32_t(shift + 20) << 23) - (20u << 23) + (sign << 31));
      } else if (kind == 1) {
        v = c % 3 == 0 ? -0.0f : 0.0f;
      } else if (kind == 2) {  // subnormals only
        v = Value(sign, 0, uint32_t(Next()));
      } else if (kind == 3) {  // a scope below 2**-126 * 2688: S_enc above 2**126
        v = Around(-120 - int32_t(Next() % 4));
      } else if (kind == 4) {
        v = c == 0 ? kFltMax : Around(int32_t(Next() % 6) - 3);
      } else if (kind == 5) {
        v = Around(-100 - int32_t(Next() % 4));
      } else if (kind == 6) {  // values around 1; with `bad` an infinity or a NaN in some rows
        v = Around(int32_t(Next() % 6) - 3);
        if (bad && c == 5 && r % 20 == 6) v = F(0x7f800000u | (sign << 31));
        if (bad && c == 7 && r % 30 == 16) v = F(0x7fc00001u);
      } else {  // magnitudes over the whole range, subnormals included
        v = Random(uint32_t(Next() % 255));
      }
      row[c] = v;
    }
  }
  return x;
}

struct Case {
  const char* name;
  int64_t rule, scope, sr, stream, t1, t2, rows, cols;
  Elem elem;
  int64_t emax;
  int64_t rotate = 0;  // a Hadamard of size t1 first (t2 = 1), its signs from the bits
  int tiny = 0;        // 1: every value below 2**-118 (S_dec below 2**-126); 2: every other row
  bool bad = false;    // infinities and NaNs in some rows
};

constexpr Elem kE2M1{127, 1, 6.0f}, kE4M3{121, 3, 448.0f}, kE3M2{125, 2, 28.0f};

uint64_t Hash(const std::vector<float>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (float f : v) {
    const uint32_t b = f != f ? 0x7fc00000u : U(f);
    for (int i = 0; i < 4; ++i) h = (h ^ ((b >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
  }
  return h;
}

// One kernel call's work (QuantizeBlocks, one call, one thread) in the loops of `clone`
void Run(const Case& c, int64_t clone) {
  Loops loops;
  if (!PickLoops(clone, &loops)) return;
  std::vector<float> x = Edges(c.rows, c.cols, c.bad);
  for (int64_t r = 0; r < c.rows && c.tiny; ++r) {  // magnitudes in [2**-149, 2**-118)
    if (c.tiny == 2 && r % 2) continue;
    for (int64_t k = 0; k < c.cols; ++k) {
      x[r * c.cols + k] = Random(uint32_t(Next() % 9));
    }
  }
  const int64_t n = c.rows * c.cols, nb = c.cols / c.t2, pa = c.rows / c.t1;
  Params p{pa,    c.t1,   nb,       c.t2,   n,       c.rule, c.sr,
           c.stream, c.emax, c.elem, 1.0f / c.elem.vmax};
  p.count = true;
  const int64_t units = pa;
  std::vector<float> out(n);
  const float* X = x.data();
  std::vector<float> rotated;
  if (c.rotate) {
    std::vector<float> signs(c.t1);
    for (float& s : signs) s = Next() & 1 ? -1.0f : 1.0f;
    p.hk = 2;  // hadamard.scale_split(16): 2**-2 on the bits, rest 1
    p.signed_ = true;
    rotated.resize(n);
    loops.rotate(X, rotated.data(), signs.data(), p, 0, units);
    X = rotated.data();
  }
  std::vector<uint32_t> bmax(units * nb);
  loops.block_max(X, bmax.data(), p, 0, units);
  std::vector<ScopeTerms> terms(units);
  uint32_t top = 0;
  for (uint32_t b : bmax) top = std::max(top, b);
  for (int64_t u = 0; u < units; ++u) {
    float amax_scope = F(top);
    if (c.scope == kRow) {
      uint32_t r = 0;
      for (int64_t b = 0; b < nb; ++b) r = std::max(r, bmax[u * nb + b]);
      amax_scope = F(r);
    }
    terms[u] = c.rule == kTe ? TeScope(amax_scope, c.scope != kNone, p.inv_max) : ScopeTerms{};
  }
  const uint32_t key[2] = {0x12345678u, 0x9abcdef0u};
  std::atomic<int64_t> saturated{0};
  loops.quantize(X, out.data(), bmax.data(), terms.data(), key, p, 0, units, &saturated);
  static const char* names[] = {"", "baseline", "avx2", "avx512f"};
  std::printf("%s %s %016llx %lld", c.name, names[clone],
              static_cast<unsigned long long>(Hash(out)),
              static_cast<long long>(saturated.load()));
  for (int i = 0; i < 4; ++i) std::printf(" %08x", U(out[i]));
  std::printf("\n");
}

}  // namespace

int main() {
  fp4lab_env::Set(fp4lab_env::Xla(fp4lab_env::Get()));  // as the kernel's threads compute
  volatile float small = 0x1p-100f, factor = 0x1p-30f;
  std::printf("environment: 2**-100 * 2**-30 = %08x (flushed: 00000000)\n", U(small * factor));
  const Case cases[] = {
      {"nvfp4-1x16", kTe, kTensor, 0, 0, 1, 16, 64, 128, kE2M1, 2},
      {"nvfp4-16x16", kTe, kTensor, 0, 0, 16, 16, 64, 128, kE2M1, 2},
      {"nvfp4-row", kTe, kRow, 0, 0, 1, 16, 64, 128, kE2M1, 2},
      {"nvfp4-none", kTe, kNone, 0, 0, 1, 16, 64, 128, kE2M1, 2},
      {"nvfp4-sr", kTe, kTensor, 1, 0, 1, 16, 64, 128, kE2M1, 2},
      {"nvfp4-in-place-tail", kTe, kTensor, 0, 1, 16, 1, 64, 72, kE2M1, 2},
      {"nvfp4-in-place-sr-tail", kTe, kTensor, 1, 1, 16, 1, 64, 72, kE2M1, 2},
      {"nvfp4-h16-sr", kTe, kTensor, 1, 1, 16, 1, 64, 40, kE2M1, 2, 1},
      {"nvfp4-tiny-scope", kTe, kTensor, 0, 0, 1, 16, 64, 128, kE2M1, 2, 0, 1},
      {"nvfp4-tiny-rows", kTe, kRow, 0, 0, 1, 16, 64, 128, kE2M1, 2, 0, 2},
      {"nvfp4-tiny-scope-sr", kTe, kTensor, 1, 0, 1, 16, 64, 128, kE2M1, 2, 0, 1},
      {"nvfp4-non-finite-rows", kTe, kRow, 0, 0, 1, 16, 60, 128, kE2M1, 2, 0, 0, true},
      {"mxfp4-non-finite", kMxFloor, kNone, 0, 0, 1, 32, 60, 128, kE2M1, 2, 0, 0, true},
      {"nvfp4-e4m3-elems", kTe, kTensor, 0, 0, 1, 16, 64, 128, kE4M3, 8},
      {"mxfp4-floor", kMxFloor, kNone, 0, 0, 1, 32, 64, 128, kE2M1, 2},
      {"mxfp4-ceil", kMxCeil, kNone, 0, 0, 1, 32, 64, 128, kE2M1, 2},
      {"mxfp4-2d-ceil-sr", kMxCeil, kNone, 1, 0, 32, 32, 64, 128, kE2M1, 2},
      {"mxfp4-tiny", kMxFloor, kNone, 0, 0, 1, 32, 64, 128, kE2M1, 2, 0, 1},
      {"mxfp6-e3m2-sr", kMxFloor, kNone, 1, 0, 1, 32, 64, 128, kE3M2, 4},
  };
  for (const Case& c : cases) {
    for (int64_t clone = kBaseline; clone <= kAvx512f; ++clone) {
      state = 0x9E3779B97F4A7C15ull;  // the same inputs in every clone and on every CPU
      Run(c, clone);
    }
  }
  return 0;
}
