// Step 4 with the whole sampler chain, on the CPU in one call (op tokentui_q4::select_chain, used by
// core/steps/select_chain.py for a step whose stages the one-call selection of select.cpp lacks).
//
// The specification is core/steps/stages.py `run_chain` (each stage as transformers' warper or core/steps/
// penalties.py's transcription of llama.cpp's function) followed by select_chain.py's report: the same packed vector
// (selection.py's layout), the same token from the same per-id noise (select_draw.h draws the uniforms exactly as
// `uniform_` would, and the race reads the noise of the ids still in play). The stages come as a small program,
// built by select_chain.py in the step's order: each entry is a code and its numbers; the sparse stages (logit bias,
// penalties, DRY) carry the ids they touch and their values, worked out in Python from the history (a few dozen
// entries), so only their edit runs here.
//
// Why hand-written: the torch chain is ~150 small operations, a dozen of them over the whole vocabulary (a variance,
// two softmaxes, a topk, the draw); at V = 151,936 that was 5.2 ms a step (BENCHMARKS.md, issue 38). Here the stages
// that read the whole vocabulary (temperature and its dynamic range, top-nσ, top-k) are one or two vectorised passes
// each, and once a stage has cut, the chain carries on with the entries left, ids ascending (a cut entry is -inf in
// the torch chain; dropping it changes no count, sum or order the later stages read). The decisions are the warpers'
// float32 comparisons; the sums behind them are taken in float64, so a probability can differ from torch's in the
// last bits (tests/unit/test_select_chain_native.py holds the two to the same ids and kept sets).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "select_draw.h"
#include "select_math.h"

