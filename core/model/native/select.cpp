// Step 4 of generation, selection, on the CPU in one call (op tokentui_q4::select, used by core/steps/select.py).
//
// The same distribution and the same report as select.py's torch path (its docstring is the specification): the
// post-sampler distribution softmax(TopP(TopK(scores / T))) of transformers' warpers, and the exponential race
// argmax(p / noise) with one Exp(1) noise value per token id drawn from the caller's torch.Generator exactly as
// `uniform_` would draw it (so a seeded run picks the same tokens through either path, and the generator ends
// in the same state). It returns select.py's packed vector, so the Python side only unpacks.
//
// Why hand-written: the torch path is ~60 small operations over the vocabulary (two softmaxes, two topks, a
// nonzero, a whole-vocabulary uniform_ that runs one element at a time); at V = 49,152 that was 7.5 % of the
// 4-bit model's step (docs/design-record.md). Here it is one pass over the scores (the maximum), one more that does
// everything else (exponentials, sums, a histogram), the random stream's own recurrence vectorised, and work on
// the few candidates the sampler can keep. No library computes top-k / top-p with this report.
//
// How it finds the candidates without sorting the vocabulary: every score goes into one of NB buckets by its
// distance below the maximum (a monotone function of the score), each bucket counting its tokens and their
// probability after temperature. Walking the buckets from the top until they hold enough tokens (top-k, the
// reported candidates) or enough mass (top-p, plus a margin for rounding) gives a set that provably holds every
// token the sampler can keep: a token outside has a lower score than every token inside. Those are then ordered
// bucket by bucket (score descending, id ascending on ties).
//
// The random stream is select_draw.h's; the exponentials and logarithms are hand-written 8-wide polynomials
// (select_math.h: exp8 and log8 say why).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "select_draw.h"
#include "select_math.h"

namespace {
using namespace tokentui_select;

// ---- the packed report: select.py's layout ----------------------------------------------------------------
enum Slot { FINITE, ENOUGH, TOKEN, RANK, KEPT, RAW, PROB, MASS, H, HS, PREFIX_MASS, LAST_PROB, TEMP_H, K_KEPT, P_KEPT, HEADER };

constexpr int NB = 4096;           // histogram buckets below the maximum score
constexpr float MAX_SPAN = 1000.f;  // scores further below the maximum share the last bucket (weight exp(-1000 / T))
constexpr double MASS_MARGIN = 1e-5;  // top-p: the buckets' mass must pass top_p by this (rounding of float sums)

struct Scan {  // what the whole-vocabulary pass found
  double z = 0, spread = 0;    // sum exp(x - m), sum exp(x - m) (m - x)
  double zs = 0, spread_s = 0;  // the same after temperature: s = x / T, sum exp(s - ms), sum exp(s - ms) (ms - s)
  int64_t positive = 0;         // tokens whose exp(s - ms) is > 0 (the whole-vocabulary sample's kept set)
  double positive_raw = 0;      // their sum exp(x - m)
  int64_t winner = 0;           // argmax exp(s - ms) / noise (first on ties): the whole-vocabulary draw
};

class Selector {
 public:
  Selector(const float* x, int64_t v, float temperature, bool greedy) : x_(x), v_(v), t_(temperature), greedy_(greedy) {}

  // Pass 1: the maximum, the minimum and whether every score is finite (also after division by T).
  bool finite() {
    __m256 hi = _mm256_set1_ps(-INFINITY), lo = _mm256_set1_ps(INFINITY), bad = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= v_; i += 8) {
      const __m256 a = _mm256_loadu_ps(x_ + i);
      hi = _mm256_max_ps(hi, a);
      lo = _mm256_min_ps(lo, a);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    alignas(32) float h[8], l[8], b[8];
    _mm256_store_ps(h, hi);
    _mm256_store_ps(l, lo);
    _mm256_store_ps(b, bad);
    float mx = -INFINITY, mn = INFINITY;
    bool nan = false;
    for (int k = 0; k < 8; ++k) { mx = std::max(mx, h[k]); mn = std::min(mn, l[k]); nan |= b[k] != 0.f; }
    for (; i < v_; ++i) { mx = std::max(mx, x_[i]); mn = std::min(mn, x_[i]); nan |= std::isnan(x_[i]); }
    m_ = mx;
    ms_ = greedy_ ? mx : mx / t_;
    const float span = std::min(mx - mn, MAX_SPAN);
    inv_width_ = span > 0.f ? static_cast<float>(NB) / span : 0.f;
    return !nan && std::isfinite(mx) && std::isfinite(mn) && std::isfinite(ms_) && std::isfinite(greedy_ ? mn : mn / t_);
  }

