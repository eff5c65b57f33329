// tokentui's 4-bit matrix products for x86 CPUs with AVX2 and FMA: y = x W^T with W in groups of 32 4-bit values,
// w = d q + m per group (core/model/native/q4_native.py packs it; core/model/quant/int4_kernel.py says when it is used).
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
// q4_linear_i16 and q8_linear_i16 are the same products with the activations rounded to int16 per group of 32 and
// the weights in another nibble order (i16_kernels.h says why and how close).
//
// The kernels themselves are in q4_kernels.h and i16_kernels.h. Registered as torch.ops.tokentui_q4.q4_linear,
// .q8_linear, .q4_linear_i16 and .q8_linear_i16 (TORCH_LIBRARY): one dispatcher call from eager code, opaque ops
// under torch.compile (their shape functions are registered in Python). Threads: fork_rule.h's shared_for over rows
// (torch's own pool and thread count); each output is summed by one thread in a fixed order, so a decode step's
// result does not depend on the thread count. From kWideRows rows of x on (a prefill) the weights are de-quantized a
// block at a time and multiplied by torch's float32 matrix product instead (wide_product): the same weights, MKL's
// sums, no rounding of the activations.
#include <torch/library.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "i16_kernels.h"
#include "q4_kernels.h"

namespace {

using namespace tokentui_q4;

// kWideRows rows of x and more go through wide_product.
constexpr int64_t kWideRows = 16;

void check_x(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), op,
              ": x must be a contiguous float32 CPU matrix [M, K]");
  TORCH_CHECK(x.size(1) % kGroup == 0, op, ": K must be a multiple of 32");
}

// x [M, K] float32, packed [N, K / 2] uint8, dm [N, K / 32, 2] float32 -> y [M, N] float32, through `narrow` (a few
// rows of x: q4_rows_product or q4_rows_product_i16) or, from kWideRows rows on, `dequantize` (the same layout's).
template <typename Narrow, typename Dequantize>
at::Tensor q4_product(const char* op, const at::Tensor& x, const at::Tensor& packed, const at::Tensor& dm,
                      Narrow narrow, Dequantize dequantize) {
  check_x(x, op);
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0), G = K / kGroup;
  TORCH_CHECK(packed.dim() == 2 && packed.size(1) == K / 2 && packed.scalar_type() == at::kByte
                  && packed.is_contiguous(), op, ": packed must be contiguous uint8 [N, K / 2]");
  TORCH_CHECK(dm.scalar_type() == at::kFloat && dm.is_contiguous() && dm.numel() == N * G * 2, op,
              ": dm must be contiguous float32 [N, K / 32, 2]");
  const uint8_t* pk = packed.data_ptr<uint8_t>();
  const float* dmp = dm.data_ptr<float>();
  if (M >= kWideRows)
    return wide_product(x, N, [&](int64_t b, int64_t e, float* out) { dequantize(pk, dmp, K, b, e, out); });
  at::Tensor y = at::empty({M, N}, x.options());
  narrow(x.data_ptr<float>(), M, K, pk, dmp, y.data_ptr<float>(), N);
  return y;
}

// x [M, K] float32, q [N, K] int8, d [N, K / 32] float32 -> y [M, N] float32, through `narrow` (q8_rows_product or
// q8_rows_product_i16) or, from kWideRows rows on, the de-quantized weights.
template <typename Narrow>
at::Tensor q8_product(const char* op, const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, Narrow narrow) {
  check_x(x, op);
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0), G = K / kGroup;
  TORCH_CHECK(q.dim() == 2 && q.size(1) == K && q.scalar_type() == at::kChar && q.is_contiguous(), op,
              ": q must be contiguous int8 [N, K]");
  TORCH_CHECK(d.scalar_type() == at::kFloat && d.is_contiguous() && d.numel() == N * G, op,
              ": d must be contiguous float32 [N, K / 32]");
  const int8_t* qd = q.data_ptr<int8_t>();
  const float* dd = d.data_ptr<float>();
  if (M >= kWideRows)
    return wide_product(x, N, [&](int64_t b, int64_t e, float* out) { dequantize_rows8(qd, dd, K, b, e, out); });
  at::Tensor y = at::empty({M, N}, x.options());
  narrow(x.data_ptr<float>(), M, K, qd, dd, y.data_ptr<float>(), N);
  return y;
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& dm) {
  return q4_product("q4_linear", x, packed, dm, q4_rows_product, dequantize_rows);
}

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d) {
  return q8_product("q8_linear", x, q, d, q8_rows_product);
}

at::Tensor q4_linear_i16(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& dm) {
  return q4_product("q4_linear_i16", x, packed, dm, q4_rows_product_i16, dequantize_rows_i16);
}

at::Tensor q8_linear_i16(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d) {
  return q8_product("q8_linear_i16", x, q, d, q8_rows_product_i16);
}

// The ranges fork_rule.h's shared_for hands out over [0, total): [calls, 3] int64 (first, end, torch's thread
// number), each call on thread `slow_thread` slowed by `slow_ms` (a thread running slower than the others). For
// tests: which thread ran which rows is what no product's output shows.
at::Tensor shared_for_ranges(int64_t total, int64_t grain, int64_t align, int64_t slow_thread, double slow_ms) {
  TORCH_CHECK(total >= 0 && total < (int64_t{1} << 32) && grain >= 1 && align >= 1 && slow_ms >= 0,
              "shared_for_ranges: total in [0, 2^32), grain and align >= 1, slow_ms >= 0");
  std::mutex lock;
  std::vector<int64_t> out;
  tokentui_fork::shared_for(0, total, grain, align, [&](int64_t b, int64_t e) {
    const int64_t thread = at::get_thread_num();
    if (thread == slow_thread && slow_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(slow_ms));
    const std::lock_guard<std::mutex> guard(lock);
    out.insert(out.end(), {b, e, thread});
  });
  at::Tensor ranges = at::empty({static_cast<int64_t>(out.size()) / 3, 3}, at::TensorOptions().dtype(at::kLong));
  std::copy(out.begin(), out.end(), ranges.data_ptr<int64_t>());
  return ranges;
}

}  // namespace

TORCH_LIBRARY(tokentui_q4, m) {
  m.def("q4_linear(Tensor x, Tensor packed, Tensor dm) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor q, Tensor d) -> Tensor");
  m.def("q4_linear_i16(Tensor x, Tensor packed, Tensor dm) -> Tensor");
  m.def("q8_linear_i16(Tensor x, Tensor q, Tensor d) -> Tensor");
  m.def("shared_for_ranges(int total, int grain, int align, int slow_thread, float slow_ms) -> Tensor",
        &shared_for_ranges);
}

TORCH_LIBRARY_IMPL(tokentui_q4, CPU, m) {
  m.impl("q4_linear", &q4_linear);
  m.impl("q8_linear", &q8_linear);
  m.impl("q4_linear_i16", &q4_linear_i16);
  m.impl("q8_linear_i16", &q8_linear_i16);
}
