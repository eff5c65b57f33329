// One decode step of a Llama-family model whose matrices are 4-bit, in one call: from the new token's embedding row
// to the final norm, every layer's norms, projections, rotation, KV cache write, attention, SiLU MLP and residuals
// (core/model/native/native_step.py says when it is used and checks it against the eager lean step).
//
// Why hand-written: with the weights 4-bit, the eager lean step (core/model/decode/lean_step.py) spends about half of a
// step on ~1,000 small host operations between the 121 kernel calls (each a dispatcher call, an allocation and a
// pass over a few hundred floats); --compile removes most of them but needs minutes of compiling first. Here the
// whole step is C++ on raw pointers: the same arithmetic as the lean step, in float32, with nothing between the
// kernels but loops over the hidden state.
//
// The arithmetic, as transformers' Llama / Qwen2 / Qwen3 forward does it for one position (the lean step's order):
//   h = rms_norm(x) w1;  qkv = h Wqkv^T (+ b);  [Qwen3: q, k heads rms-normed by qn, kn];
//   q, k rotated: v cos + rotate_half(v) sin;  k, v written to row `pos` of the layer's buffers;
//   per query head: softmax(scale q . k_t) over t <= pos, times v_t (its kv head: head / (heads / kv_heads));
//   x += attn Wo^T;  h = rms_norm(x) w2;  x += (silu(h Wg^T) * h Wu^T) Wd^T;   at the end rms_norm(x) w.
// Sums are float32 in a fixed order (not the model's order: the scores differ from the eager step's by float32
// rounding, which native_step.py bounds when it accepts the step). Products through the kernels of q4_kernels.h
// (float32 activations) or i16_kernels.h (`int16`: activations rounded to int16 per group of 32), so the model's
// matrices must be packed for one of tokentui's kernels (core/model/native/q4_native.py; with torch's int4 kernel the
// eager lean step decodes). Threads: each product's rows split over torch's pool (fork_rule.h's shared_for);
// attention's heads too, once the cache is long enough to pay for it.
//
// `queries` (optional, [L, heads, D] float32 contiguous): where given, each layer's query heads after the rotation
// (and Qwen3's norm), as attention uses them, are copied there. Why: the attention view (core/model/observe/
// attention_native.py) computes the new token's weights from them and the cache's keys, without the torch forward;
// absent, the step does nothing more than one pointer test a layer. `residuals` (optional, [L, 4, H] float32
// contiguous) likewise gets each layer's stream before it, attention's and the MLP's contributions, and the stream
// after it (core/model/observe/sublayers_native.py: the sublayer view's norms).
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <utility>

#include "i16_kernels.h"
#include "q4_kernels.h"
#include "step_math.h"

