// GGUF matrices repacked into ggml's 8-row interleaved layout and multiplied by llama.cpp's interleaved kernels
// (torch.ops.tokentui_ggml.repack / unpack / packed_product / packed_types), the packed copies in ggml_memory.cpp's
// huge-page memory; core/model/quant/ggml_linear.py uses them, core/model/native/ggml_step.cpp runs the packed
// matrices' gemv.
//
// llama-server on x86 with AVX2 does not run a Q4_0 or Q4_K matrix as stored: its CPU_REPACK buffer type
// (ggml-cpu's repack.cpp, ggml_repack_get_optimal_repack_type) interleaves every 8 rows' blocks (block_q4_0x8,
// block_q4_Kx8) at load, and multiplies by ggml_gemv_* (one activation row) / ggml_gemm_* (4 at a time), which read
// 8 rows' bytes in one stream. The kernels and the activations' 4-row conversion are exported by libggml-cpu.so with
// C names (bound in ggml_ops.cpp); the repacking is not: it is tensor_traits<...>::repack, a C++ member taking a
// whole ggml_tensor (its layout is ggml.h's, which tokentui is built without: ggml_abi.h), so make_block_q4_0x8 /
// make_block_q4_Kx8 (repack.cpp, llama.cpp 11434) are transcribed here, with their exact inverses (unpack: the
// lens's `weight` comes from the packed copy, so the file's bytes are not read again).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fork_rule.h"
#include "ggml_abi.h"
#include "ggml_memory.h"

namespace tokentui_ggml {
namespace {

// ggml-common.h's blocks (ggml_half: uint16_t)
struct block_q4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct block_q4_0x8 {  // repack.h: block<4, 8>
  uint16_t d[8];
  uint8_t qs[128];
};
struct block_q4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct block_q4_Kx8 {  // repack.h
  uint16_t d[8], dmin[8];
  uint8_t scales[96];
  uint8_t qs[1024];
};
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_0x8) == 8 * 18, "Q4_0 block sizes");
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q4_Kx8) == 8 * 144, "Q4_K block sizes");

constexpr uint64_t kXor = 0x8888888888888888ULL;  // Q4_0's nibbles to signed (the 8x8 kernels' lookup expects it)

// make_block_q4_0x8 with interleave 8: 8-byte chunk i of the output is chunk i / 8 of row i % 8's quants
void pack_q4_0(const block_q4_0* in[8], block_q4_0x8* out) {
  for (int i = 0; i < 8; ++i) out->d[i] = in[i]->d;
  for (int i = 0; i < 16; ++i) {
    uint64_t e;
    std::memcpy(&e, in[i % 8]->qs + (i / 8) * 8, 8);
    e ^= kXor;
    std::memcpy(out->qs + i * 8, &e, 8);
  }
}

void unpack_q4_0(const block_q4_0x8* in, block_q4_0* out[8]) {
  for (int i = 0; i < 8; ++i) out[i]->d = in->d[i];
  for (int i = 0; i < 16; ++i) {
    uint64_t e;
    std::memcpy(&e, in->qs + i * 8, 8);
    e ^= kXor;
    std::memcpy(out[i % 8]->qs + (i / 8) * 8, &e, 8);
  }
}

// A Q4_K block's 8 sub-block scales and mins (6 bits each, get_scale_min_k4's packing of 12 bytes) and back: the
// packing is a bijection of 96 bits, so unpack gives the file's bytes exactly.
void scales_of(const uint8_t q[12], uint8_t sc[8], uint8_t mn[8]) {
  for (int i = 0; i < 4; ++i) {
    sc[i] = q[i] & 63;
    mn[i] = q[i + 4] & 63;
    sc[i + 4] = static_cast<uint8_t>((q[i + 8] & 15) | ((q[i] >> 6) << 4));
    mn[i + 4] = static_cast<uint8_t>((q[i + 8] >> 4) | ((q[i + 4] >> 6) << 4));
  }
}

void scales_to(const uint8_t sc[8], const uint8_t mn[8], uint8_t q[12]) {
  for (int i = 0; i < 4; ++i) {
    q[i] = static_cast<uint8_t>(sc[i] | ((sc[i + 4] >> 4) << 6));
    q[i + 4] = static_cast<uint8_t>(mn[i] | ((mn[i + 4] >> 4) << 6));
    q[i + 8] = static_cast<uint8_t>((sc[i + 4] & 15) | ((mn[i + 4] & 15) << 4));
  }
}

