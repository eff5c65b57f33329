// select.cpp's draw: the uniforms torch's `Tensor.uniform_` would draw from a CPU generator, made here from the
// generator's own state (at::mt19937) eight words at a time, and the state written back where uniform_ leaves it.
#pragma once
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace tokentui_select {

// ---- the random stream: at::mt19937 (ATen/core/MT19937RNGEngine.h) and uniform_'s float conversion ----------
namespace mt {
constexpr int N = 624, M = 397;
constexpr uint32_t MATRIX_A = 0x9908b0df, UMASK = 0x80000000, LMASK = 0x7fffffff;

inline uint32_t twist(uint32_t u, uint32_t v) {
  return (((u & UMASK) | (v & LMASK)) >> 1) ^ ((v & 1) ? MATRIX_A : 0);
}

inline __m256i load(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline __m256i twist8(__m256i u, __m256i v) {
  const __m256i mix = _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(UMASK))),
                                      _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(LMASK))));
  const __m256i odd = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(v, _mm256_set1_epi32(1)));
  return _mm256_xor_si256(_mm256_srli_epi32(mix, 1), _mm256_and_si256(odd, _mm256_set1_epi32(static_cast<int>(MATRIX_A))));
}

// mt19937_engine::next_state, 8 words at a time: word i reads words i + 1 (not yet rewritten) and i + M (first
// loop, not yet rewritten) or i + M - N (second loop, rewritten at least 8 words earlier), as the scalar loop does.
inline void next_state(uint32_t* s) {
  int i = 0;
  for (; i + 8 <= N - M; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s + i), _mm256_xor_si256(load(s + i + M), twist8(load(s + i), load(s + i + 1))));
  for (; i < N - M; ++i) s[i] = s[i + M] ^ twist(s[i], s[i + 1]);
  for (; i + 8 <= N - 1; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s + i), _mm256_xor_si256(load(s + i + M - N), twist8(load(s + i), load(s + i + 1))));
  for (; i < N - 1; ++i) s[i] = s[i + M - N] ^ twist(s[i], s[i + 1]);
  s[N - 1] = s[M - 1] ^ twist(s[N - 1], s[0]);
}

// The engine's tempering, then uniform_real_distribution<float>: the low 24 bits times 2^-24 (exact in float).
inline float uniform1(uint32_t y) {
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680;
  y ^= (y << 15) & 0xefc60000;
  y ^= (y >> 18);
  return static_cast<float>(y & 0xFFFFFF) * (1.0f / 16777216.0f);
}

inline void temper(const uint32_t* s, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i y = load(s + i);
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 11));
    y = _mm256_xor_si256(y, _mm256_and_si256(_mm256_slli_epi32(y, 7), _mm256_set1_epi32(static_cast<int>(0x9d2c5680))));
    y = _mm256_xor_si256(y, _mm256_and_si256(_mm256_slli_epi32(y, 15), _mm256_set1_epi32(static_cast<int>(0xefc60000))));
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 18));
    const __m256 u = _mm256_cvtepi32_ps(_mm256_and_si256(y, _mm256_set1_epi32(0xFFFFFF)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(u, _mm256_set1_ps(1.0f / 16777216.0f)));
  }
  for (; i < n; ++i) out[i] = uniform1(s[i]);
}

// The next `count` outputs of the engine as uniform_ turns them into floats; the engine ends where count calls of
// mt19937_engine::operator() leave it (left_ counts down to a twist; a block's first output follows its twist).
inline void uniforms(at::mt19937_data_pod& d, int64_t count, float* out) {
  uint32_t* s = d.state_.data();
  const int64_t ready = d.left_ - 1;  // outputs before the next twist
  const int64_t first = std::min(ready, count);
  temper(s + d.next_, first, out);
  if (count <= ready) {
    d.next_ += static_cast<uint32_t>(count);
    d.left_ -= static_cast<int>(count);
    return;
  }
  int64_t at = first, take = 0;
  while (at < count) {
    next_state(s);
    take = std::min<int64_t>(N, count - at);
    temper(s, take, out + at);
    at += take;
  }
  d.next_ = static_cast<uint32_t>(take);
  d.left_ = static_cast<int>(N + 1 - take);
}
}  // namespace mt

// Draw `count` uniforms from the generator (the default CPU generator when none), as Tensor.uniform_ does.
inline void draw(const std::optional<at::Generator>& gen, int64_t count, float* out) {
  auto* g = at::get_generator_or_default<at::CPUGeneratorImpl>(gen, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(g->mutex_);
  at::mt19937 engine = g->engine();
  at::mt19937_data_pod data = engine.data();
  mt::uniforms(data, count, out);
  engine.set_data(data);
  g->set_engine(engine);
}

}  // namespace tokentui_select