namespace {

using namespace tokentui_q4;
using namespace tokentui_step;  // rms_norm, dot, axpy, attend (step_math.h)

// Layer l's row of a stack [L, ...] (core/model/decode/lean_step.py's stacked_weights), as a pointer: no tensor is made.
template <typename T>
T* row(const at::Tensor& stack, int64_t l) {
  return stack.data_ptr<T>() + l * stack.stride(0);
}

// y [N] = x [K] W^T, W layer l's matrix of a stack [L, N, K / 2] of 4-bit matrices, dm [L, N, K / 32, 2], in the
// int16 kernel's layout when `int16`.
void product(bool int16, const float* x, int64_t K, const at::Tensor& packed, const at::Tensor& dm, int64_t l,
             float* y) {
  if (int16)
    q4_rows_product_i16(x, 1, K, row<uint8_t>(packed, l), row<float>(dm, l), y, packed.size(1));
  else
    q4_rows_product(x, 1, K, row<uint8_t>(packed, l), row<float>(dm, l), y, packed.size(1));
}

// x [1, H] float32 (the token's embedding row), cos / sin [D] (the rotation at `pos`), kbufs / vbufs per layer
// [1, KV, capacity, D] float32 contiguous (row `pos` is written here), stacked: the 13 kinds of
// stacked_weights [L, ...] (None where the model has no such weight), norm [H], int16: the matrices are packed for
// the int16 kernel -> the final norm's output [1, H].
at::Tensor decode_step(const at::Tensor& x_in, int64_t pos, const at::Tensor& cos, const at::Tensor& sin,
                       at::TensorList kbufs, at::TensorList vbufs, const c10::List<std::optional<at::Tensor>>& stacked,
                       const at::Tensor& norm, int64_t heads, int64_t kv_heads, double eps_in, double scale_in,
                       bool int16, const std::optional<at::Tensor>& queries,
                       const std::optional<at::Tensor>& residuals) {
  TORCH_CHECK(stacked.size() == 13, "decode_step: expected the 13 kinds of stacked weights");
  const int64_t L = static_cast<int64_t>(kbufs.size()), H = x_in.size(-1), D = cos.numel();
  const float eps = static_cast<float>(eps_in), scale = static_cast<float>(scale_in);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.numel() == H && cos.scalar_type() == at::kFloat
                  && sin.numel() == D && static_cast<int64_t>(vbufs.size()) == L && heads % kv_heads == 0,
              "decode_step: x [1, H] and cos / sin [D] float32, as many value buffers as key buffers");
  auto kind = [&](size_t i) -> std::optional<at::Tensor> {
    const std::optional<at::Tensor> t = stacked.get(i);
    if (t.has_value()) TORCH_CHECK(t->size(0) == L && t->is_contiguous(), "decode_step: stacked weights [L, ...]");
    return t;
  };
  const auto norm1 = kind(0), qkv_p = kind(1), qkv_s = kind(2), qkv_b = kind(3), qn = kind(4), kn = kind(5),
             o_p = kind(6), o_s = kind(7), norm2 = kind(8), gu_p = kind(9), gu_s = kind(10), d_p = kind(11),
             d_s = kind(12);
  for (const auto* needed : {&norm1, &qkv_p, &qkv_s, &o_p, &o_s, &norm2, &gu_p, &gu_s, &d_p, &d_s})
    TORCH_CHECK(needed->has_value(), "decode_step: a layer weight every model has is missing");
  TORCH_CHECK(qn.has_value() == kn.has_value(), "decode_step: a q norm without a k norm, or the reverse");
  const int64_t q_width = heads * D, kv_width = kv_heads * D, qkv_width = q_width + 2 * kv_width;
  const int64_t width = gu_p->size(1) / 2;  // gate and up, stacked
  for (const auto& [packed, dm] : {std::pair{qkv_p, qkv_s}, {o_p, o_s}, {gu_p, gu_s}, {d_p, d_s}})
    TORCH_CHECK(packed->scalar_type() == at::kByte && dm->scalar_type() == at::kFloat
                    && dm->numel() == L * packed->size(1) * (2 * packed->size(2) / kGroup) * 2,
                "decode_step: matrices packed for tokentui's kernels ([L, N, K / 2] uint8, [L, N, K / 32, 2] float32)");
  TORCH_CHECK(qkv_p->size(1) == qkv_width && 2 * qkv_p->size(2) == H && o_p->size(1) == H
                  && 2 * o_p->size(2) == q_width && 2 * gu_p->size(2) == H && d_p->size(1) == H
                  && 2 * d_p->size(2) == width && D % 2 == 0,
              "decode_step: projections of unexpected shapes");
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(kbufs[l].scalar_type() == at::kFloat && kbufs[l].is_contiguous() && vbufs[l].is_contiguous()
                    && kbufs[l].size(1) == kv_heads && kbufs[l].size(3) == D && kbufs[l].size(2) > pos
                    && vbufs[l].sizes() == kbufs[l].sizes(),
                "decode_step: buffers [1, KV, capacity > pos, D] float32 contiguous");
  TORCH_CHECK(!queries.has_value() || (queries->scalar_type() == at::kFloat && queries->is_contiguous()
                                       && queries->numel() == L * q_width),
              "decode_step: queries [L, heads, D] float32 contiguous");
  float* q_out = queries.has_value() ? queries->data_ptr<float>() : nullptr;
  TORCH_CHECK(!residuals.has_value() || (residuals->scalar_type() == at::kFloat && residuals->is_contiguous()
                                         && residuals->numel() == L * 4 * H),
              "decode_step: residuals [L, 4, H] float32 contiguous");
  float* r_out = residuals.has_value() ? residuals->data_ptr<float>() : nullptr;

