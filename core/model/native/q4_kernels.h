// tokentui's 4-bit and 8-bit matrix products for x86 CPUs with AVX2 and FMA, as functions on raw pointers: the
// kernels behind the ops of q4_avx2.cpp (one product a call) and decode_step.cpp (a whole decode step a call).
// q4_avx2.cpp's comment says what they compute, why they are hand-written and how the weights are laid out.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "fork_rule.h"

namespace tokentui_q4 {


constexpr int64_t kGroup = 32;

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Rows [n0, n1) of y for MT consecutive rows of x (x, xsum and y already offset to the first of them).
template <int MT>
inline void rows(const float* x, int64_t K, const uint8_t* packed, const float* dm, const float* xsum, float* y,
          int64_t N, int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup;
  const __m256i mask = _mm256_set1_epi32(0xF);
  const __m256i s0 = _mm256_setr_epi32(0, 0, 0, 0, 16, 16, 16, 16);
  const __m256i s1 = _mm256_setr_epi32(4, 4, 4, 4, 20, 20, 20, 20);
  const __m256i s2 = _mm256_setr_epi32(8, 8, 8, 8, 24, 24, 24, 24);
  const __m256i s3 = _mm256_setr_epi32(12, 12, 12, 12, 28, 28, 28, 28);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = packed + n * (K / 2);
    const float* row_dm = dm + n * G * 2;
    __m256 acc[MT];
    float min_acc[MT];
    for (int i = 0; i < MT; ++i) {
      acc[i] = _mm256_setzero_ps();
      min_acc[i] = 0.f;
    }
    for (int64_t g = 0; g < G; ++g) {
      const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16)));
      const __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s0), mask));
      const __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s1), mask));
      const __m256 q2 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s2), mask));
      const __m256 q3 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s3), mask));
      const __m256 d = _mm256_set1_ps(row_dm[2 * g]);
      const float m = row_dm[2 * g + 1];
      for (int i = 0; i < MT; ++i) {
        const float* xp = x + i * K + g * kGroup;
        __m256 group = _mm256_mul_ps(q0, _mm256_loadu_ps(xp));
        group = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xp + 8), group);
        group = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xp + 16), group);
        group = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xp + 24), group);
        acc[i] = _mm256_fmadd_ps(d, group, acc[i]);
        min_acc[i] += m * xsum[i * G + g];
      }
    }
    for (int i = 0; i < MT; ++i) y[i * N + n] = horizontal_sum(acc[i]) + min_acc[i];
  }
}

// Rows [n0, n1) of W de-quantized to float32 into out [n1 - n0, K]: w = d q + m, one multiply-add per weight in
// float32 (how gguf-py's de-quantization computes them).
inline void dequantize_rows(const uint8_t* packed, const float* dm, int64_t K, int64_t n0, int64_t n1, float* out) {
  const int64_t G = K / kGroup;
  const __m256i mask = _mm256_set1_epi32(0xF);
  const __m256i shifts[4] = {_mm256_setr_epi32(0, 0, 0, 0, 16, 16, 16, 16), _mm256_setr_epi32(4, 4, 4, 4, 20, 20, 20, 20),
                             _mm256_setr_epi32(8, 8, 8, 8, 24, 24, 24, 24),
                             _mm256_setr_epi32(12, 12, 12, 12, 28, 28, 28, 28)};
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = packed + n * (K / 2);
    const float* row_dm = dm + n * G * 2;
    float* dst = out + (n - n0) * K;
    for (int64_t g = 0; g < G; ++g) {
      const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16)));
      const __m256 d = _mm256_set1_ps(row_dm[2 * g]), m = _mm256_set1_ps(row_dm[2 * g + 1]);
      for (int t = 0; t < 4; ++t) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, shifts[t]), mask));
        _mm256_storeu_ps(dst + g * kGroup + 8 * t, _mm256_fmadd_ps(q, d, m));
      }
    }
  }
}

