// One decode step of a Llama-family model whose matrices are GGUF tensors kept as stored, in one call: the same
// arithmetic as core/model/native/decode_step.cpp (Llama, Mistral, Qwen2's q/k/v bias, Qwen3's q/k RMSNorm; the
// norms, rotation, KV cache write, attention, SiLU MLP and residuals in float32, step_math.h), with every product
// through ggml's CPU kernels (ggml_abi.h, bound by ggml_ops.cpp). Each of a layer's 7 matrices is its own (raw
// blocks, ggml type) pair: a Q4_K_M file mixes Q4_K and Q6_K inside one layer. core/model/native/ggml_native.py says
// when it is used and checks it against the model's forward.
//
// The products are llama.cpp's: the input of a product converted once per weight format's vec_dot_type (the
// q/k/v, gate/up of a layer share one conversion when their formats share it), then one vec_dot per weight row, or
// for a matrix repacked into ggml's 8-row interleaved layout (Q4_0 / Q4_K on AVX2, as llama-server runs them) one
// gemv per 8 rows; the rows of a layer's q, k and v (and of its gate and up) split over torch's threads as one range
// (fork_rule.h's shared_for: each thread its own run of rows, then what is left of the others').
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>
#include <utility>
#include <vector>

#include "ggml_abi.h"
#include "step_math.h"

namespace {

using namespace tokentui_step;
using tokentui_ggml::Format;
using tokentui_ggml::Job;

constexpr int kMats = 7;     // q, k, v, o, gate, up, down
constexpr int kVectors = 7;  // norm1, norm2, q bias, k bias, v bias, q norm, k norm

// One input row converted to each activation format the products reading it need (usually one).
class Converted {
 public:
  Converted(const float* x, int64_t K) : x_(x), K_(K) {}
  const uint8_t* as(const Format& fmt) {
    for (auto& [type, bytes] : done_)
      if (type == fmt.act_type) return bytes.data();
    done_.emplace_back(fmt.act_type, std::vector<uint8_t>(static_cast<size_t>(fmt.act_row_bytes(K_))));
    fmt.act_from_float(x_, done_.back().second.data(), K_);
    return done_.back().second.data();
  }

 private:
  const float* x_;
  int64_t K_;
  std::vector<std::pair<int, std::vector<uint8_t>>> done_;
};

struct Matrix {
  const Format* format;
  const uint8_t* raw;
  const tokentui_ggml::Interleaved* packed;  // raw in ggml's 8-row interleaved layout (gemv), or nullptr (vec_dot)
  int64_t rows;
};

// Products of one input x [K] with several matrices, outs[i] [rows_i], as one threaded range.
void products(const float* x, int64_t K, std::initializer_list<std::pair<const Matrix*, float*>> targets) {
  Converted converted(x, K);
  std::vector<Job> jobs;
  for (const auto& [m, out] : targets) jobs.push_back(Job{m->format, m->raw, m->packed, m->rows, converted.as(*m->format), out});
  tokentui_ggml::run_products(jobs.data(), static_cast<int64_t>(jobs.size()), K);
}

const float* maybe(const c10::List<std::optional<at::Tensor>>& vectors, size_t i, int64_t n) {
  const std::optional<at::Tensor> t = vectors.get(i);
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == n,
              "ggml_decode_step: a norm weight or bias of the wrong size or dtype");
  return t->data_ptr<float>();
}