namespace {
using namespace tokentui_select;

enum Slot { FINITE, ENOUGH, TOKEN, RANK, KEPT, RAW, PROB, MASS, H, HS, PREFIX_MASS, LAST_PROB, TEMP_H, K_KEPT, P_KEPT, HEADER };
// Program codes (select_chain.py `_CODES`); each entry is WIDTH numbers: the code, then its arguments.
enum Code { BIAS = 1, PENALTIES, DRY, TEMP, DYNTEMP, NSIGMA, TOPK, TYPICAL, TOPP, MINP, XTC, MIROSTAT };
constexpr int WIDTH = 6;

// a - b * c rounded as float32 operations are, one at a time: -mfma would otherwise fuse them into one rounding,
// and the torch chain rounds twice.
float sub_mul(float a, float b, float c) {
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
const Pack kPack;

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

Moments moments(const float* s, int64_t n, float t = 1.f, Moments* scaled = nullptr) {
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

double entropy(const Moments& m) { return std::log(m.z) + m.spread / m.z; }  // nats

// softmax of the entries (float32 probabilities, float64 normaliser), as the warpers' torch.softmax.
std::vector<float> softmax(const std::vector<float>& s) {
  const float mx = *std::max_element(s.begin(), s.end());
  std::vector<float> p(s.size());
  exp_shifted(s.data(), static_cast<int64_t>(s.size()), mx, p.data());
  double z = 0;
  for (float e : p) z += e;
  for (auto& e : p) e = static_cast<float>(e / z);
  return p;
}

void cut_where(Chain& c, const std::vector<char>& cut) {
  for (int64_t j = 0; j < c.size(); ++j) if (cut[j]) c.s[j] = -INFINITY;
  c.compact();
}

// ---- the stages --------------------------------------------------------------------------------------------
void divide(Chain& c, float t) {  // TemperatureLogitsWarper: scores / T (-inf stays -inf)
  float* s = c.s.data();
  const int64_t n = c.size();
  const __m256 tv = _mm256_set1_ps(t);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_div_ps(_mm256_loadu_ps(s + i), tv));
  for (; i < n; ++i) s[i] = s[i] / t;
}

// penalties.py dynamic_temperature (llama_sampler_temp_ext_apply).
// `known`: the moments of c's scores when the caller has them (the raw scores' with the sparse edits accounted).
void dynamic_temperature(Chain& c, double t, double range, double exponent, const Moments* known) {
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
bool top_n_sigma(Chain& c, double n_sigma) {
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
float kth_largest(const std::vector<float>& s, int64_t k) {
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
void top_k(Chain& c, int64_t k) {
  k = std::min<int64_t>(std::max<int64_t>(k, 1), c.size());
  c.keep_from(kth_largest(c.s, k), false);
}

// Positions 0..m-1 ordered by key (ascending, or descending), ties by position (torch.sort leaves them undefined).
std::vector<int64_t> order(const std::vector<float>& key, bool descending) {
  std::vector<int64_t> o(key.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return descending ? key[a] > key[b] : key[a] < key[b]; });
  return o;
}

// TypicalLogitsWarper: keep the tokens whose surprise is closest to the entropy, up to `mass` (the first always).
void typical(Chain& c, double mass) {
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
void top_p(Chain& c, double top_p_value) {
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
void min_p(Chain& c, double min_p_value) {
  const std::vector<float> p = softmax(c.s);
  const int64_t top = std::max_element(p.begin(), p.end()) - p.begin();
  const float floor = static_cast<float>(min_p_value) * p[top];
  std::vector<char> cut(c.size());
  for (int64_t j = 0; j < c.size(); ++j) cut[j] = j != top && p[j] < floor;
  cut_where(c, cut);
}

// penalties.py xtc (llama_sample_xtc_apply): when the roll fires and two or more reach the threshold, cut all of
// those but the least likely.
void xtc(Chain& c, double probability, double threshold, double roll) {
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
void mirostat(Chain& c, double mu) {
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

// ---- the report's whole-vocabulary parts ---------------------------------------------------------------------
// The n highest raw scores, descending (ties: lower id first), as top_scores gives them.
std::vector<int32_t> top_n(const float* x, int64_t v, int64_t n) {
  std::vector<std::pair<float, int32_t>> best;  // descending
  if (n == 0) return {};
  float floor = -INFINITY;
  auto offer = [&](float value, int32_t id) {
    if (static_cast<int64_t>(best.size()) == n && !(value > floor)) return;
    auto it = std::upper_bound(best.begin(), best.end(), std::make_pair(value, id),
                               [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    best.insert(it, {value, id});
    if (static_cast<int64_t>(best.size()) > n) best.pop_back();
    if (static_cast<int64_t>(best.size()) == n) floor = best.back().first;
  };
  int64_t i = 0;
  for (; i + 8 <= v; i += 8) {
    int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(floor), _CMP_GE_OQ));
    while (mask) { const int k = __builtin_ctz(mask); mask &= mask - 1; offer(x[i + k], static_cast<int32_t>(i + k)); }
  }
  for (; i < v; ++i) offer(x[i], static_cast<int32_t>(i));
  std::vector<int32_t> ids;
  for (auto& b : best) ids.push_back(b.second);
  return ids;
}

int64_t count_above(const float* x, int64_t v, float value) {
  const __m256 c = _mm256_set1_ps(value);
  int64_t count = 0, i = 0;
  for (; i + 8 <= v; i += 8) count += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), c, _CMP_GT_OQ)));
  for (; i < v; ++i) count += x[i] > value;
  return count;
}

bool all_finite(const float* x, int64_t v) {
  __m256 bad = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  int64_t i = 0;
  for (; i + 8 <= v; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), a), inf, _CMP_NLT_UQ));  // |a| >= inf or NaN
  }
  bool out = _mm256_movemask_ps(bad) == 0;
  for (; i < v; ++i) out &= std::isfinite(x[i]);
  return out;
}

