// select_chain.cpp's stages: the scores still in play (`Chain`) and each stage of the sampler chain on them, with
// the semantics core/steps/stages.py gives it (transformers' warper, or core/steps/penalties.py's transcription of
// llama.cpp's function: each names its own), and the float64 sums they read.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "select_math.h"

namespace tokentui_select {

// a - b * c rounded as float32 operations are, one at a time: -mfma would otherwise fuse them into one rounding,
// and the torch chain rounds twice.
inline float sub_mul(float a, float b, float c) {
  volatile float product = b * c;
  return a - product;
}

// The scores still in play: the whole vocabulary (ids empty, cut entries -inf) until the first cut, then only the
// finite entries, ids ascending.
// For each 8-bit mask, the lanes set in it, first to last (then zeros): a left-packing permutation.
struct Pack {
  alignas(32) int32_t at[256][8];
  Pack() {
    for (int mask = 0; mask < 256; ++mask) {
      int k = 0;
      for (int lane = 0; lane < 8; ++lane) if (mask >> lane & 1) at[mask][k++] = lane;
      while (k < 8) at[mask][k++] = 0;
    }
  }
};
inline const Pack kPack;

struct Chain {  // kept from call to call (thread_local): a vocabulary-sized buffer is not mapped afresh each step
  std::vector<float> s, s_spare;
  std::vector<int32_t> ids, ids_spare;
  bool whole = true;
  int64_t size() const { return static_cast<int64_t>(s.size()); }
  int32_t id(int64_t j) const { return whole ? static_cast<int32_t>(j) : ids[j]; }

  void compact() { keep_from(-INFINITY, true); }  // keep the finite entries only

  // Keep the entries >= floor (> floor when `strict`), ids ascending: per 8 scores one compare, and the kept
  // lanes packed to the front by a permutation (`kPack`) and stored at once.
  void keep_from(float floor, bool strict) {
    const int64_t n = size();
    if (static_cast<int64_t>(s_spare.size()) < n + 8) { s_spare.resize(n + 8); ids_spare.resize(n + 8); }
    float* s2 = s_spare.data();
    int32_t* i2 = ids_spare.data();
    const __m256 f = _mm256_set1_ps(floor);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t count = 0, j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 a = _mm256_loadu_ps(&s[j]);
      const int mask = _mm256_movemask_ps(strict ? _mm256_cmp_ps(a, f, _CMP_GT_OQ) : _mm256_cmp_ps(a, f, _CMP_GE_OQ));
      if (!mask) continue;
      const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPack.at[mask]));
      const __m256i at = whole ? _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j)), lane)
                               : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&ids[j]));
      _mm256_storeu_ps(s2 + count, _mm256_permutevar8x32_ps(a, perm));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(i2 + count), _mm256_permutevar8x32_epi32(at, perm));
      count += __builtin_popcount(mask);
    }
    for (; j < n; ++j)
      if (strict ? s[j] > floor : s[j] >= floor) { s2[count] = s[j]; i2[count] = id(j); ++count; }
    s.assign(s2, s2 + count);
    ids.assign(i2, i2 + count);
    whole = false;
  }
  float* at(int32_t token) {  // the entry of `token`, nullptr when it is cut
    if (whole) return &s[token];
    auto it = std::lower_bound(ids.begin(), ids.end(), token);
    return it != ids.end() && *it == token ? &s[it - ids.begin()] : nullptr;
  }
  // Every entry is finite: the scores are checked first, the stages before a cut keep them finite, and a cut
  // compacts.
  int64_t finite() const { return size(); }
};

// max, sum exp(s - max), sum exp(s - max) (max - s) (float64 sums of exp8 values; every entry is finite); with
// `scaled`, the same of s / t in the same pass (the entropy after temperature, beside the raw one).
struct Moments { float max = -INFINITY; double z = 0, spread = 0; };

