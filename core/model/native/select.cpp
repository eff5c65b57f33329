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
// 4-bit model's step (BENCHMARKS.md). Here it is one pass over the scores (the maximum), one more that does
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
// The exponentials and the logarithms are hand-written 8-wide polynomials (exp8 and log8 say why).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>


namespace {

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
void next_state(uint32_t* s) {
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

void temper(const uint32_t* s, int64_t n, float* out) {
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
void uniforms(at::mt19937_data_pod& d, int64_t count, float* out) {
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
void draw(const std::optional<at::Generator>& gen, int64_t count, float* out) {
  auto* g = at::get_generator_or_default<at::CPUGeneratorImpl>(gen, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(g->mutex_);
  at::mt19937 engine = g->engine();
  at::mt19937_data_pod data = engine.data();
  mt::uniforms(data, count, out);
  engine.set_data(data);
  g->set_engine(engine);
}

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
void exp_shifted(const float* in, int64_t n, float shift, float* out) {
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
void exp_noise(const float* u, int64_t n, float* out) {
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

int64_t count_above(const float* x, int64_t v, float value) {
  const __m256 c = _mm256_set1_ps(value);
  int64_t count = 0, i = 0;
  for (; i + 8 <= v; i += 8) count += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), c, _CMP_GT_OQ)));
  for (; i < v; ++i) count += x[i] > value;
  return count;
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