  at::Tensor x = x_in.reshape({1, H}).clone();
  float* xd = x.data_ptr<float>();
  std::vector<float> h(std::max(H, width)), qkv(qkv_width), gu(2 * width), attn(q_width), add(H),
      scores(heads * (pos + 1));
  const float *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
  const int64_t half = D / 2;
  std::vector<float> rotated(D);
  for (int64_t l = 0; l < L; ++l) {
    float* r = r_out != nullptr ? r_out + l * 4 * H : nullptr;  // this layer's [4, H] rows, where asked
    if (r != nullptr) std::copy_n(xd, H, r);                      // the stream entering the layer
    rms_norm(xd, row<float>(*norm1, l), H, eps, h.data());
    product(int16, h.data(), H, *qkv_p, *qkv_s, l, qkv.data());
    if (qkv_b.has_value()) axpy(1.f, row<float>(*qkv_b, l), qkv.data(), qkv_width);
    for (int64_t head = 0; head < heads + kv_heads; ++head) {  // q then k: [Qwen3's norm,] the rotation
      float* v = qkv.data() + head * D;
      if (qn.has_value()) rms_norm(v, row<float>(head < heads ? *qn : *kn, l), D, eps, v);
      for (int64_t i = 0; i < D; ++i) rotated[i] = v[i] * c[i] + (i < half ? -v[i + half] : v[i - half]) * s[i];
      std::copy_n(rotated.data(), D, v);
    }
    if (q_out != nullptr) std::copy_n(qkv.data(), q_width, q_out + l * q_width);  // the query heads, rotated
    const int64_t capacity = kbufs[l].size(2);
    float *keys = kbufs[l].data_ptr<float>(), *values = vbufs[l].data_ptr<float>();
    for (int64_t g = 0; g < kv_heads; ++g) {
      std::copy_n(qkv.data() + q_width + g * D, D, keys + (g * capacity + pos) * D);
      std::copy_n(qkv.data() + q_width + kv_width + g * D, D, values + (g * capacity + pos) * D);
    }
    attend(qkv.data(), keys, values, capacity, heads, kv_heads, D, pos, scale, scores.data(), attn.data());
    product(int16, attn.data(), q_width, *o_p, *o_s, l, add.data());
    if (r != nullptr) std::copy_n(add.data(), H, r + H);  // attention's contribution
    axpy(1.f, add.data(), xd, H);
    rms_norm(xd, row<float>(*norm2, l), H, eps, h.data());
    product(int16, h.data(), H, *gu_p, *gu_s, l, gu.data());
    for (int64_t i = 0; i < width; ++i) {
      const float g = gu[i];
      h[i] = g / (1.f + std::exp(-g)) * gu[width + i];  // silu(gate) * up
    }
    product(int16, h.data(), width, *d_p, *d_s, l, add.data());
    axpy(1.f, add.data(), xd, H);
    if (r != nullptr) {
      std::copy_n(add.data(), H, r + 2 * H);  // the MLP's contribution
      std::copy_n(xd, H, r + 3 * H);          // the stream leaving the layer
    }
  }
  at::Tensor out = at::empty({1, H}, x.options());
  rms_norm(xd, norm.data_ptr<float>(), H, eps, out.data_ptr<float>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tokentui_q4, m) {
  m.def("decode_step(Tensor x, int pos, Tensor cos, Tensor sin, Tensor(a!)[] kbufs, Tensor(b!)[] vbufs, "
        "Tensor?[] stacked, Tensor norm, int heads, int kv_heads, float eps, float scale, bool int16, "
        "Tensor(c!)? queries=None, Tensor(d!)? residuals=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokentui_q4, CPU, m) { m.impl("decode_step", &decode_step); }
