// tokentui's 4-bit and 8-bit matrix products with the activations rounded to 16-bit integers, for x86 CPUs with
// AVX2 and FMA (core/model/native/q4_native.py's "avx2-int16" kernel; the default where it builds).
//
// Why: the float32 kernels of q4_kernels.h spend ~22 instructions a group of 32 weights (unpacking each nibble to a
// float32 lane, then a multiply-add per weight) and are bound by them, not by memory. Here each group of 32
// activations is rounded to int16 with a float32 scale of its own (sx = max |x| / 32767, so every value is within
// sx / 2 of x: ~1.5e-5 of the group's largest, where llama.cpp's 8-bit activations are ~4e-3 and bfloat16's 2e-3 of
// each value), and the weights are multiplied as integers: _mm256_madd_epi16 sums 16 products a lane pair at a
// time, exactly (a 4-bit value times an int16 stays under 2^19, an int8 one under 2^22; a group's 32 products under
// 2^27). Per group: one widening load, two masks / shifts, two multiply-adds of integer pairs, one conversion and
// one float multiply-add by d sx: ~13 instructions.
//
// Layout (per row n, per group g of 32 inputs): 16 bytes; byte j holds input 32 g + j in its low nibble and input
// 32 g + 16 + j in its high nibble. dm[n, g] = (d, m) float32 as in q4_kernels.h: w = d q + m, and
// sum_k w x = d sum_k q x + m sum_k x, the group sums of x taken in float32 from the unrounded x.
// An 8-bit matrix (a Q8_0 head): the file's int8 values as they are, one d per group.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <limits>
#include <vector>

#include "q4_kernels.h"

namespace tokentui_q4 {

// Rows of x [M, K] float32 rounded to int16 per group of 32: x16 [M, K], sx [M, G] (x ~ x16 sx), xsum [M, G] (the
// float32 sums of x, for the 4-bit zero term).
struct RoundedRows {
  std::vector<int16_t> x16;
  std::vector<float> sx, xsum;

  RoundedRows(const float* x, int64_t M, int64_t K) : x16(M * K), sx(M * K / kGroup), xsum(M * K / kGroup) {
    for (int64_t i = 0; i < M * K / kGroup; ++i) {
      const float* v = x + i * kGroup;
      float top = 0.f, s = 0.f;
      for (int64_t k = 0; k < kGroup; ++k) {
        top = std::max(top, std::fabs(v[k]));
        s += v[k];
      }
      xsum[i] = s;
      if (!std::isfinite(s)) {  // a NaN or an infinity in the group: its products come out NaN, as float32's would
        sx[i] = std::numeric_limits<float>::quiet_NaN();
        continue;  // (x16 stays 0: a NaN has no int16 value)
      }
      const float inv = top > 0.f ? 32767.f / top : 0.f;
      for (int64_t k = 0; k < kGroup; ++k)
        x16[i * kGroup + k] = static_cast<int16_t>(std::clamp(std::nearbyint(v[k] * inv), -32767.f, 32767.f));
      sx[i] = top / 32767.f;
    }
  }
};

// The 32 products of a group of int16 activations xp with 16 int16 weights w0 (inputs 0..15) and w1 (16..31), as
// 8 int32 lanes.
inline __m256i group_dot(__m256i w0, __m256i w1, const int16_t* xp) {
  return _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp))),
                          _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 16))));
}

// Rows [n0, n1) of y for MT consecutive rows of x (a RoundedRows' arrays and y already offset to the first).
template <int MT>
inline void rows_i16(const int16_t* x16, const float* sx, const float* xsum, int64_t K, const uint8_t* packed,
                     const float* dm, float* y, int64_t N, int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup;
  const __m256i low = _mm256_set1_epi16(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = packed + n * (K / 2);
    const float* row_dm = dm + n * G * 2;
    __m256 acc[MT];
    float min_acc[MT];
    for (int i = 0; i < MT; ++i) {
      acc[i] = _mm256_setzero_ps();
      min_acc[i] = 0.f;
    }
    __m256 odd[MT];  // odd groups' sums: two chains of dependent multiply-adds instead of one (a group's work is
                     // shorter than a multiply-add's latency), added at the end in a fixed order
    for (int i = 0; i < MT; ++i) odd[i] = _mm256_setzero_ps();
    auto group = [&](int64_t g, __m256* sums) {
      const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16)));
      const __m256i w0 = _mm256_and_si256(bytes, low), w1 = _mm256_srli_epi16(bytes, 4);
      const float d = row_dm[2 * g], m = row_dm[2 * g + 1];
      for (int i = 0; i < MT; ++i) {
        const __m256i p = group_dot(w0, w1, x16 + i * K + g * kGroup);
        sums[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * sx[i * G + g]), sums[i]);
        min_acc[i] += m * xsum[i * G + g];
      }
    };
    int64_t g = 0;
    for (; g + 2 <= G; g += 2) {
      group(g, acc);
      group(g + 1, odd);
    }
    if (g < G) group(g, acc);
    for (int i = 0; i < MT; ++i) y[i * N + n] = horizontal_sum(_mm256_add_ps(acc[i], odd[i])) + min_acc[i];
  }
}

