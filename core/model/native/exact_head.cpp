// The LM head's exact scores in one call (op tokentui_q4::exact_top, used by QLMHead in core/model/quant/qlinear.py):
// the `count` highest scores of each row of `scores` [M, V] (a 4-bit or int16 kernel's) recomputed from the head's
// float32 rows `weight` [V, H] and the row's input `x` [M, H] (plus `bias` [V] where the head has one), in place.
//
// Why hand-written: the torch version is a topk over the vocabulary, an index_select of the rows, a bmm and a scatter
// into a new [M, V] tensor: 0.7 ms of the embedded model's 12 ms step at 2 threads (BENCHMARKS.md, "The embedded
// model's step, taken apart"), most of it the topk's sort network and the copies. No library op picks a top set without
// ordering it.
//
// How the top set is found without sorting the vocabulary: the scores are cut into blocks of 64 and each block's
// maximum taken (one pass). T, the count-th largest of those maxima, is at most the count-th largest score (count
// blocks have a score >= T), so every score of the top set is >= T and lies in a block whose maximum is >= T: only
// those blocks are read again, their scores >= T gathered (at least count of them), and the count highest picked
// among them (nth_element; which of several equal scores at the edge is picked does not matter: each is recomputed
// or left as it is, and a tie stays a tie within the kernel's rounding). Scores that are NaN are never picked (the
// torch version's topk would pick them first); their rows' inputs are not finite, and recomputing gives NaN anyway.
//
// Each recomputed score is the dot product of two float32 rows summed in float64 and rounded once to float32: the
// float32 rows' product as exactly as float32 can hold it (torch's float32 bmm differs from it by its own rounding).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kBlock = 64;

// a . b over n float32 values, each product and the sum in float64.
double dot64(const float* a, const float* b, int64_t n) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
    lo = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), _mm256_cvtps_pd(_mm256_castps256_ps128(y)), lo);
    hi = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)),
                         hi);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(lo, hi));
  double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// The ids of the `count` highest scores of s [v] (count < v), in no particular order; NaN never among them (fewer
// than count ids when fewer than count scores are numbers).
std::vector<int64_t> top_set(const float* s, int64_t v, int64_t count) {
  const int64_t blocks = (v + kBlock - 1) / kBlock;
  std::vector<float> maxima(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t start = b * kBlock, end = std::min(v, start + kBlock);
    float m = -INFINITY;
    for (int64_t i = start; i < end; ++i) m = s[i] > m ? s[i] : m;  // NaN compares false: never the maximum
    maxima[b] = m;
  }
  float threshold = -INFINITY;
  if (count < blocks) {
    std::vector<float> order(maxima);
    std::nth_element(order.begin(), order.begin() + (count - 1), order.end(), std::greater<float>());
    threshold = order[count - 1];
  }
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(4 * count));
  for (int64_t b = 0; b < blocks; ++b) {
    if (!(maxima[b] >= threshold)) continue;
    const int64_t start = b * kBlock, end = std::min(v, start + kBlock);
    for (int64_t i = start; i < end; ++i)
      if (s[i] >= threshold) ids.push_back(i);
  }
  if (static_cast<int64_t>(ids.size()) > count) {
    std::nth_element(ids.begin(), ids.begin() + (count - 1), ids.end(),
                     [s](int64_t p, int64_t q) { return s[p] > s[q] || (s[p] == s[q] && p < q); });
    ids.resize(static_cast<size_t>(count));
  }
  return ids;
}

void exact_top(at::Tensor scores, const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
               int64_t count) {
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == at::kFloat && scores.dim() == 2
                  && scores.is_contiguous(), "exact_top: scores [M, V] float32 contiguous on the CPU");
  const int64_t M = scores.size(0), V = scores.size(1), H = weight.size(-1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.size(0) == V && weight.is_contiguous(),
              "exact_top: weight [V, H] float32 contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(0) == M && x.size(1) == H && x.is_contiguous(),
              "exact_top: x [M, H] float32 contiguous");
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == at::kFloat && bias->numel() == V && bias->is_contiguous()),
              "exact_top: bias [V] float32 contiguous");
  TORCH_CHECK(count >= 0, "exact_top: count >= 0");
  const float* w = weight.data_ptr<float>();
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  for (int64_t m = 0; m < M; ++m) {
    float* s = scores.data_ptr<float>() + m * V;
    const float* xm = x.data_ptr<float>() + m * H;
    std::vector<int64_t> ids;
    if (count >= V) {
      ids.resize(static_cast<size_t>(V));
      for (int64_t i = 0; i < V; ++i) ids[i] = i;
    } else if (count > 0) {
      ids = top_set(s, V, count);
    }
    for (const int64_t i : ids) {
      const double exact = dot64(w + i * H, xm, H);
      s[i] = static_cast<float>(b != nullptr ? exact + static_cast<double>(b[i]) : exact);
    }
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tokentui_q4, m) {
  m.def("exact_top(Tensor(a!) scores, Tensor x, Tensor weight, Tensor? bias, int count) -> ()");
}

TORCH_LIBRARY_IMPL(tokentui_q4, CPU, m) { m.impl("exact_top", &exact_top); }
