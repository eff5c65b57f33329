// The float32 arithmetic of a decode step between its products, shared by tokentui's two native steps
// (core/model/native/decode_step.cpp on tokentui's 4-bit kernels, core/model/native/ggml_step.cpp on ggml's): RMSNorm,
// a dot product, y += p x, the rotation, and attention of one query position over a layer's KV buffers.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "fork_rule.h"
#include "q4_kernels.h"

namespace tokentui_step {

using tokentui_q4::horizontal_sum;

// y = x / sqrt(mean(x^2) + eps) * w over n values (F.rms_norm's arithmetic in float32).
inline void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  float squares = 0.f;
  for (int64_t i = 0; i < n; ++i) squares += x[i] * x[i];
  const float r = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = horizontal_sum(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += p x over n values
inline void axpy(float p, const float* x, float* y, int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += p * x[i];
}

// out[j] = a . b_j for the four rows b_j = b + j * stride, n values each: four independent sums (one a load shared),
// so the FMAs do not wait on one another as a single dot's chain does.
inline void dot4(const float* a, const float* b, int64_t stride, int64_t n, float* out) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    s0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + stride + i), s1);
    s2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 2 * stride + i), s2);
    s3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 3 * stride + i), s3);
  }
  out[0] = horizontal_sum(s0), out[1] = horizontal_sum(s1), out[2] = horizontal_sum(s2), out[3] = horizontal_sum(s3);
  for (; i < n; ++i)
    for (int j = 0; j < 4; ++j) out[j] += a[i] * b[j * stride + i];
}

// o [D] = sum over t of w[t] v_t, v_t = v + t * D: 64 values of o at a time held in registers over every t (rather
// than o loaded and stored again for each t, as axpy would).
inline void weighted_rows(const float* w, const float* v, int64_t length, int64_t D, float* o) {
  int64_t c = 0;
  for (; c + 64 <= D; c += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t t = 0; t < length; ++t) {
      const __m256 p = _mm256_set1_ps(w[t]);
      const float* row = v + t * D + c;
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(row + 8 * j), acc[j]);
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(o + c + 8 * j, acc[j]);
  }
  if (c < D) {  // a head width not a multiple of 64: the rest a row at a time
    std::fill(o + c, o + D, 0.f);
    for (int64_t t = 0; t < length; ++t) axpy(w[t], v + t * D + c, o + c, D - c);
  }
}

// Attention of the query heads [heads, D] over rows 0..pos of the layer's buffers [KV, capacity, D] -> out
// [heads, D]; scores [heads, pos + 1] is scratch. The heads split over torch's threads by the products' rule
// (fork_rule.h, a head's score pass one item): a Qwen3-0.6B layer (16 heads of 128) from 33 rows, the embedded
// SmolLM2's (9 of 64) from 114. With one thread below 256 rows, attention held a 2-thread decode back (BENCHMARKS.md,
// issue 37).
inline void attend(const float* q, const float* keys, const float* values, int64_t capacity, int64_t heads,
            int64_t kv_heads, int64_t D, int64_t pos, float scale, float* scores, float* out) {
  const int64_t group = heads / kv_heads, length = pos + 1;
  at::parallel_for(0, heads, tokentui_fork::grain(length * D), [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const float* k = keys + (h / group) * capacity * D;
      const float* v = values + (h / group) * capacity * D;
      float* s = scores + h * length;
      int64_t t = 0;
      for (; t + 4 <= length; t += 4) dot4(q + h * D, k + t * D, D, D, s + t);
      for (; t < length; ++t) s[t] = dot(q + h * D, k + t * D, D);
      float top = -INFINITY;
      for (t = 0; t < length; ++t) top = std::max(top, s[t] *= scale);
      float total = 0.f;
      for (t = 0; t < length; ++t) total += (s[t] = std::exp(s[t] - top));
      for (t = 0; t < length; ++t) s[t] /= total;
      weighted_rows(s, v, length, D, out + h * D);
    }
  });
}

// v [D] rotated in place as transformers' apply_rotary_pos_emb does it: v cos + rotate_half(v) sin, rotate_half(v)
// = (-v[D/2:], v[:D/2]); scratch [D].
inline void rotate(float* v, const float* c, const float* s, int64_t D, float* scratch) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) scratch[i] = v[i] * c[i] + (i < half ? -v[i + half] : v[i - half]) * s[i];
  std::copy_n(scratch, D, v);
}

}  // namespace tokentui_step