// Many rows of x (a prefill): W de-quantized a block of rows at a time into a float32 buffer that stays in the
// caches, and multiplied by torch's own float32 matrix product (MKL's blocking), which the unpacking above cannot
// match once it is shared by more than a few rows of x.
// dequantize(b, e, out) writes rows [b, e) of W to out.
template <typename Dequantize>
inline at::Tensor wide_product(const at::Tensor& x, int64_t N, const Dequantize& dequantize) {
  const int64_t K = x.size(1);
  const int64_t block = std::max<int64_t>(64, (int64_t{4} << 20) / (K * 4));  // rows of W per ~4 MB of float32
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  at::Tensor w = at::empty({std::min(N, block), K}, x.options());
  float* wd = w.data_ptr<float>();
  for (int64_t n0 = 0; n0 < N; n0 += block) {
    const int64_t n1 = std::min(N, n0 + block);
    at::parallel_for(n0, n1, 16, [&](int64_t b, int64_t e) { dequantize(b, e, wd + (b - n0) * K); });
    y.narrow(1, n0, n1 - n0).copy_(at::mm(x, w.narrow(0, 0, n1 - n0).t()));
  }
  return y;
}

// An 8-bit matrix (a Q8_0 head: w = d q, q in -128..127, one d per group of 32) in the same way: rows [n0, n1)
// of y for MT rows of x. q [N, K] int8 as the file stores it, d [N, K / 32] float32.
template <int MT>
inline void rows8(const float* x, int64_t K, const int8_t* q, const float* d, float* y, int64_t N, int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = q + n * K;
    __m256 acc[MT];
    for (int i = 0; i < MT; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const int8_t* p = row + g * kGroup;
      __m256 v[4];
      for (int t = 0; t < 4; ++t)
        v[t] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * t))));
      const __m256 scale = _mm256_set1_ps(d[n * G + g]);
      for (int i = 0; i < MT; ++i) {
        const float* xp = x + i * K + g * kGroup;
        __m256 group = _mm256_mul_ps(v[0], _mm256_loadu_ps(xp));
        group = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xp + 8), group);
        group = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xp + 16), group);
        group = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xp + 24), group);
        acc[i] = _mm256_fmadd_ps(scale, group, acc[i]);
      }
    }
    for (int i = 0; i < MT; ++i) y[i * N + n] = horizontal_sum(acc[i]);
  }
}

inline void dequantize_rows8(const int8_t* q, const float* d, int64_t K, int64_t n0, int64_t n1, float* out) {
  const int64_t G = K / kGroup;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const __m256 scale = _mm256_set1_ps(d[n * G + g]);
      for (int t = 0; t < 4; ++t) {
        const int64_t k = g * kGroup + 8 * t;
        const __m256 v = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + n * K + k))));
        _mm256_storeu_ps(out + (n - n0) * K + k, _mm256_mul_ps(v, scale));
      }
    }
}


// y [M, N] = x [M, K] W^T for a few rows of x (M below kWideRows), W 4-bit: packed [N, K / 2], dm [N, K / 32, 2].
// Rows of W split over torch's threads; each output summed by one thread in a fixed order.
inline void q4_rows_product(const float* x, int64_t M, int64_t K, const uint8_t* packed, const float* dm, float* y,
                            int64_t N) {
  const int64_t G = K / kGroup;
  std::vector<float> xsum(M * G);  // [M, G]: each group's sum of x
  for (int64_t i = 0; i < M * G; ++i) {
    float s = 0.f;
    for (int64_t k = 0; k < kGroup; ++k) s += x[i * kGroup + k];
    xsum[i] = s;
  }
  tokentui_fork::shared_for(0, N, 16, 1, [&](int64_t n0, int64_t n1) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)  // four rows of x share each group's unpacked weights
      rows<4>(x + m * K, K, packed, dm, xsum.data() + m * G, y + m * N, N, n0, n1);
    for (; m < M; ++m) rows<1>(x + m * K, K, packed, dm, xsum.data() + m * G, y + m * N, N, n0, n1);
  });
}

// The same for an 8-bit W: q [N, K] int8, d [N, K / 32].
inline void q8_rows_product(const float* x, int64_t M, int64_t K, const int8_t* q, const float* d, float* y,
                            int64_t N) {
  tokentui_fork::shared_for(0, N, 16, 1, [&](int64_t n0, int64_t n1) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows8<4>(x + m * K, K, q, d, y + m * N, N, n0, n1);
    for (; m < M; ++m) rows8<1>(x + m * K, K, q, d, y + m * N, N, n0, n1);
  });
}

}  // namespace tokentui_q4