// x [1, H] float32 (the token's embedding row), cos / sin [D] (the rotation at `pos`), kbufs / vbufs per layer
// [1, KV, capacity, D] float32 contiguous (row `pos` is written here), mats: 7 per layer (q, k, v, o, gate, up, down
// raw [rows, row_bytes] uint8) with their ggml types and whether each is in ggml's 8-row interleaved layout
// (packed: 1; ggml_repack.cpp), vectors: 7 per layer (input norm, post-attention norm, q / k
// / v bias, q / k norm; None where the model has none), norm [H] -> the final norm's output [1, H].
at::Tensor ggml_decode_step(const at::Tensor& x_in, int64_t pos, const at::Tensor& cos, const at::Tensor& sin,
                            at::TensorList kbufs, at::TensorList vbufs, at::TensorList mats, at::IntArrayRef types,
                            at::IntArrayRef packed,
                            const c10::List<std::optional<at::Tensor>>& vectors, const at::Tensor& norm,
                            int64_t heads, int64_t kv_heads, double eps_in, double scale_in) {
  const int64_t L = static_cast<int64_t>(kbufs.size()), H = x_in.size(-1), D = cos.numel();
  const float eps = static_cast<float>(eps_in), scale = static_cast<float>(scale_in);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.numel() == H && cos.scalar_type() == at::kFloat
                  && sin.scalar_type() == at::kFloat && sin.numel() == D && static_cast<int64_t>(vbufs.size()) == L
                  && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && D % 2 == 0,
              "ggml_decode_step: x [1, H] and cos / sin [D] float32, as many value buffers as key buffers");
  TORCH_CHECK(static_cast<int64_t>(mats.size()) == kMats * L && static_cast<int64_t>(types.size()) == kMats * L
                  && static_cast<int64_t>(packed.size()) == kMats * L
                  && static_cast<int64_t>(vectors.size()) == kVectors * L,
              "ggml_decode_step: 7 matrices, 7 types and 7 vectors a layer");
  TORCH_CHECK(norm.scalar_type() == at::kFloat && norm.is_contiguous() && norm.numel() == H,
              "ggml_decode_step: the final norm's weight [H] float32");
  const int64_t q_width = heads * D, kv_width = kv_heads * D;
  const int64_t width = mats[4].size(0);  // the MLP's, from the gate
  // (rows, values a row) of each of the 7 matrices
  const std::pair<int64_t, int64_t> shapes[kMats] = {{q_width, H}, {kv_width, H}, {kv_width, H}, {H, q_width},
                                                     {width, H},   {width, H},    {H, width}};
  std::vector<Matrix> matrices(kMats * L);
  for (int64_t i = 0; i < kMats * L; ++i) {
    const at::Tensor& raw = mats[i];
    const Format& fmt = tokentui_ggml::format(types[i]);
    const auto [rows, k] = shapes[i % kMats];
    TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.size(0) == rows
                    && k % fmt.block == 0 && k % fmt.act_block == 0 && raw.size(1) == fmt.row_bytes(k),
                "ggml_decode_step: matrix ", i % kMats, " of layer ", i / kMats, " is not [", rows,
                ", row bytes of ", k, " values] uint8 in its ggml type");
    const tokentui_ggml::Interleaved* kernels = packed[i] ? tokentui_ggml::interleaved(types[i]) : nullptr;
    TORCH_CHECK(!packed[i] || (kernels != nullptr && rows % 8 == 0), "ggml_decode_step: matrix ", i % kMats,
                " of layer ", i / kMats, " is interleaved, but ggml has no interleaved kernel for its type");
    matrices[i] = Matrix{&fmt, raw.data_ptr<uint8_t>(), kernels, rows};
  }
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(kbufs[l].scalar_type() == at::kFloat && kbufs[l].is_contiguous() && vbufs[l].is_contiguous()
                    && kbufs[l].size(1) == kv_heads && kbufs[l].size(3) == D && kbufs[l].size(2) > pos
                    && vbufs[l].sizes() == kbufs[l].sizes(),
                "ggml_decode_step: buffers [1, KV, capacity > pos, D] float32 contiguous");

  at::Tensor x = x_in.reshape({1, H}).clone();
  float* xd = x.data_ptr<float>();
  std::vector<float> h(std::max(H, width)), qkv(q_width + 2 * kv_width), gate(width), up(width), attn(q_width),
      add(H), scores(heads * (pos + 1)), scratch(D);
  const float *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
  for (int64_t l = 0; l < L; ++l) {
    const Matrix* m = matrices.data() + l * kMats;
    const size_t v0 = static_cast<size_t>(l * kVectors);
    const float *norm1 = maybe(vectors, v0, H), *norm2 = maybe(vectors, v0 + 1, H);
    const float* biases[3] = {maybe(vectors, v0 + 2, q_width), maybe(vectors, v0 + 3, kv_width),
                              maybe(vectors, v0 + 4, kv_width)};
    const float *qn = maybe(vectors, v0 + 5, D), *kn = maybe(vectors, v0 + 6, D);
    TORCH_CHECK(norm1 != nullptr && norm2 != nullptr && (qn == nullptr) == (kn == nullptr),
                "ggml_decode_step: a layer without its norms, or a q norm without a k norm");
    float *q = qkv.data(), *k = q + q_width, *v = k + kv_width;
    rms_norm(xd, norm1, H, eps, h.data());
    products(h.data(), H, {{&m[0], q}, {&m[1], k}, {&m[2], v}});
    float* outs[3] = {q, k, v};
    const int64_t widths[3] = {q_width, kv_width, kv_width};
    for (int i = 0; i < 3; ++i)
      if (biases[i] != nullptr) axpy(1.f, biases[i], outs[i], widths[i]);
    for (int64_t head = 0; head < heads + kv_heads; ++head) {  // q then k: [Qwen3's norm,] the rotation
      float* vec = qkv.data() + head * D;
      if (qn != nullptr) rms_norm(vec, head < heads ? qn : kn, D, eps, vec);
      rotate(vec, c, s, D, scratch.data());
    }
    const int64_t capacity = kbufs[l].size(2);
    float *keys = kbufs[l].data_ptr<float>(), *values = vbufs[l].data_ptr<float>();
    for (int64_t g = 0; g < kv_heads; ++g) {
      std::copy_n(k + g * D, D, keys + (g * capacity + pos) * D);
      std::copy_n(v + g * D, D, values + (g * capacity + pos) * D);
    }
    attend(q, keys, values, capacity, heads, kv_heads, D, pos, scale, scores.data(), attn.data());
    products(attn.data(), q_width, {{&m[3], add.data()}});
    axpy(1.f, add.data(), xd, H);
    rms_norm(xd, norm2, H, eps, h.data());
    products(h.data(), H, {{&m[4], gate.data()}, {&m[5], up.data()}});
    for (int64_t i = 0; i < width; ++i) h[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];  // silu(gate) * up
    products(h.data(), width, {{&m[6], add.data()}});
    axpy(1.f, add.data(), xd, H);
  }
  at::Tensor out = at::empty({1, H}, x.options());
  rms_norm(xd, norm.data_ptr<float>(), H, eps, out.data_ptr<float>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tokentui_ggml, m) {
  m.def("decode_step(Tensor x, int pos, Tensor cos, Tensor sin, Tensor(a!)[] kbufs, Tensor(b!)[] vbufs, "
        "Tensor[] mats, int[] types, int[] packed, Tensor?[] vectors, Tensor norm, int heads, int kv_heads, float eps, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokentui_ggml, CPU, m) { m.impl("decode_step", &ggml_decode_step); }