// make_block_q4_Kx8 with interleave 8: quants as Q4_0's (no xor); the scales regrouped per sub-block: 12 bytes for
// sub-block i's 8 scales and 8 mins (i < 4 at i * 12, else at 48 + (i - 4) * 12), rows 4..7's top 2 bits beside
// rows 0..3's 6
void pack_q4_K(const block_q4_K* in[8], block_q4_Kx8* out) {
  for (int i = 0; i < 8; ++i) out->d[i] = in[i]->d, out->dmin[i] = in[i]->dmin;
  for (int i = 0; i < 128; ++i) std::memcpy(out->qs + i * 8, in[i % 8]->qs + (i / 8) * 8, 8);
  uint8_t sc[8][8], mn[8][8];  // [row][sub-block]
  for (int r = 0; r < 8; ++r) scales_of(in[r]->scales, sc[r], mn[r]);
  for (int i = 0; i < 8; ++i) {
    uint8_t* o = out->scales + i * 12;  // i < 4: i * 12; i >= 4: 48 + (i - 4) * 12, the same
    for (int j = 0; j < 4; ++j) {
      o[j] = static_cast<uint8_t>((sc[j][i] & 63) + ((sc[j + 4][i] & 48) << 2));
      o[j + 4] = static_cast<uint8_t>((mn[j][i] & 63) + ((mn[j + 4][i] & 48) << 2));
      o[j + 8] = static_cast<uint8_t>((sc[j + 4][i] & 15) + ((mn[j + 4][i] & 15) << 4));
    }
  }
}

void unpack_q4_K(const block_q4_Kx8* in, block_q4_K* out[8]) {
  for (int i = 0; i < 8; ++i) out[i]->d = in->d[i], out[i]->dmin = in->dmin[i];
  for (int i = 0; i < 128; ++i) std::memcpy(out[i % 8]->qs + (i / 8) * 8, in->qs + i * 8, 8);
  uint8_t sc[8][8], mn[8][8];
  for (int i = 0; i < 8; ++i) {
    const uint8_t* o = in->scales + i * 12;
    for (int j = 0; j < 4; ++j) {
      sc[j][i] = o[j] & 63;
      mn[j][i] = o[j + 4] & 63;
      sc[j + 4][i] = static_cast<uint8_t>(((o[j] >> 6) << 4) | (o[j + 8] & 15));
      mn[j + 4][i] = static_cast<uint8_t>(((o[j + 4] >> 6) << 4) | (o[j + 8] >> 4));
    }
  }
  for (int r = 0; r < 8; ++r) scales_to(sc[r], mn[r], out[r]->scales);
}

// raw [N, row_bytes] uint8 contiguous, N a multiple of 8, in a format with interleaved kernels
const Interleaved& checked_packable(const at::Tensor& raw, int64_t type, int64_t K, const char* op) {
  const Interleaved* kernels = interleaved(type);
  TORCH_CHECK(kernels != nullptr, op, ": ggml has no interleaved kernel for ggml type ", type, " here");
  const Format& fmt = format(type);
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.device().is_cpu(), op,
              ": raw must be a contiguous [rows, row_bytes] uint8 CPU tensor");
  TORCH_CHECK(K > 0 && K % fmt.block == 0 && raw.size(1) == fmt.row_bytes(K), op, ": rows of ", raw.size(1),
              " bytes are not ", K, " values of ggml type ", type);
  TORCH_CHECK(raw.size(0) % 8 == 0, op, ": ", raw.size(0), " rows are not a multiple of 8");
  return *kernels;
}