at::Tensor select_chain_cpu(const at::Tensor& scores, at::ArrayRef<double> program, at::ArrayRef<int64_t> ids,
                            at::ArrayRef<double> values, int64_t top_n_count, bool greedy, double temperature,
                            double xtc_roll, std::optional<at::Generator> generator) {
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == at::kFloat && scores.dim() == 1 && scores.is_contiguous(),
              "select_chain: scores must be a contiguous [V] float32 CPU tensor");
  TORCH_CHECK(program.size() % WIDTH == 0 && ids.size() == values.size(), "select_chain: malformed program");
  const int64_t v = scores.numel(), n = top_n_count;
  TORCH_CHECK(v > 0 && n >= 0 && n <= v, "select_chain: sizes out of range");
  const float* x = scores.data_ptr<float>();
  at::Tensor packed = at::zeros({HEADER + 3 * n}, scores.options());
  float* out = packed.data_ptr<float>();

  thread_local std::vector<float> u;
  if (!greedy) {  // the step's one draw, before anything can fail (as select_chain.py draws)
    u.resize(v);
    draw(generator, v, u.data());
  }
  if (!all_finite(x, v)) return packed;  // FINITE = 0: the caller raises

  Moments temp;  // of x / T: the entropy after temperature, before any cut
  const Moments raw = moments(x, v, greedy ? 1.f : static_cast<float>(temperature), greedy ? nullptr : &temp);
  thread_local Chain kept_chain;
  Chain& c = kept_chain;  // (one thread-local lookup, not one per use)
  c.s.assign(x, x + v);
  c.ids.clear();
  c.whole = true;
  int64_t k_kept = -1, p_kept = -1;
  bool pristine = true;  // c is still x with sparse edits only, at `touched`
  std::vector<int32_t> touched;
  for (size_t e = 0; e < program.size(); e += WIDTH) {
    const int code = static_cast<int>(program[e]);
    const bool untouched = pristine;  // every stage before this one was a sparse edit
    pristine = pristine && (code == BIAS || code == PENALTIES || code == DRY);
    const double a = program[e + 1], b = program[e + 2], d = program[e + 3], f = program[e + 4];
    if (code == BIAS || code == PENALTIES || code == DRY) {  // sparse: the ids' entries, where still in play
      const int64_t start = static_cast<int64_t>(a), count = static_cast<int64_t>(b);
      for (int64_t j = start; j < start + count; ++j) {
        float* y = c.at(static_cast<int32_t>(ids[j]));
        if (!y || !(*y > -INFINITY)) continue;
        if (pristine) touched.push_back(static_cast<int32_t>(ids[j]));
        const float val = static_cast<float>(values[j]);
        if (code == BIAS) *y = *y + val;
        else if (code == DRY) *y = *y + (-val);
        else {  // penalties: values are counts; d = repeat, f = frequency, program[e + 5] = presence
          const float r = static_cast<float>(d);
          const float scaled = *y <= 0 ? *y * r : *y / r;
          volatile float by_count = val * static_cast<float>(f);
          const float take = by_count + static_cast<float>(program[e + 5]);
          *y = scaled - take;
        }
      }
    } else if (code == TEMP) {
      divide(c, static_cast<float>(a));
    } else if (code == DYNTEMP) {
      // Before anything but sparse edits, the moments of the scores are the raw scores' (one pass less over
      // the vocabulary) with the few edited entries swapped: exact sums, the reference point being the raw max.
      Moments edited = raw;
      if (untouched) {
        std::sort(touched.begin(), touched.end());
        touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
        for (int32_t id : touched) {
          const double before = static_cast<double>(x[id]) - raw.max, after = static_cast<double>(c.s[id]) - raw.max;
          edited.z += std::exp(after) - std::exp(before);
          edited.spread += std::exp(before) * before - std::exp(after) * after;
        }
      }
      dynamic_temperature(c, a, b, d, untouched ? &edited : nullptr);
    } else if (code == NSIGMA) {
      top_n_sigma(c, a);
    } else if (code == TOPK) {
      top_k(c, static_cast<int64_t>(a));
      k_kept = c.finite();
    } else if (code == TYPICAL) {
      if (c.whole) c.compact();
      typical(c, a);
    } else if (code == TOPP) {
      if (c.whole) c.compact();
      top_p(c, a);
      p_kept = c.finite();
    } else if (code == MINP) {
      if (c.whole) c.compact();
      min_p(c, a);
    } else if (code == XTC) {
      if (c.whole) c.compact();
      xtc(c, a, b, xtc_roll);
    } else if (code == MIROSTAT) {
      if (c.whole) c.compact();
      mirostat(c, a);
    } else {
      TORCH_CHECK(false, "select_chain: unknown stage code ", code);
    }
  }
  if (c.whole && greedy) {  // argmax without compacting: the first highest
    const int64_t top = std::max_element(c.s.begin(), c.s.end()) - c.s.begin();
    c.s = {c.s[top]};
    c.ids = {static_cast<int32_t>(top)};
    c.whole = false;
  }
  if (c.whole) c.compact();

  // The post-sampler distribution over the entries left, and the draw.
  const int64_t m = c.size();
  thread_local std::vector<float> kept_buffers[6];  // [m] each
  auto& [probs, cu, noise, in_play, raw_e, surprise] = kept_buffers;
  int64_t win = 0;
  if (greedy) {
    win = std::max_element(c.s.begin(), c.s.end()) - c.s.begin();  // the first highest: lowest id
    probs.assign(m, 0.f);
    probs[win] = 1.f;
  } else {
    probs = softmax(c.s);
    cu.resize(m);
    noise.resize(m);
    for (int64_t j = 0; j < m; ++j) cu[j] = u[c.ids[j]];
    exp_noise(cu.data(), m, noise.data());
    float best = -1.f;
    for (int64_t j = 0; j < m; ++j) {
      const float r = probs[j] / noise[j];
      if (r > best) { best = r; win = j; }
    }
  }
  const int32_t token = c.ids[win];
  auto raw_p = [&](int32_t id) { float e; exp_shifted(&x[id], 1, raw.max, &e); return static_cast<float>(e / raw.z); };
  in_play.resize(m);  // raw scores of the entries left, then exp(x - max)
  raw_e.resize(m);
  for (int64_t j = 0; j < m; ++j) in_play[j] = x[c.ids[j]];
  exp_shifted(in_play.data(), m, raw.max, raw_e.data());
  surprise.resize(m);  // -log p (exp_noise's arithmetic; 0 where p is 0)
  exp_noise(probs.data(), m, surprise.data());
  int64_t kept = 0;
  double mass = 0, hs = 0;
  for (int64_t j = 0; j < m; ++j)
    if (probs[j] > 0) { ++kept; mass += static_cast<float>(raw_e[j] / raw.z); hs += static_cast<double>(probs[j]) * surprise[j]; }
  const int64_t rank = count_above(x, v, x[token]);
  out[FINITE] = out[ENOUGH] = 1.f;
  out[TOKEN] = static_cast<float>(token);
  out[RANK] = static_cast<float>(rank);
  out[KEPT] = static_cast<float>(kept);
  out[RAW] = raw_p(token);
  out[PROB] = probs[win];
  out[MASS] = static_cast<float>(mass);
  out[H] = static_cast<float>(entropy(raw));
  out[HS] = static_cast<float>(hs);
  out[PREFIX_MASS] = 1.f;
  out[TEMP_H] = greedy ? 0.f : static_cast<float>(entropy(temp));
  out[K_KEPT] = static_cast<float>(k_kept);
  out[P_KEPT] = static_cast<float>(p_kept);
  const std::vector<int32_t> top = top_n(x, v, n);
  for (int64_t j = 0; j < n; ++j) {
    out[HEADER + j] = static_cast<float>(top[j]);
    out[HEADER + n + j] = raw_p(top[j]);
    auto it = std::lower_bound(c.ids.begin(), c.ids.end(), top[j]);
    out[HEADER + 2 * n + j] = it != c.ids.end() && *it == top[j] ? probs[it - c.ids.begin()] : 0.f;
  }
  return packed;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tokentui_q4, m) {
  m.def("select_chain(Tensor scores, float[] program, int[] ids, float[] values, int top_n, bool greedy, "
        "float temperature, float xtc_roll, Generator? generator) -> Tensor");
  m.impl("select_chain", c10::DispatchKey::CPU, &select_chain_cpu);
}
