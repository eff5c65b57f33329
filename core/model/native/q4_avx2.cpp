// tokentui's 4-bit matrix product for x86 CPUs with AVX2 and FMA: y = x W^T with W in groups of 32 4-bit values,
// w = d q + m per group (core/model/q4_native.py packs it; core/model/int4_kernel.py says when it is used).
//
// Why hand-written: torch ships no fast weight-only 4-bit product for AVX2 (its int4 CPU kernel's AVX2 path reads
// ~2.8 GB/s, and it rounds the activations and the scales to bfloat16); llama.cpp's AVX2 kernels round the
// activations to 8 bits. This one keeps both in float32: the 4-bit values are unpacked into float32 lanes and
// multiplied by the float32 activations, so the product equals x times the file's de-quantized weights up to the
// order of float32 additions.
//
// Layout (per row n, per group g of 32 inputs): 16 bytes read as four little-endian 32-bit words w0..w3; nibble p
// (bits 4p..4p+3) of word j holds input 32 g + 8 (p % 4) + j + 4 (p / 4). With the 16 bytes in both 128-bit halves
// of a register, shifting lane L right by 4t (L < 4) or 4t + 16 (L >= 4) and masking gives inputs 32 g + 8 t + L in
// lane L: four shifts, four masks, four conversions and four multiply-adds per group, no shuffles. dm[n, g] holds
// (d, m) in float32; sum_k w x = d sum_k q x + m sum_k x, the group sums of x computed once per call.
//
// An 8-bit matrix (a Q8_0 LM head) has its own product, q8_linear: the file's int8 values converted to float32 in the
// same way, one scale per group of 32.
//
// Registered as torch.ops.tokentui_q4.q4_linear and .q8_linear (TORCH_LIBRARY): one dispatcher call from eager
// code, opaque ops under torch.compile (their shape functions are registered in Python). Threads: at::parallel_for over rows (torch's
// own pool and thread count); each output is summed by one thread in a fixed order, so a decode step's result does
// not depend on the thread count. From kWideRows rows of x on (a prefill) the weights are de-quantized a block at a
// time and multiplied by torch's float32 matrix product instead (wide_product): the same weights, MKL's sums.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Rows [n0, n1) of y for MT consecutive rows of x (x, xsum and y already offset to the first of them).
template <int MT>
void rows(const float* x, int64_t K, const uint8_t* packed, const float* dm, const float* xsum, float* y,
          int64_t N, int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup;
  const __m256i mask = _mm256_set1_epi32(0xF);
  const __m256i s0 = _mm256_setr_epi32(0, 0, 0, 0, 16, 16, 16, 16);
  const __m256i s1 = _mm256_setr_epi32(4, 4, 4, 4, 20, 20, 20, 20);
  const __m256i s2 = _mm256_setr_epi32(8, 8, 8, 8, 24, 24, 24, 24);
  const __m256i s3 = _mm256_setr_epi32(12, 12, 12, 12, 28, 28, 28, 28);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = packed + n * (K / 2);
    const float* row_dm = dm + n * G * 2;
    __m256 acc[MT];
    float min_acc[MT];
    for (int i = 0; i < MT; ++i) {
      acc[i] = _mm256_setzero_ps();
      min_acc[i] = 0.f;
    }
    for (int64_t g = 0; g < G; ++g) {
      const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16)));
      const __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s0), mask));
      const __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s1), mask));
      const __m256 q2 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s2), mask));
      const __m256 q3 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s3), mask));
      const __m256 d = _mm256_set1_ps(row_dm[2 * g]);
      const float m = row_dm[2 * g + 1];
      for (int i = 0; i < MT; ++i) {
        const float* xp = x + i * K + g * kGroup;
        __m256 group = _mm256_mul_ps(q0, _mm256_loadu_ps(xp));
        group = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xp + 8), group);
        group = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xp + 16), group);
        group = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xp + 24), group);
        acc[i] = _mm256_fmadd_ps(d, group, acc[i]);
        min_acc[i] += m * xsum[i * G + g];
      }
    }
    for (int i = 0; i < MT; ++i) y[i * N + n] = horizontal_sum(acc[i]) + min_acc[i];
  }
}

