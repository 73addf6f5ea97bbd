// The Threefry-2x32 hash (20 rounds; Salmon et al. 2011), called through XLA's FFI
// (fp4lab.core.cpu_kernels builds this file). Integer arithmetic only, so the results are those
// of the same rounds written out in XLA, bit for bit, on any CPU. Two handlers:
//
// fp4lab_threefry: counters (0, c) under keys, fp4lab.core.prng's fold_in and split.
// Inputs, uint32: keys (..., 2) and counters (..., S) with the same number of leading
// (batch) axes, each of size 1 or the result's (a vmapped call adds one in front per vmap,
// of size 1 where that input is not batched). Output, uint32 (..., S, 2): for each counter
// c the key (y0, y1) = threefry2x32(key, (0, c)) (jax's fold_in and split). Meant for keys
// (a few counters): one thread, no vector clones.
//
// fp4lab_threefry2x32: jax's own primitive, (k0, k1, x0, x1) -> (y0, y1) elementwise, four
// inputs and two outputs of one shape (`fp4lab.core.cpu_kernels.lower_jax_threefry`, which
// broadcasts the inputs first).

#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline uint32_t Rotl(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }

// threefry2x32((k0, k1), (c0, c1)) -> (y0, y1)
inline void Hash(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1, uint32_t* y0,
                 uint32_t* y1) {
  static constexpr int kRot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  uint32_t x0 = c0 + ks[0], x1 = c1 + ks[1];
  for (int g = 0; g < 5; ++g) {
    for (int i = 0; i < 4; ++i) {
      x0 += x1;
      x1 = Rotl(x1, kRot[g % 2][i]) ^ x0;
    }
    x0 += ks[(g + 1) % 3];
    x1 += ks[(g + 2) % 3] + static_cast<uint32_t>(g + 1);
  }
  *y0 = x0;
  *y1 = x1;
}

ffi::Error Threefry(ffi::Buffer<ffi::U32> keys, ffi::Buffer<ffi::U32> counts,
                    ffi::ResultBuffer<ffi::U32> out) {
  const auto kd = keys.dimensions(), cd = counts.dimensions(), od = out->dimensions();
  const int64_t nb = static_cast<int64_t>(kd.size()) - 1;  // batch axes
  if (nb < 0 || kd[nb] != 2 || static_cast<int64_t>(cd.size()) < nb ||
      od.size() != cd.size() + 1 || od[od.size() - 1] != 2) {
    return ffi::Error::InvalidArgument("fp4lab_threefry: keys (..., 2), counters (..., S)");
  }
  int64_t core = 1;  // counters per batch member
  for (size_t i = nb; i < cd.size(); ++i) core *= cd[i];
  // per batch axis: the result's size and the strides (0 where broadcast) of keys and counters
  std::vector<int64_t> size(nb), kstride(nb), cstride(nb);
  int64_t ks = 2, cs = core, members = 1;
  for (int64_t i = nb - 1; i >= 0; --i) {
    size[i] = od[i];
    if ((kd[i] != 1 && kd[i] != od[i]) || (cd[i] != 1 && cd[i] != od[i])) {
      return ffi::Error::InvalidArgument("fp4lab_threefry: batch axes do not broadcast");
    }
    kstride[i] = kd[i] == 1 ? 0 : ks;
    cstride[i] = cd[i] == 1 ? 0 : cs;
    ks *= kd[i];
    cs *= cd[i];
    members *= od[i];
  }
  const uint32_t* K = keys.typed_data();
  const uint32_t* C = counts.typed_data();
  uint32_t* O = out->typed_data();
  std::vector<int64_t> at(nb, 0);
  for (int64_t m = 0; m < members; ++m) {
    int64_t ko = 0, co = 0;
    for (int64_t i = 0; i < nb; ++i) {
      ko += at[i] * kstride[i];
      co += at[i] * cstride[i];
    }
    const uint32_t k0 = K[ko], k1 = K[ko + 1];
    const uint32_t* c = C + co;
    uint32_t* o = O + 2 * m * core;
    for (int64_t j = 0; j < core; ++j) Hash(k0, k1, 0, c[j], o + 2 * j, o + 2 * j + 1);
    for (int64_t i = nb - 1; i >= 0 && ++at[i] == size[i]; --i) at[i] = 0;
  }
  return ffi::Error::Success();
}

ffi::Error Threefry2x32(ffi::Buffer<ffi::U32> k0, ffi::Buffer<ffi::U32> k1,
                        ffi::Buffer<ffi::U32> x0, ffi::Buffer<ffi::U32> x1,
                        ffi::ResultBuffer<ffi::U32> y0, ffi::ResultBuffer<ffi::U32> y1) {
  const size_t n = y0->element_count();
  if (k0.element_count() != n || k1.element_count() != n || x0.element_count() != n ||
      x1.element_count() != n || y1->element_count() != n) {
    return ffi::Error::InvalidArgument("fp4lab_threefry2x32: six arrays of one size");
  }
  const uint32_t *a = k0.typed_data(), *b = k1.typed_data();
  const uint32_t *c = x0.typed_data(), *d = x1.typed_data();
  uint32_t *p = y0->typed_data(), *q = y1->typed_data();
  for (size_t i = 0; i < n; ++i) Hash(a[i], b[i], c[i], d[i], p + i, q + i);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(fp4lab_threefry, Threefry,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::U32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fp4lab_threefry2x32, Threefry2x32,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::U32>>());