inline Moments moments(const float* s, int64_t n, float t = 1.f, Moments* scaled = nullptr) {
  Moments out;
  __m256 hi = _mm256_set1_ps(-INFINITY);
  int64_t i0 = 0;
  for (; i0 + 8 <= n; i0 += 8) hi = _mm256_max_ps(hi, _mm256_loadu_ps(s + i0));
  alignas(32) float h[8];
  _mm256_store_ps(h, hi);
  for (float v : h) out.max = std::max(out.max, v);
  for (; i0 < n; ++i0) out.max = std::max(out.max, s[i0]);
  const float ms = out.max / t;
  const __m256 m = _mm256_set1_ps(out.max), mt = _mm256_set1_ps(ms), tv = _mm256_set1_ps(t);
  __m256d z0 = _mm256_setzero_pd(), z1 = z0, g0 = z0, g1 = z0, y0 = z0, y1 = z0, q0 = z0, q1 = z0;
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t k = std::min<int64_t>(8, n - i);
    const __m256 ok = lanes(k);  // the ragged tail's padding: masked out
    const __m256 a = k == 8 ? _mm256_loadu_ps(s + i) : load_part(s + i, k, out.max);
    const __m256 d = _mm256_sub_ps(a, m);  // <= 0
    const __m256 e = _mm256_and_ps(exp8(d), ok);
    add_d(z0, z1, e);
    add_d(g0, g1, _mm256_mul_ps(e, d));
    if (scaled) {
      const __m256 ds = _mm256_sub_ps(_mm256_div_ps(a, tv), mt);  // s / t as the warper divides, then shifted
      const __m256 es = _mm256_and_ps(exp8(ds), ok);
      add_d(y0, y1, es);
      add_d(q0, q1, _mm256_mul_ps(es, ds));
    }
  }
  out.z = hsum(_mm256_add_pd(z0, z1));
  out.spread = -hsum(_mm256_add_pd(g0, g1));
  if (scaled) {
    scaled->max = ms;
    scaled->z = hsum(_mm256_add_pd(y0, y1));
    scaled->spread = -hsum(_mm256_add_pd(q0, q1));
  }
  return out;
}

inline double entropy(const Moments& m) { return std::log(m.z) + m.spread / m.z; }  // nats

// softmax of the entries (float32 probabilities, float64 normaliser), as the warpers' torch.softmax.
inline std::vector<float> softmax(const std::vector<float>& s) {
  const float mx = *std::max_element(s.begin(), s.end());
  std::vector<float> p(s.size());
  exp_shifted(s.data(), static_cast<int64_t>(s.size()), mx, p.data());
  double z = 0;
  for (float e : p) z += e;
  for (auto& e : p) e = static_cast<float>(e / z);
  return p;
}

inline void cut_where(Chain& c, const std::vector<char>& cut) {
  for (int64_t j = 0; j < c.size(); ++j) if (cut[j]) c.s[j] = -INFINITY;
  c.compact();
}

// ---- the stages --------------------------------------------------------------------------------------------
inline void divide(Chain& c, float t) {  // TemperatureLogitsWarper: scores / T (-inf stays -inf)
  float* s = c.s.data();
  const int64_t n = c.size();
  const __m256 tv = _mm256_set1_ps(t);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_div_ps(_mm256_loadu_ps(s + i), tv));
  for (; i < n; ++i) s[i] = s[i] / t;
}

// penalties.py dynamic_temperature (llama_sampler_temp_ext_apply).
// `known`: the moments of c's scores when the caller has them (the raw scores' with the sparse edits accounted).
inline void dynamic_temperature(Chain& c, double t, double range, double exponent, const Moments* known) {
  const int64_t n = c.finite();
  if (n <= 1) return;
  const Moments m = known ? *known : moments(c.s.data(), c.size());
  const double low = std::max(0.0, t - range), high = t + range;
  const double dyn = low + (high - low) * std::pow(entropy(m) / std::log(static_cast<double>(n)), exponent);
  if (dyn <= 0) {  // only the first highest score stays
    const int64_t top = std::max_element(c.s.begin(), c.s.end()) - c.s.begin();
    std::vector<char> cut(c.size(), 1);
    cut[top] = 0;
    cut_where(c, cut);
    return;
  }
  divide(c, static_cast<float>(dyn));
}

