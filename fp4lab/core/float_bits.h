// Float32 from the bits, for quantize.cc: the bit helpers of its scale rules and the steps the
// reference computes exactly below 2**-126 (fp4lab.core.subnormal), each the same value as the
// jnp function its comment names. quantize.cc includes this file once, inside its anonymous
// namespace, before the scale rules that call it; it needs <algorithm>, <cmath>, <cstdint> and
// <cstring>, which quantize.cc includes first. No include guard: included once.

constexpr float kFltMax = 3.40282346638528859812e+38f;
constexpr uint32_t kAbs = 0x7fffffffu, kInf = 0x7f800000u, kSign = 0x80000000u;

inline float F(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t U(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float Nan() { return F(0x7fc00000u); }
// XLA's min: NaN if either operand is NaN
inline float Min(float a, float b) { return (a != a || b != b) ? Nan() : (b < a ? b : a); }
inline bool BelowNormal(float v) { return std::fabs(v) < 0x1p-126f; }  // subnormal.below_normal

// |v| = n * 2**e exactly, from the bits (subnormals too): subnormal._significand, as a double
inline double Exact(float v) {
  const uint32_t b = U(v) & kAbs;
  const uint32_t field = b >> 23, mant = b & 0x7fffffu;
  return field == 0 ? std::ldexp(double(mant), -149) : std::ldexp(double(mant | 0x800000u), int(field) - 150);
}

// RN(p) as float32 with gradual underflow, for 0 <= p below FLT_MAX, p a double: the float
// bits built from the integer quantum count below 2**-126 (a conversion would flush there)
inline float RoundToFloat(double p) {
  if (p >= 0x1p-126) return static_cast<float>(p);
  return F(static_cast<uint32_t>(std::nearbyint(p * 0x1p149)));  // m * 2**-149, m <= 2**23
}

// subnormal.reciprocal: RN(1 / s) for finite s > 0, subnormal for s > 2**126
inline float Reciprocal(float s) {
  if (s > 0x1p126f && s <= kFltMax) return RoundToFloat(1.0 / double(s));
  return 1.0f / s;
}

// subnormal.product_up: RN(s * d) * 2**64, s an E4M3 value >= 0, d >= 0 (subnormal read from bits)
inline float ProductUp(float s, float d) {
  if (s != s || d != d) return Nan();
  const double p = double(s) * Exact(d);  // exact: 4 and 24 significant bits
  if (p >= 0x1p-126) return static_cast<float>(p * 0x1p64);
  return static_cast<float>(std::nearbyint(p * 0x1p149)) * 0x1p-85f;
}

// formats.exponent: floor(log2 a) for a > 0 from the bits (subnormals included; inf/NaN: 128)
inline int32_t Exponent(float a) {
  const uint32_t b = U(a);
  const int32_t field = (b >> 23) & 0xff, mant = b & 0x7fffff;
  if (field != 0) return field - 127;
  return (31 - __builtin_clz(std::max(mant, 1))) - 149;
}

// formats.pow2: 2**e for e in [-149, 127], from the bits
inline float Pow2(int32_t e) {
  if (e >= -126) return F(uint32_t(std::min(e, 127) + 127) << 23);
  return F(uint32_t(1) << std::max(0, std::min(e + 149, 22)));
}

// formats.round_pow2(x, "ceil") then formats.exponent: the E8M0 exponent of RCEIL
inline int32_t CeilExponent(float x) {
  const uint32_t b = U(x);
  const int32_t bits = int32_t(b);
  const bool positive = bits > 0 && bits < int32_t(kInf);
  if ((b & kAbs) >= kInf) return 128;  // round_pow2 gives NaN, whose exponent field is 255
  if (!positive) return -127;
  int32_t e = Exponent(x);
  const uint32_t mant = b & 0x7fffffu;
  uint32_t frac = mant;
  if ((b & kInf) == 0) {
    const int32_t top = 31 - __builtin_clz(std::max<uint32_t>(mant, 1));
    frac = (mant << (23 - top)) & 0x7fffffu;
  }
  if (frac != 0) e += 1;
  return std::max(-127, std::min(e, 127));
}

// subnormal.divide for d a positive constant: RN(a / d), subnormal results included
inline float Divide(float a, float d) {
  if (a < d * 0x1p-126f) return RoundToFloat(Exact(a) / double(d));
  return a / d;
}
