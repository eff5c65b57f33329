// Step 4 with the whole sampler chain, on the CPU in one call (op tokentui_q4::select_chain, used by
// core/steps/select_chain.py for a step whose stages the one-call selection of select.cpp lacks).
//
// The specification is core/steps/stages.py `run_chain` (each stage as transformers' warper or core/steps/
// penalties.py's transcription of llama.cpp's function) followed by select_chain.py's report: the same packed vector
// (selection.py's layout), the same token from the same per-id noise (select_draw.h draws the uniforms exactly as
// `uniform_` would, and the race reads the noise of the ids still in play). The stages come as a small program,
// built by select_chain.py in the step's order: each entry is a code and its numbers; the sparse stages (logit bias,
// penalties, DRY) carry the ids they touch and their values, worked out in Python from the history (a few dozen
// entries), so only their edit runs here. The other stages are select_stages.h's.
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
#include "select_stages.h"

namespace {
using namespace tokentui_select;

enum Slot { FINITE, ENOUGH, TOKEN, RANK, KEPT, RAW, PROB, MASS, H, HS, PREFIX_MASS, LAST_PROB, TEMP_H, K_KEPT, P_KEPT, HEADER };
// Program codes (select_chain.py `_CODES`); each entry is WIDTH numbers: the code, then its arguments.
enum Code { BIAS = 1, PENALTIES, DRY, TEMP, DYNTEMP, NSIGMA, TOPK, TYPICAL, TOPP, MINP, XTC, MIROSTAT };
constexpr int WIDTH = 6;

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
