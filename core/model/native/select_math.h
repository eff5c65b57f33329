// select.cpp's and select_chain.cpp's 8-wide arithmetic: exp and log polynomials (why hand-written: at each),
// float64 sums of float32 lanes, partial loads, and the array passes built on them (a token's rank among them).
#pragma once
#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

namespace tokentui_select {

// ---- exp for arguments <= 0 -------------------------------------------------------------------------------
// Cephes' expf (range reduction by ln 2 in two parts, then a degree-6 polynomial; relative error below 2e-7),
// hand-written because it is ~4x faster than SLEEF's IEEE-complete expf8_u10 here, which was 40 % of a call. The
// scale 2^n is applied in two halves so that results below FLT_MIN come out as the denormals (and, below about
// -103.97, the zeros) that torch's exp gives: a token whose probability underflows is not kept, as in the torch path.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-174.f));  // exp(-174) is 0 in float; keeps both halves of n >= -126
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i k = _mm256_cvtps_epi32(n);  // in [-251, 0]
  const __m256i half = _mm256_srai_epi32(k, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(k, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}

// log for the draw's uniforms, in [0, 1): Cephes' logf (the mantissa in [sqrt(1/2), sqrt(2)), a degree-8 polynomial,
// ln 2 in two parts; relative error below 1e-7), hand-written for the same reason as exp8: SLEEF's logf8_u10 was
// ~70 us of the whole-vocabulary draw at V = 49,152. log(0) is -inf, as std::log's (a u of 0 never wins the race).
inline __m256 log8(__m256 x) {
  const __m256 zero_in = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ);
  const __m256i bits = _mm256_castps_si256(x);
  __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)),
                                                 _mm256_set1_epi32(0x3f000000)));  // in [1/2, 1)
  const __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm256_sub_ps(e, _mm256_and_ps(small, _mm256_set1_ps(1.f)));
  m = _mm256_sub_ps(_mm256_add_ps(m, _mm256_and_ps(small, m)), _mm256_set1_ps(1.f));  // in [sqrt(1/2) - 1, sqrt(2) - 1)
  const __m256 z = _mm256_mul_ps(m, m);
  __m256 y = _mm256_set1_ps(7.0376836292e-2f);
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.1514610310e-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(1.1676998740e-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.2420140846e-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(1.4249322787e-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.6668057665e-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(2.0000714765e-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-2.4999993993e-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(3.3333331174e-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, m), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  const __m256 r = _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(m, y));
  return _mm256_blendv_ps(r, _mm256_set1_ps(-INFINITY), zero_in);
}

// ---- small vector helpers ------------------------------------------------------------------------------------
inline double hsum(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

inline void add_d(__m256d& lo, __m256d& hi, __m256 v) {  // float32 lanes summed in float64
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

inline __m256 load_part(const float* p, int64_t n, float pad) {  // n < 8 lanes of p, the rest `pad`
  alignas(32) float tmp[8];
  for (int i = 0; i < 8; ++i) tmp[i] = i < n ? p[i] : pad;
  return _mm256_load_ps(tmp);
}

inline __m256 lanes(int64_t n) {  // a mask of the first n lanes
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx));
}

// exp(in[i] - shift) for n values (exp8, as the whole-vocabulary pass computes them).
inline void exp_shifted(const float* in, int64_t n, float shift, float* out) {
  const __m256 sh = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(in + i), sh)));
  if (i < n) {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, exp8(_mm256_sub_ps(load_part(in + i, n - i, shift), sh)));
    for (int64_t j = i; j < n; ++j) out[j] = tmp[j - i];
  }
}

// Exp(1) noise from uniforms: max(-log(u), FLT_MIN), as select.py's exp_noise (a u of 0 gives +inf noise).
inline void exp_noise(const float* u, int64_t n, float* out) {
  const __m256 tiny = _mm256_set1_ps(FLT_MIN), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_max_ps(_mm256_sub_ps(zero, log8(_mm256_loadu_ps(u + i))), tiny));
  if (i < n) {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, _mm256_max_ps(_mm256_sub_ps(zero, log8(load_part(u + i, n - i, 1.0f))), tiny));
    for (int64_t j = i; j < n; ++j) out[j] = tmp[j - i];
  }
}

// How many of the v scores are above `value`: a token's rank (select.cpp's and select_chain.cpp's report).
inline int64_t count_above(const float* x, int64_t v, float value) {
  const __m256 c = _mm256_set1_ps(value);
  int64_t count = 0, i = 0;
  for (; i + 8 <= v; i += 8) count += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), c, _CMP_GT_OQ)));
  for (; i < v; ++i) count += x[i] > value;
  return count;
}

}  // namespace tokentui_select