// penalties.py top_n_sigma (llama_sampler_top_n_sigma_apply): cut scores below max - n * sigma.
inline bool top_n_sigma(Chain& c, double n_sigma) {
  const int64_t n = c.finite();
  if (n <= 1) return false;
  const float* s = c.s.data();
  __m256d a0 = _mm256_setzero_pd(), a1 = a0;
  __m256 hi = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) { const __m256 a = _mm256_loadu_ps(s + i); add_d(a0, a1, a); hi = _mm256_max_ps(hi, a); }
  double sum = hsum(_mm256_add_pd(a0, a1));
  alignas(32) float h[8];
  _mm256_store_ps(h, hi);
  float top = *std::max_element(h, h + 8);
  for (int64_t j = i; j < n; ++j) { sum += s[j]; top = std::max(top, s[j]); }
  const double mean = sum / static_cast<double>(n);
  const __m256d mv = _mm256_set1_pd(mean);
  __m256d q0 = _mm256_setzero_pd(), q1 = q0;
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(s + i);
    const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)), mv);
    const __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)), mv);
    q0 = _mm256_fmadd_pd(d0, d0, q0);
    q1 = _mm256_fmadd_pd(d1, d1, q1);
  }
  double sq = hsum(_mm256_add_pd(q0, q1));
  for (int64_t j = i; j < n; ++j) sq += (s[j] - mean) * (s[j] - mean);
  const float sd = std::sqrt(static_cast<float>(sq / static_cast<double>(n)));
  c.keep_from(sub_mul(top, static_cast<float>(n_sigma), sd), false);
  return true;
}

// The k-th largest of s (n >= k >= 1): a threshold from every 16th score, then nth_element on those above it.
inline float kth_largest(const std::vector<float>& s, int64_t k) {
  const int64_t n = static_cast<int64_t>(s.size());
  if (n > 64 * 16 && 8 * k < n) {
    std::vector<float> sample;
    for (int64_t i = 0; i < n; i += 16) sample.push_back(s[i]);
    const int64_t r = std::min<int64_t>(static_cast<int64_t>(sample.size()), static_cast<int64_t>(1.3 * k / 16) + 16);
    std::nth_element(sample.begin(), sample.begin() + (r - 1), sample.end(), std::greater<float>());
    const __m256 t = _mm256_set1_ps(sample[r - 1]);
    std::vector<float> above;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(&s[i]), t, _CMP_GE_OQ));
      while (mask) { above.push_back(s[i + __builtin_ctz(mask)]); mask &= mask - 1; }
    }
    for (; i < n; ++i) if (s[i] >= sample[r - 1]) above.push_back(s[i]);
    if (static_cast<int64_t>(above.size()) >= k) {
      std::nth_element(above.begin(), above.begin() + (k - 1), above.end(), std::greater<float>());
      return above[k - 1];
    }
  }
  std::vector<float> copy(s);
  std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end(), std::greater<float>());
  return copy[k - 1];
}

// TopKLogitsWarper: keep every score >= the k-th largest (ties included).
inline void top_k(Chain& c, int64_t k) {
  k = std::min<int64_t>(std::max<int64_t>(k, 1), c.size());
  c.keep_from(kth_largest(c.s, k), false);
}

// Positions 0..m-1 ordered by key (ascending, or descending), ties by position (torch.sort leaves them undefined).
inline std::vector<int64_t> order(const std::vector<float>& key, bool descending) {
  std::vector<int64_t> o(key.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return descending ? key[a] > key[b] : key[a] < key[b]; });
  return o;
}