  // Pass 2: the sums both entropies need, the histogram, and (given noise) the whole-vocabulary race.
  Scan scan(bool scaled, bool with_mass, const float* noise) {
    counts_.assign(NB, 0);
    if (with_mass) masses_.assign(NB, 0.0);
    Scan out;
    const __m256 m = _mm256_set1_ps(m_), ms = _mm256_set1_ps(ms_), t = _mm256_set1_ps(t_);
    const __m256 inv = _mm256_set1_ps(inv_width_);
    const __m256 last = _mm256_set1_ps(NB - 1);  // (min before the conversion: a NaN product takes NB - 1 too)
    __m256d z0 = _mm256_setzero_pd(), z1 = z0, g0 = z0, g1 = z0, zs0 = z0, zs1 = z0, gs0 = z0, gs1 = z0;
    __m256d p0 = z0, p1 = z0;
    __m256 best = _mm256_set1_ps(-1.f);
    __m256i best_at = _mm256_setzero_si256(), positive = _mm256_setzero_si256();
    alignas(32) int32_t bucket[8];
    alignas(32) float weight[8];
    for (int64_t i = 0; i < v_; i += 8) {
      const int64_t n = std::min<int64_t>(8, v_ - i);
      const __m256 valid = lanes(n);
      const __m256 a = n == 8 ? _mm256_loadu_ps(x_ + i) : load_part(x_ + i, n, m_);  // padding: gap 0
      const __m256 gap = _mm256_sub_ps(m, a);
      const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(a, m)), valid);
      add_d(z0, z1, e);
      add_d(g0, g1, _mm256_mul_ps(e, gap));
      __m256 es = e;
      if (scaled) {
        const __m256 s = _mm256_div_ps(a, t);
        es = _mm256_and_ps(exp8(_mm256_sub_ps(s, ms)), valid);
        add_d(zs0, zs1, es);
        add_d(gs0, gs1, _mm256_mul_ps(es, _mm256_sub_ps(ms, s)));
      }
      if (noise) {
        const __m256 nz = n == 8 ? _mm256_loadu_ps(noise + i) : load_part(noise + i, n, 1.f);
        const __m256 r = _mm256_blendv_ps(_mm256_set1_ps(-1.f), _mm256_div_ps(es, nz), valid);  // padding: -1
        const __m256 up = _mm256_cmp_ps(r, best, _CMP_GT_OQ);
        best = _mm256_blendv_ps(best, r, up);
        const __m256i at = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        best_at = _mm256_blendv_epi8(best_at, at, _mm256_castps_si256(up));
        const __m256 pos = _mm256_and_ps(_mm256_cmp_ps(es, _mm256_setzero_ps(), _CMP_GT_OQ), valid);
        positive = _mm256_sub_epi32(positive, _mm256_castps_si256(pos));
        add_d(p0, p1, _mm256_and_ps(e, pos));
      }
      const __m256i b = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_mul_ps(gap, inv), last));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bucket), b);
      if (with_mass) {
        _mm256_store_ps(weight, es);
        for (int64_t k = 0; k < n; ++k) { counts_[bucket[k]] += 1; masses_[bucket[k]] += weight[k]; }
      } else {
        for (int64_t k = 0; k < n; ++k) counts_[bucket[k]] += 1;
      }
    }
    out.z = hsum(_mm256_add_pd(z0, z1));
    out.spread = hsum(_mm256_add_pd(g0, g1));
    out.zs = scaled ? hsum(_mm256_add_pd(zs0, zs1)) : out.z;
    out.spread_s = scaled ? hsum(_mm256_add_pd(gs0, gs1)) : out.spread;
    if (noise) {
      alignas(32) float bv[8];
      alignas(32) int32_t bi[8], pc[8];
      _mm256_store_ps(bv, best);
      _mm256_store_si256(reinterpret_cast<__m256i*>(bi), best_at);
      _mm256_store_si256(reinterpret_cast<__m256i*>(pc), positive);
      float top = -1.f;
      int64_t at = 0;
      for (int k = 0; k < 8; ++k) {
        out.positive += pc[k];
        if (bv[k] > top || (bv[k] == top && bi[k] < at)) { top = bv[k]; at = bi[k]; }
      }
      out.winner = at;
      out.positive_raw = hsum(_mm256_add_pd(p0, p1));
    }
    return out;
  }

  // The smallest top set of buckets with at least `count` tokens and (mass_needed > 0) that much mass.
  int last_bucket(int64_t count, double mass_needed) const {
    int64_t c = 0;
    double mass = 0;
    for (int b = 0; b < NB; ++b) {
      c += counts_[b];
      if (mass_needed > 0) mass += masses_[b];
      if (c >= count && (mass_needed <= 0 || mass >= mass_needed)) return b;
    }
    return NB - 1;
  }

  // The first bucket after `b` that holds a token (NB - 1 when none does).
  int next_bucket(int b) const {
    while (b < NB - 1 && counts_[++b] == 0) {}
    return b;
  }

  // The ids of every token in buckets 0..last, by score descending (ids ascending on ties).
  std::vector<int64_t> candidates(int last) const {
    std::vector<int64_t> start(last + 2, 0);
    for (int b = 0; b <= last; ++b) start[b + 1] = start[b] + counts_[b];
    std::vector<int64_t> ids(start[last + 1]);
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    const __m256 m = _mm256_set1_ps(m_), inv = _mm256_set1_ps(inv_width_);
    const __m256 lastv = _mm256_set1_ps(NB - 1);
    const __m256i limit = _mm256_set1_epi32(last + 1);
    alignas(32) int32_t bucket[8];
    for (int64_t i = 0; i < v_; i += 8) {
      const int64_t n = std::min<int64_t>(8, v_ - i);
      const __m256 a = n == 8 ? _mm256_loadu_ps(x_ + i) : load_part(x_ + i, n, -INFINITY);
      const __m256i b = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_mul_ps(_mm256_sub_ps(m, a), inv), lastv));
      int mask = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, b)));
      if (!mask) continue;
      _mm256_store_si256(reinterpret_cast<__m256i*>(bucket), b);
      while (mask) {
        const int k = __builtin_ctz(mask);
        mask &= mask - 1;
        if (k < n) ids[fill[bucket[k]]++] = i + k;
      }
    }
    const float* x = x_;
    for (int b = 0; b <= last; ++b)
      if (start[b + 1] - start[b] > 1)
        std::sort(ids.begin() + start[b], ids.begin() + start[b + 1],
                  [x](int64_t p, int64_t q) { return x[p] > x[q] || (x[p] == x[q] && p < q); });
    return ids;
  }

  float m() const { return m_; }
  float ms() const { return ms_; }

 private:
  const float* x_;
  int64_t v_;
  float t_;
  bool greedy_;
  float m_ = 0, ms_ = 0, inv_width_ = 0;
  std::vector<int64_t> counts_;
  std::vector<double> masses_;
};

