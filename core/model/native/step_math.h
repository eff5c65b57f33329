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
      float top = -INFINITY;
      for (int64_t t = 0; t < length; ++t) {
        s[t] = scale * dot(q + h * D, k + t * D, D);
        top = std::max(top, s[t]);
      }
      float total = 0.f;
      for (int64_t t = 0; t < length; ++t) total += (s[t] = std::exp(s[t] - top));
      float* o = out + h * D;
      std::fill_n(o, D, 0.f);
      for (int64_t t = 0; t < length; ++t) axpy(s[t] / total, v + t * D, o, D);
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
