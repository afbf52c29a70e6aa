// Element types of the kernel layer, and host-side conversions for the two 16-bit floats.
//
// The kernel layer knows nothing about XLA: handlers map ffi::DataType onto DType. float16
// and bfloat16 are stored as 16-bit patterns (bf16_t / f16_t) on the host; arithmetic always
// happens in float (or double for float64) after load_acc(). The integer dtypes (int8, int32,
// int64) serve integer convolutions only (conv's direct algorithms): dispatch_io leaves them
// out, so no other kernel is instantiated for them; dispatch_int_io has their pairs.
#pragma once

#include <cstdint>
#include <cstring>

namespace jaxdnn {

enum class DType : int { kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3, kS8 = 4, kS32 = 5, kS64 = 6 };

inline bool is_integer(DType t) { return t == DType::kS8 || t == DType::kS32 || t == DType::kS64; }

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kS8: return "int8";
    case DType::kS32: return "int32";
    case DType::kS64: return "int64";
  }
  return "?";
}

inline int dtype_bytes(DType t) {
  switch (t) {
    case DType::kF64: case DType::kS64: return 8;
    case DType::kF32: case DType::kS32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kS8: return 1;
  }
  return 0;
}

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float to_float(bf16_t v) { return bits_to_float(uint32_t(v.bits) << 16); }

inline bf16_t bf16_from_float(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{uint16_t(u >> 16)};
}

inline float to_float(f16_t v) {
  uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu, man = v.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));   // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
  // Subnormal (or zero): value = man * 2^-24.
  float f = float(man) * (1.0f / 16777216.0f);
  return sign ? -f : f;
}

inline f16_t f16_from_float(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16_t{uint16_t(sign | 0x7e00u)};               // NaN
  if (a >= 0x477ff000u) return f16_t{uint16_t(sign | 0x7c00u)};              // overflow -> inf
  if (a < 0x38800000u) {                                                     // subnormal range
    // Scale into units of 2^-24 and round to nearest even through the float adder.
    float scaled = bits_to_float(a) * 16777216.0f;
    float r = scaled + 12582912.0f;  // 1.5 * 2^23 forces rounding to an integer
    uint32_t m = float_to_bits(r) - 0x4b400000u;
    return f16_t{uint16_t(sign | m)};
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return f16_t{uint16_t(sign | (a >> 13))};
}

// Accumulator type per storage type: double for float64, float for everything else.
template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <typename T> using acc_t = typename AccOf<T>::type;

inline float load_acc(float v) { return v; }
inline double load_acc(double v) { return v; }
inline float load_acc(bf16_t v) { return to_float(v); }
inline float load_acc(f16_t v) { return to_float(v); }

template <typename T> inline T store_as(double v);
template <> inline float store_as<float>(double v) { return float(v); }
template <> inline double store_as<double>(double v) { return v; }
template <> inline bf16_t store_as<bf16_t>(double v) { return bf16_from_float(float(v)); }
template <> inline f16_t store_as<f16_t>(double v) { return f16_from_float(float(v)); }

template <typename T> inline T store_as_f(float v);
template <> inline float store_as_f<float>(float v) { return v; }
template <> inline bf16_t store_as_f<bf16_t>(float v) { return bf16_from_float(v); }
template <> inline f16_t store_as_f<f16_t>(float v) { return f16_from_float(v); }

// Calls fn(In{}, Out{}) with the host storage types of an (input, output) dtype pair. The
// supported pairs are the same dtype, and float16/bfloat16 inputs with a float32 output.
// Returns false (and calls nothing) for any other pair: the caller reports the error.
template <typename Fn>
bool dispatch_io(DType in, DType out, Fn&& fn) {
  if (in == out) {
    switch (in) {
      case DType::kF32: fn(float{}, float{}); return true;
      case DType::kF64: fn(double{}, double{}); return true;
      case DType::kF16: fn(f16_t{}, f16_t{}); return true;
      case DType::kBF16: fn(bf16_t{}, bf16_t{}); return true;
      default: break;  // integers: dispatch_int_io
    }
  }
  if (out == DType::kF32 && in == DType::kF16) { fn(f16_t{}, float{}); return true; }
  if (out == DType::kF32 && in == DType::kBF16) { fn(bf16_t{}, float{}); return true; }
  return false;
}

// Integer convolutions sum in the unsigned type of their accumulator's width, int32 for int8
// and int32 inputs and int64 for int64 ones: unsigned arithmetic wraps (modulo 2^32 or 2^64)
// where signed overflow would be undefined, and its low bits are the two's complement sum that
// XLA's integer convolutions compute. A result keeps the low bits of the sum: Out(acc).
template <typename T> struct IntAcc;
template <> struct IntAcc<int8_t> { using type = uint32_t; };
template <> struct IntAcc<int32_t> { using type = uint32_t; };
template <> struct IntAcc<int64_t> { using type = uint64_t; };
template <typename T> using int_acc_t = typename IntAcc<T>::type;

// Calls fn(In{}, Out{}) with the storage types of an integer (input, output) pair: int8 inputs
// with an int8 or int32 result, int32 -> int32 and int64 -> int64. Returns false (and calls
// nothing) for any other pair.
template <typename Fn>
bool dispatch_int_io(DType in, DType out, Fn&& fn) {
  if (in == DType::kS8 && out == DType::kS8) { fn(int8_t{}, int8_t{}); return true; }
  if (in == DType::kS8 && out == DType::kS32) { fn(int8_t{}, int32_t{}); return true; }
  if (in == DType::kS32 && out == DType::kS32) { fn(int32_t{}, int32_t{}); return true; }
  if (in == DType::kS64 && out == DType::kS64) { fn(int64_t{}, int64_t{}); return true; }
  return false;
}

}  // namespace jaxdnn