std::vector<float> gather(const float* x, const std::vector<int64_t>& ids, int64_t n) {
  std::vector<float> out(n);
  for (int64_t j = 0; j < n; ++j) out[j] = x[ids[j]];
  return out;
}

at::Tensor select_cpu(const at::Tensor& scores, double temperature, int64_t top_k, double top_p, int64_t top_n,
                  bool greedy, std::optional<at::Generator> generator) {
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == at::kFloat && scores.dim() == 1 && scores.is_contiguous(),
              "select: scores must be a contiguous [V] float32 CPU tensor");
  const int64_t v = scores.numel();
  TORCH_CHECK(v > 0 && top_n >= 0 && top_n <= v && top_k >= 0 && top_k < v, "select: sizes out of range");
  TORCH_CHECK(greedy || temperature > 0, "select: temperature must be > 0 when sampling");
  const float* x = scores.data_ptr<float>();
  const int64_t n = top_n;
  at::Tensor packed = at::zeros({HEADER + 3 * n}, scores.options());
  float* out = packed.data_ptr<float>();
  const float t = greedy ? 1.f : static_cast<float>(temperature);
  const bool whole = !greedy && top_k == 0 && top_p >= 1.0;  // nothing is cut: the race runs over every token

  thread_local std::vector<float> u, noise;
  if (!greedy) {  // the step's one draw, before anything can fail (as the torch path draws first)
    u.resize(v);
    draw(generator, v, u.data());
  }
  Selector sel(x, v, t, greedy);
  if (!sel.finite()) return packed;  // FINITE = 0: the caller raises
  out[FINITE] = 1.f;
  out[ENOUGH] = 1.f;
  const bool scaled = !greedy && t != 1.f;
  const bool by_mass = !greedy && top_k == 0 && top_p < 1.0;
  if (whole) {
    noise.resize(v);
    exp_noise(u.data(), v, noise.data());
  }
  const Scan scan = sel.scan(scaled, by_mass, whole ? noise.data() : nullptr);
  const double h = std::log(scan.z) + scan.spread / scan.z;
  const double hs = std::log(scan.zs) + scan.spread_s / scan.zs;
  out[H] = static_cast<float>(h);

  int64_t need = std::max<int64_t>(n, 1);
  if (top_k) need = std::max(need, top_k + 1);  // one past the k-th: the tie check below then rarely takes all
  int last = sel.last_bucket(need, by_mass ? (top_p + MASS_MARGIN) * scan.zs : 0);
  std::vector<int64_t> ids = sel.candidates(last);
  while (top_k && static_cast<int64_t>(ids.size()) < v) {
    // The candidates hold every raw score >= the k-th, and every score outside is below the lowest candidate. If
    // the lowest candidate's score after temperature still equals the k-th's (tied scores, as a bfloat16 head
    // gives, or two scores the division makes equal), one outside might too: take the next bucket as well.
    const float kth = scaled ? x[ids[top_k - 1]] / t : x[ids[top_k - 1]];
    const float lowest = scaled ? x[ids.back()] / t : x[ids.back()];
    if (lowest < kth) break;
    ids = sel.candidates(last = sel.next_bucket(last));
  }
  const int64_t k = static_cast<int64_t>(ids.size());
  std::vector<float> vals = gather(x, ids, k);  // [k] raw scores, descending
  std::vector<float> raw(k);                    // [k] raw probabilities
  exp_shifted(vals.data(), k, sel.m(), raw.data());
  for (auto& r : raw) r = static_cast<float>(r / scan.z);
  float* top_ids = out + HEADER;
  float* top_raw = top_ids + n;
  float* top_post = top_raw + n;
  for (int64_t j = 0; j < n; ++j) { top_ids[j] = static_cast<float>(ids[j]); top_raw[j] = raw[j]; }

  if (greedy) {  // argmax, first index on ties: the first candidate
    out[TOKEN] = static_cast<float>(ids[0]);
    out[KEPT] = 1.f;
    out[RAW] = out[MASS] = raw[0];
    out[PROB] = 1.f;
    out[K_KEPT] = out[P_KEPT] = -1.f;
    for (int64_t j = 0; j < n; ++j) top_post[j] = ids[j] == ids[0] ? 1.f : 0.f;
    return packed;
  }
  out[TEMP_H] = static_cast<float>(hs);
  std::vector<float> s(k);  // [k] scores after temperature, exactly as the scan divided them
  for (int64_t j = 0; j < k; ++j) s[j] = scaled ? vals[j] / t : vals[j];
  std::vector<float> unnorm(k);  // [k] exp(s - ms): the scan's own exp(s - ms) for these ids
  exp_shifted(s.data(), k, sel.ms(), unnorm.data());

  if (whole) {
    const int64_t tok = scan.winner;
    const float st = scaled ? x[tok] / t : x[tok];
    float e_tok, es_tok;
    exp_shifted(&x[tok], 1, sel.m(), &e_tok);
    exp_shifted(&st, 1, sel.ms(), &es_tok);
    out[TOKEN] = static_cast<float>(tok);
    out[RANK] = static_cast<float>(count_above(x, v, x[tok]));
    out[KEPT] = static_cast<float>(scan.positive);
    out[RAW] = static_cast<float>(e_tok / scan.z);
    out[PROB] = static_cast<float>(es_tok / scan.zs);
    out[MASS] = static_cast<float>(scan.positive_raw / scan.z);
    out[HS] = static_cast<float>(hs);
    out[PREFIX_MASS] = 1.f;
    out[K_KEPT] = out[P_KEPT] = -1.f;
    for (int64_t j = 0; j < n; ++j) top_post[j] = static_cast<float>(unnorm[j] / scan.zs);
    return packed;
  }

  // Top-k (ties at the k-th included), then top-p (keep a token iff the mass before it < top_p), on the candidates.
  std::vector<double> q(k);  // [k] probabilities after temperature (and top-k)
  std::vector<char> keep(k, 1);
  int64_t k_kept = -1, p_kept = -1;
  if (top_k) {
    const float kth = s[top_k - 1];
    double sum = 0;
    k_kept = 0;
    for (int64_t j = 0; j < k; ++j) {
      keep[j] = s[j] >= kth;
      k_kept += keep[j];
      if (keep[j]) sum += unnorm[j];
    }
    for (int64_t j = 0; j < k; ++j) q[j] = keep[j] ? unnorm[j] / sum : 0.0;
  } else {
    for (int64_t j = 0; j < k; ++j) q[j] = unnorm[j] / scan.zs;
  }
  double prefix_mass = 0;
  for (int64_t j = 0; j < k; ++j) prefix_mass += q[j];
  if (top_p < 1.0) {
    double before = 0;
    p_kept = 0;
    for (int64_t j = 0; j < k; ++j) {
      keep[j] = keep[j] && before < top_p;
      before += q[j];
      p_kept += keep[j];
    }
  }
  double z = 0;
  for (int64_t j = 0; j < k; ++j) if (keep[j]) z += unnorm[j];
  std::vector<float> probs(k), cand_u(k), cand_noise(k);
  for (int64_t j = 0; j < k; ++j) { probs[j] = keep[j] ? static_cast<float>(unnorm[j] / z) : 0.f; cand_u[j] = u[ids[j]]; }
  exp_noise(cand_u.data(), k, cand_noise.data());
  int64_t win = 0;
  float best = -1.f;
  for (int64_t j = 0; j < k; ++j) {
    const float r = probs[j] / cand_noise[j];
    if (r > best) { best = r; win = j; }
  }
  int64_t kept = 0;
  double mass = 0, spread = 0;
  for (int64_t j = 0; j < k; ++j) {
    if (probs[j] > 0) { ++kept; mass += raw[j]; }
    spread += static_cast<double>(probs[j]) * (s[j] - s[0]);
  }
  int64_t rank = 0;
  while (rank < k && vals[rank] > vals[win]) ++rank;
  out[TOKEN] = static_cast<float>(ids[win]);
  out[RANK] = static_cast<float>(rank);
  out[KEPT] = static_cast<float>(kept);
  out[RAW] = raw[win];
  out[PROB] = probs[win];
  out[MASS] = static_cast<float>(mass);
  out[HS] = static_cast<float>(std::log(z) - spread);
  out[PREFIX_MASS] = static_cast<float>(prefix_mass);
  out[LAST_PROB] = static_cast<float>(q[k - 1]);
  out[K_KEPT] = static_cast<float>(k_kept);
  out[P_KEPT] = static_cast<float>(p_kept);
  for (int64_t j = 0; j < n; ++j) top_post[j] = probs[j];
  return packed;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tokentui_q4, m) {
  m.def("select(Tensor scores, float temperature, int top_k, float top_p, int top_n, bool greedy, Generator? generator) -> Tensor");
  m.impl("select", c10::DispatchKey::CPU, &select_cpu);
}