// TypicalLogitsWarper: keep the tokens whose surprise is closest to the entropy, up to `mass` (the first always).
inline void typical(Chain& c, double mass) {
  const int64_t m = c.size();
  const float mx = *std::max_element(c.s.begin(), c.s.end());
  double z = 0;
  for (float v : c.s) z += std::exp(static_cast<double>(v - mx));
  const float logz = static_cast<float>(std::log(z));
  std::vector<float> norm(m), p(m), shifted(m);
  double ent = 0;
  for (int64_t j = 0; j < m; ++j) { norm[j] = (c.s[j] - mx) - logz; p[j] = std::exp(norm[j]); ent -= static_cast<double>(norm[j]) * p[j]; }
  for (int64_t j = 0; j < m; ++j) shifted[j] = std::fabs(-norm[j] - static_cast<float>(ent));
  const std::vector<int64_t> o = order(shifted, false);
  double cum = 0;
  int64_t last = 0;
  const float limit = static_cast<float>(mass);
  for (int64_t r = 0; r < m; ++r) { cum += p[o[r]]; last += static_cast<float>(cum) < limit; }
  last = std::min(last, m - 1);
  const float floor = shifted[o[last]];
  std::vector<char> cut(m);
  for (int64_t r = 1; r < m; ++r) cut[o[r]] = shifted[o[r]] > floor;
  cut_where(c, cut);
}

// TopPLogitsWarper: ascending, cut while the cumulative mass <= 1 - top_p (the highest always stays).
inline void top_p(Chain& c, double top_p_value) {
  const int64_t m = c.size();
  const std::vector<float> p = softmax(c.s);
  const std::vector<int64_t> o = order(c.s, false);
  const float limit = static_cast<float>(1.0 - top_p_value);
  std::vector<char> cut(m);
  double cum = 0;
  for (int64_t r = 0; r + 1 < m; ++r) { cum += p[o[r]]; cut[o[r]] = static_cast<float>(cum) <= limit; }
  cut_where(c, cut);
}

// MinPLogitsWarper: cut probabilities below min_p times the top one's (the top one always stays).
inline void min_p(Chain& c, double min_p_value) {
  const std::vector<float> p = softmax(c.s);
  const int64_t top = std::max_element(p.begin(), p.end()) - p.begin();
  const float floor = static_cast<float>(min_p_value) * p[top];
  std::vector<char> cut(c.size());
  for (int64_t j = 0; j < c.size(); ++j) cut[j] = j != top && p[j] < floor;
  cut_where(c, cut);
}

// penalties.py xtc (llama_sample_xtc_apply): when the roll fires and two or more reach the threshold, cut all of
// those but the least likely.
inline void xtc(Chain& c, double probability, double threshold, double roll) {
  if (roll > probability || c.finite() < 2) return;
  const std::vector<float> p = softmax(c.s);
  const float t = static_cast<float>(threshold);
  int64_t above = 0;
  float floor = INFINITY;
  for (float v : p) if (v >= t) { ++above; floor = std::min(floor, v); }
  if (above < 2) return;
  std::vector<char> cut(c.size());
  for (int64_t j = 0; j < c.size(); ++j) cut[j] = p[j] >= t && p[j] > floor;
  cut_where(c, cut);
}

// penalties.py mirostat_v2 (llama_sampler_mirostat_v2_apply's truncation): keep surprise -log2 p <= mu.
inline void mirostat(Chain& c, double mu) {
  const std::vector<float> p = softmax(c.s);
  const float limit = static_cast<float>(mu);
  const float sure = std::exp2(-limit) * 0.5f;  // below this, -log2 p is certainly > mu: no log needed
  std::vector<char> cut(c.size());
  bool any = false;
  for (int64_t j = 0; j < c.size(); ++j) {
    cut[j] = p[j] < sure || -std::log2(p[j]) > limit;
    any |= !cut[j] && c.s[j] > -INFINITY;
  }
  if (!any) {
    std::fill(cut.begin(), cut.end(), 1);
    cut[std::max_element(c.s.begin(), c.s.end()) - c.s.begin()] = 0;
  }
  cut_where(c, cut);
}

}  // namespace tokentui_select