// Rows [n0, n1) of W de-quantized to float32 into out [n1 - n0, K]: w = d q + m, one multiply-add per weight in
// float32 (how gguf-py's de-quantization computes them).
void dequantize_rows(const uint8_t* packed, const float* dm, int64_t K, int64_t n0, int64_t n1, float* out) {
  const int64_t G = K / kGroup;
  const __m256i mask = _mm256_set1_epi32(0xF);
  const __m256i shifts[4] = {_mm256_setr_epi32(0, 0, 0, 0, 16, 16, 16, 16), _mm256_setr_epi32(4, 4, 4, 4, 20, 20, 20, 20),
                             _mm256_setr_epi32(8, 8, 8, 8, 24, 24, 24, 24),
                             _mm256_setr_epi32(12, 12, 12, 12, 28, 28, 28, 28)};
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = packed + n * (K / 2);
    const float* row_dm = dm + n * G * 2;
    float* dst = out + (n - n0) * K;
    for (int64_t g = 0; g < G; ++g) {
      const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16)));
      const __m256 d = _mm256_set1_ps(row_dm[2 * g]), m = _mm256_set1_ps(row_dm[2 * g + 1]);
      for (int t = 0; t < 4; ++t) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, shifts[t]), mask));
        _mm256_storeu_ps(dst + g * kGroup + 8 * t, _mm256_fmadd_ps(q, d, m));
      }
    }
  }
}

// Many rows of x (a prefill): W de-quantized a block of rows at a time into a float32 buffer that stays in the
// caches, and multiplied by torch's own float32 matrix product (MKL's blocking), which the unpacking above cannot
// match once it is shared by more than a few rows of x.
// dequantize(b, e, out) writes rows [b, e) of W to out.
template <typename Dequantize>
at::Tensor wide_product(const at::Tensor& x, int64_t N, const Dequantize& dequantize) {
  const int64_t K = x.size(1);
  const int64_t block = std::max<int64_t>(64, (int64_t{4} << 20) / (K * 4));  // rows of W per ~4 MB of float32
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  at::Tensor w = at::empty({std::min(N, block), K}, x.options());
  float* wd = w.data_ptr<float>();
  for (int64_t n0 = 0; n0 < N; n0 += block) {
    const int64_t n1 = std::min(N, n0 + block);
    at::parallel_for(n0, n1, 16, [&](int64_t b, int64_t e) { dequantize(b, e, wd + (b - n0) * K); });
    y.narrow(1, n0, n1 - n0).copy_(at::mm(x, w.narrow(0, 0, n1 - n0).t()));
  }
  return y;
}

// x [M, K] float32, packed [N, K / 2] uint8, dm [N, K / 32, 2] float32 -> y [M, N] float32.
// kWideRows rows of x and more go through wide_product.
constexpr int64_t kWideRows = 16;

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& dm) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "q4_linear: x must be a contiguous float32 CPU matrix [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0), G = K / kGroup;
  TORCH_CHECK(K % kGroup == 0 && packed.dim() == 2 && packed.size(1) == K / 2 && packed.scalar_type() == at::kByte
                  && packed.is_contiguous(), "q4_linear: packed must be contiguous uint8 [N, K / 2], K a multiple of 32");
  TORCH_CHECK(dm.scalar_type() == at::kFloat && dm.is_contiguous() && dm.numel() == N * G * 2,
              "q4_linear: dm must be contiguous float32 [N, K / 32, 2]");
  const uint8_t* pk = packed.data_ptr<uint8_t>();
  const float* dmp = dm.data_ptr<float>();
  if (M >= kWideRows)
    return wide_product(x, N, [&](int64_t b, int64_t e, float* out) { dequantize_rows(pk, dmp, K, b, e, out); });
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xd = x.data_ptr<float>();
  std::vector<float> xsum(M * G);  // [M, G]: each group's sum of x
  for (int64_t i = 0; i < M * G; ++i) {
    float s = 0.f;
    for (int64_t k = 0; k < kGroup; ++k) s += xd[i * kGroup + k];
    xsum[i] = s;
  }
  float* yd = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)  // four rows of x share each group's unpacked weights
      rows<4>(xd + m * K, K, pk, dmp, xsum.data() + m * G, yd + m * N, N, n0, n1);
    for (; m < M; ++m) rows<1>(xd + m * K, K, pk, dmp, xsum.data() + m * G, yd + m * N, N, n0, n1);
  });
  return y;
}