// The same for an 8-bit W: q [N, K] int8, d [N, K / 32].
template <int MT>
inline void rows8_i16(const int16_t* x16, const float* sx, int64_t K, const int8_t* q, const float* d, float* y,
                      int64_t N, int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = q + n * K;
    __m256 acc[MT];
    for (int i = 0; i < MT; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * kGroup)));
      const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * kGroup + 16)));
      const float scale = d[n * G + g];
      for (int i = 0; i < MT; ++i) {
        const __m256i p = group_dot(w0, w1, x16 + i * K + g * kGroup);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale * sx[i * G + g]), acc[i]);
      }
    }
    for (int i = 0; i < MT; ++i) y[i * N + n] = horizontal_sum(acc[i]);
  }
}

// Rows [n0, n1) of a 4-bit W in this layout de-quantized to float32 into out [n1 - n0, K] (w = d q + m, one
// multiply-add per weight, as q4_kernels.h's dequantize_rows): for a prefill's wide_product.
inline void dequantize_rows_i16(const uint8_t* packed, const float* dm, int64_t K, int64_t n0, int64_t n1,
                                float* out) {
  const int64_t G = K / kGroup;
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = packed + n * (K / 2);
    const float* row_dm = dm + n * G * 2;
    float* dst = out + (n - n0) * K;
    for (int64_t g = 0; g < G; ++g) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16));
      const __m128i lo = _mm_and_si128(bytes, low), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
      const __m256 d = _mm256_set1_ps(row_dm[2 * g]), m = _mm256_set1_ps(row_dm[2 * g + 1]);
      const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};  // inputs 0-7, 8-15, ...
      for (int t = 0; t < 4; ++t) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[t]));
        _mm256_storeu_ps(dst + g * kGroup + 8 * t, _mm256_fmadd_ps(q, d, m));
      }
    }
  }
}

// y [M, N] = x [M, K] W^T for a few rows of x (M below kWideRows), W 4-bit in this layout.
inline void q4_rows_product_i16(const float* x, int64_t M, int64_t K, const uint8_t* packed, const float* dm,
                                float* y, int64_t N) {
  const int64_t G = K / kGroup;
  const RoundedRows r(x, M, K);
  tokentui_fork::shared_for(0, N, 16, 1, [&](int64_t n0, int64_t n1) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)  // four rows of x share each group's unpacked weights
      rows_i16<4>(r.x16.data() + m * K, r.sx.data() + m * G, r.xsum.data() + m * G, K, packed, dm, y + m * N, N,
                  n0, n1);
    for (; m < M; ++m)
      rows_i16<1>(r.x16.data() + m * K, r.sx.data() + m * G, r.xsum.data() + m * G, K, packed, dm, y + m * N, N,
                  n0, n1);
  });
}

// The same for an 8-bit W: q [N, K] int8, d [N, K / 32].
inline void q8_rows_product_i16(const float* x, int64_t M, int64_t K, const int8_t* q, const float* d, float* y,
                                int64_t N) {
  const int64_t G = K / kGroup;
  const RoundedRows r(x, M, K);
  tokentui_fork::shared_for(0, N, 16, 1, [&](int64_t n0, int64_t n1) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)
      rows8_i16<4>(r.x16.data() + m * K, r.sx.data() + m * G, K, q, d, y + m * N, N, n0, n1);
    for (; m < M; ++m) rows8_i16<1>(r.x16.data() + m * K, r.sx.data() + m * G, K, q, d, y + m * N, N, n0, n1);
  });
}

}  // namespace tokentui_q4