// raw -> the same bytes' count in the other layout (in huge-page memory where `huge`), a group of 8 rows at a time.
// One thread: a copy, bound by memory, where a fork per matrix cost more than it saved (BENCHMARKS.md, "ggml's
// interleaved layout")
at::Tensor convert_layout(const at::Tensor& raw, int64_t type, int64_t K, bool pack, bool huge) {
  checked_packable(raw, type, K, pack ? "repack" : "unpack");
  at::Tensor out = huge ? huge_empty(raw.sizes()) : at::empty_like(raw);
  const int64_t groups = raw.size(0) / 8, rb = raw.size(1);
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  {
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* s = src + g * 8 * rb;  // 8 rows as stored, or their interleaved blocks
      uint8_t* d = dst + g * 8 * rb;
      if (type == GGML_ABI_Q4_0) {
        const int64_t nb = K / 32;
        for (int64_t x = 0; x < nb; ++x) {
          if (pack) {
            const block_q4_0* in[8];
            for (int r = 0; r < 8; ++r) in[r] = reinterpret_cast<const block_q4_0*>(s + r * rb) + x;
            pack_q4_0(in, reinterpret_cast<block_q4_0x8*>(d) + x);
          } else {
            block_q4_0* o[8];
            for (int r = 0; r < 8; ++r) o[r] = reinterpret_cast<block_q4_0*>(d + r * rb) + x;
            unpack_q4_0(reinterpret_cast<const block_q4_0x8*>(s) + x, o);
          }
        }
      } else {  // Q4_K (checked_packable: the only other format with interleaved kernels bound)
        const int64_t nb = K / 256;
        for (int64_t x = 0; x < nb; ++x) {
          if (pack) {
            const block_q4_K* in[8];
            for (int r = 0; r < 8; ++r) in[r] = reinterpret_cast<const block_q4_K*>(s + r * rb) + x;
            pack_q4_K(in, reinterpret_cast<block_q4_Kx8*>(d) + x);
          } else {
            block_q4_K* o[8];
            for (int r = 0; r < 8; ++r) o[r] = reinterpret_cast<block_q4_K*>(d + r * rb) + x;
            unpack_q4_K(reinterpret_cast<const block_q4_Kx8*>(s) + x, o);
          }
        }
      }
    }
  }
  return out;
}

at::Tensor repack(const at::Tensor& raw, int64_t type, int64_t K, bool huge) {
  return convert_layout(raw, type, K, true, huge);
}
at::Tensor unpack(const at::Tensor& packed, int64_t type, int64_t K) {
  return convert_layout(packed, type, K, false, false);
}

// x [M, K] float32 times a packed matrix -> [M, N], as llama.cpp's repack forward_mul_mat: rows of x 4 at a time
// converted by quantize_mat and multiplied by gemm, the rest (M % 4) converted by from_float and by gemv; the weight
// rows split over torch's threads in groups of 8 (fork_rule.h's shared_for).
at::Tensor packed_product(const at::Tensor& x_in, const at::Tensor& packed, int64_t type, int64_t K) {
  const Interleaved& kernels = checked_packable(packed, type, K, "packed_product");
  const Format& fmt = format(type);
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu() && x_in.size(1) == K,
              "packed_product: x must be a [M, ", K, "] float32 CPU tensor");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), N = packed.size(0), rb = packed.size(1), ab = fmt.act_row_bytes(K);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  const int64_t M4 = M - M % 4;
  std::vector<uint8_t> act(static_cast<size_t>(M * ab));
  const float* xd = x.data_ptr<float>();
  for (int64_t m = 0; m < M4; m += 4) kernels.quantize4(xd + m * K, act.data() + m * ab, K);
  for (int64_t m = M4; m < M; ++m) fmt.act_from_float(xd + m * K, act.data() + m * ab, K);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  const int64_t grain = tokentui_fork::grain(8 * K * M);  // a group: 8 rows
  const auto groups = [&](int64_t g0, int64_t g1) {
    const int nc = static_cast<int>((g1 - g0) * 8);
    const uint8_t* vx = w + g0 * 8 * rb;
    if (M4 > 0) kernels.gemm(static_cast<int>(K), o + g0 * 8, N, vx, act.data(), static_cast<int>(M4), nc);
    for (int64_t m = M4; m < M; ++m)
      kernels.gemv(static_cast<int>(K), o + m * N + g0 * 8, 0, vx, act.data() + m * ab, 1, nc);
  };
  tokentui_fork::shared_for(0, N / 8, grain, 1, groups);
  return out;
}

std::vector<int64_t> packed_types() {
  std::vector<int64_t> out;
  for (int type : {GGML_ABI_Q4_0, GGML_ABI_Q4_K})
    if (interleaved(type) != nullptr) out.push_back(type);
  return out;
}

}  // namespace
}  // namespace tokentui_ggml

TORCH_LIBRARY_FRAGMENT(tokentui_ggml, m) {
  m.def("packed_types() -> int[]", &tokentui_ggml::packed_types);
  m.def("repack(Tensor raw, int type, int K, bool huge=False) -> Tensor");
  m.def("unpack(Tensor packed, int type, int K) -> Tensor");
  m.def("packed_product(Tensor x, Tensor packed, int type, int K) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokentui_ggml, CPU, m) {
  m.impl("repack", &tokentui_ggml::repack);
  m.impl("unpack", &tokentui_ggml::unpack);
  m.impl("packed_product", &tokentui_ggml::packed_product);
}