// An 8-bit matrix (a Q8_0 head: w = d q, q in -128..127, one d per group of 32) in the same way: rows [n0, n1)
// of y for MT rows of x. q [N, K] int8 as the file stores it, d [N, K / 32] float32.
template <int MT>
void rows8(const float* x, int64_t K, const int8_t* q, const float* d, float* y, int64_t N, int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = q + n * K;
    __m256 acc[MT];
    for (int i = 0; i < MT; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const int8_t* p = row + g * kGroup;
      __m256 v[4];
      for (int t = 0; t < 4; ++t)
        v[t] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * t))));
      const __m256 scale = _mm256_set1_ps(d[n * G + g]);
      for (int i = 0; i < MT; ++i) {
        const float* xp = x + i * K + g * kGroup;
        __m256 group = _mm256_mul_ps(v[0], _mm256_loadu_ps(xp));
        group = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xp + 8), group);
        group = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xp + 16), group);
        group = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xp + 24), group);
        acc[i] = _mm256_fmadd_ps(scale, group, acc[i]);
      }
    }
    for (int i = 0; i < MT; ++i) y[i * N + n] = horizontal_sum(acc[i]);
  }
}

void dequantize_rows8(const int8_t* q, const float* d, int64_t K, int64_t n0, int64_t n1, float* out) {
  const int64_t G = K / kGroup;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const __m256 scale = _mm256_set1_ps(d[n * G + g]);
      for (int t = 0; t < 4; ++t) {
        const int64_t k = g * kGroup + 8 * t;
        const __m256 v = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + n * K + k))));
        _mm256_storeu_ps(out + (n - n0) * K + k, _mm256_mul_ps(v, scale));
      }
    }
}

// x [M, K] float32, q [N, K] int8, d [N, K / 32] float32 -> y [M, N] float32.
at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "q8_linear: x must be a contiguous float32 CPU matrix [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0), G = K / kGroup;
  TORCH_CHECK(K % kGroup == 0 && q.dim() == 2 && q.size(1) == K && q.scalar_type() == at::kChar && q.is_contiguous(),
              "q8_linear: q must be contiguous int8 [N, K], K a multiple of 32");
  TORCH_CHECK(d.scalar_type() == at::kFloat && d.is_contiguous() && d.numel() == N * G,
              "q8_linear: d must be contiguous float32 [N, K / 32]");
  const int8_t* qd = q.data_ptr<int8_t>();
  const float* dd = d.data_ptr<float>();
  if (M >= kWideRows)
    return wide_product(x, N, [&](int64_t b, int64_t e, float* out) { dequantize_rows8(qd, dd, K, b, e, out); });
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xd = x.data_ptr<float>();
  float* yd = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows8<4>(xd + m * K, K, qd, dd, yd + m * N, N, n0, n1);
    for (; m < M; ++m) rows8<1>(xd + m * K, K, qd, dd, yd + m * N, N, n0, n1);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(tokentui_q4, m) {
  m.def("q4_linear(Tensor x, Tensor packed, Tensor dm) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor q, Tensor d) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokentui_q4, CPU, m) {
  m.impl("q4_linear", &q4_linear);
  m.impl("q8_linear", &q8_linear);
}
