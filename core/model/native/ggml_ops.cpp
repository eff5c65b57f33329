// ggml's CPU kernels as torch operations (torch.ops.tokentui_ggml): a GGUF tensor kept as stored (its raw blocks,
// [rows, row_bytes] uint8) multiplied, de-quantized and looked up by llama.cpp's own code (core/model/quant/
// ggml_linear.py wraps these for the modules; core/model/native/ggml_step.cpp decodes with the same kernels).
//
// Why ggml's and not hand-written: llama.cpp's libggml-cpu.so holds a tuned dot product for every block format a
// GGUF file uses (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, F16, BF16, the IQ formats ...), for every x86 / ARM extension;
// it is built from the pinned llama.cpp sdist (core/model/native/ggml_build.py) and opened here with dlopen, its
// functions found by name (ggml_abi.h says why no ggml header is needed).
//
// The arithmetic is llama.cpp's matrix-vector product on the CPU (ggml-cpu.c, ggml_compute_forward_mul_mat): each
// activation row is converted once with the CPU backend's from_float to the weight format's vec_dot_type (8-bit
// blocks for the quantized formats), then one vec_dot per (weight row, activation row), or for several rows of a Q8_0
// matrix llamafile's tinyBLAS as llama.cpp's prefill calls it (the same float32 outputs, bit for bit). So a product
// here gives the values of llama.cpp's vec_dot path; where llama.cpp repacks a format for an interleaved kernel
// instead (on x86 with AVX2: Q4_0, Q4_K, its "repack" buffers) its sums run in another order, a float32 rounding
// apart: those kernels are bound here too (bind_interleaved) and run on repacked copies by ggml_repack.cpp.
// A whole prompt's rows go through llama.cpp's own matrix product instead (ggml_mul_mat.cpp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "fork_rule.h"
#include "ggml_abi.h"

namespace tokentui_ggml {
namespace {

constexpr int kTypes = 64;  // above every ggml type number in use (ggml's own GGML_TYPE_COUNT: 43 when pinned)
// the formats asked about: ggml's traits arrays end at its GGML_TYPE_COUNT, so only numbers it has are looked up
constexpr int kKnown[] = {GGML_ABI_F32,     GGML_ABI_F16,    GGML_ABI_Q4_0,    GGML_ABI_Q4_1,  GGML_ABI_Q5_0,
                          GGML_ABI_Q5_1,    GGML_ABI_Q8_0,   GGML_ABI_Q2_K,    GGML_ABI_Q3_K,  GGML_ABI_Q4_K,
                          GGML_ABI_Q5_K,    GGML_ABI_Q6_K,   GGML_ABI_IQ2_XXS, GGML_ABI_IQ2_XS, GGML_ABI_IQ3_XXS,
                          GGML_ABI_IQ1_S,   GGML_ABI_IQ4_NL, GGML_ABI_IQ3_S,   GGML_ABI_IQ2_S, GGML_ABI_IQ4_XS,
                          GGML_ABI_IQ1_M,   GGML_ABI_BF16,   GGML_ABI_TQ1_0,   GGML_ABI_TQ2_0, GGML_ABI_MXFP4};

// F32 rows "de-quantized": ggml's traits give F32 no to_float (it is stored as it is run)
void f32_to_float(const void* x, float* y, int64_t k) { std::copy_n(static_cast<const float*>(x), k, y); }
void f32_from_float(const float* x, void* y, int64_t k) { std::copy_n(x, k, static_cast<float*>(y)); }

struct Bound {
  std::string path;
  std::array<Format, kTypes> formats{};
  std::array<bool, kTypes> runs{};
  std::array<Interleaved, kTypes> packed{};  // a format's interleaved kernels (empty where none)
  ggml_sgemm_fn sgemm = nullptr;  // llamafile's tinyBLAS (bind_sgemm), for the formats in `sgemm_types`
  ggml_get_type_traits_fn traits = nullptr;
  ggml_get_type_traits_cpu_fn cpu_traits = nullptr;
};

std::mutex bind_lock;
Bound* bound = nullptr;  // set once, never freed (the library stays open for the process)

// The interleaved kernels llama.cpp itself picks on x86 (repack.cpp, ggml_repack_get_optimal_repack_type): Q4_0 and
// Q4_K 8x8 where ggml was built with AVX2 (ggml_cpu_has_avx2: its compile-time flags, as llama.cpp asks). Found by
// their C names (ggml-cpu's repack.h exports them extern "C"); a library without them leaves the format on vec_dot.
void bind_interleaved(void* handle, Bound* b) {
  auto has_avx2 = reinterpret_cast<ggml_cpu_has_fn>(dlsym(handle, "ggml_cpu_has_avx2"));
  if (has_avx2 == nullptr || !has_avx2()) return;
  const struct {
    int type;
    const char *gemv, *gemm, *quantize4;
  } kinds[] = {{GGML_ABI_Q4_0, "ggml_gemv_q4_0_8x8_q8_0", "ggml_gemm_q4_0_8x8_q8_0", "ggml_quantize_mat_q8_0_4x8"},
               {GGML_ABI_Q4_K, "ggml_gemv_q4_K_8x8_q8_K", "ggml_gemm_q4_K_8x8_q8_K", "ggml_quantize_mat_q8_K_4x8"}};
  for (const auto& kind : kinds) {
    Interleaved k{reinterpret_cast<ggml_gemv_t>(dlsym(handle, kind.gemv)),
                  reinterpret_cast<ggml_gemv_t>(dlsym(handle, kind.gemm)),
                  reinterpret_cast<ggml_quantize_mat_t>(dlsym(handle, kind.quantize4))};
    if (b->runs[kind.type] && k.gemv != nullptr && k.gemm != nullptr && k.quantize4 != nullptr)
      b->packed[kind.type] = k;
  }
}

// The formats whose products of several activation rows (a prompt's) go through llamafile's tinyBLAS, as
// llama.cpp's own prefill multiplies them: Q8_0 weights with Q8_0 activations, where the library exports
// `llamafile_sgemm` (built with GGML_LLAMAFILE, the default). Its kernel keeps a tile of weight and activation rows in
// registers across each block's integer dot products, where one vec_dot per (weight row, activation row) reloads
// both (BENCHMARKS.md, "A prompt's rows through tinyBLAS"). Here it serves a few rows (2 to ggml_linear.py's
// PRODUCT_ROWS); a whole prompt's go through ggml's graph (ggml_mul_mat.cpp), which calls the same kernel, and its
// float formats' kernels too: those share out their tiles through ggml's own thread pool, which only a graph sets up.
constexpr int kSgemmTypes[] = {GGML_ABI_Q8_0};

void bind_sgemm(void* handle, Bound* b) {
  b->sgemm = reinterpret_cast<ggml_sgemm_fn>(dlsym(handle, "llamafile_sgemm"));
}

bool through_sgemm(const Format& fmt) {
  if (bound == nullptr || bound->sgemm == nullptr) return false;
  for (int type : kSgemmTypes)
    if (fmt.type == type && fmt.act_type == type) return true;
  return false;
}

const Format& checked(int64_t type) {
  TORCH_CHECK(bound != nullptr, "ggml: no library bound (tokentui_ggml::bind first)");
  TORCH_CHECK(type >= 0 && type < kTypes && bound->runs[type], "ggml: no CPU kernel for ggml type ", type);
  return bound->formats[type];
}

// bind(path) -> "" when ggml's CPU library at `path` is open and its kernels known, else one line why not.
std::string bind(const std::string& path) {
  std::lock_guard<std::mutex> guard(bind_lock);
  if (bound != nullptr)
    return bound->path == path ? "" : "another ggml library is bound already (" + bound->path + ")";
  // RTLD_GLOBAL: libggml-cpu.so's own dependency, libggml-base.so beside it, is found through its RUNPATH
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return std::string("could not open it: ") + (err ? err : "unknown error");
  }
  auto cpu_traits = reinterpret_cast<ggml_get_type_traits_cpu_fn>(dlsym(handle, "ggml_get_type_traits_cpu"));
  auto init = reinterpret_cast<ggml_cpu_init_fn>(dlsym(handle, "ggml_cpu_init"));
  auto traits = reinterpret_cast<ggml_get_type_traits_fn>(dlsym(handle, "ggml_get_type_traits"));
  if (cpu_traits == nullptr || init == nullptr || traits == nullptr)
    return "it has no ggml_get_type_traits_cpu / ggml_cpu_init / ggml_get_type_traits (not ggml's CPU library?)";
  init();  // the F16 tables and the CPU's features, before any kernel runs
  auto* b = new Bound{path};
  b->traits = traits;
  b->cpu_traits = cpu_traits;
  for (int type : kKnown) {
    const ggml_type_traits* t = traits(type);
    const ggml_type_traits_cpu* c = cpu_traits(type);
    const ggml_to_float_t to_float = type == GGML_ABI_F32 ? f32_to_float : t->to_float;
    if (t == nullptr || c == nullptr || to_float == nullptr || c->vec_dot == nullptr || t->blck_size <= 0)
      continue;
    const int act = c->vec_dot_type;
    if (act < 0 || act >= kTypes) continue;
    const ggml_type_traits* a = traits(act);
    const ggml_type_traits_cpu* ac = cpu_traits(act);
    if (a == nullptr || ac == nullptr || ac->from_float == nullptr || a->blck_size <= 0) continue;
    b->formats[type] = Format{type, t->blck_size, static_cast<int64_t>(t->type_size), to_float,
                              t->from_float_ref, c->vec_dot, act, a->blck_size, static_cast<int64_t>(a->type_size),
                              ac->from_float};
    b->runs[type] = true;
  }
  bind_interleaved(handle, b);
  bind_sgemm(handle, b);
  bind_mul_mat(handle);
  bound = b;
  return "";
}

// sgemm_types() -> the formats `product` runs through tinyBLAS for two or more activation rows
std::vector<int64_t> sgemm_types() {
  std::vector<int64_t> out;
  if (bound != nullptr)
    for (int type : kSgemmTypes)
      if (bound->runs[type] && through_sgemm(bound->formats[type])) out.push_back(type);
  return out;
}

std::vector<int64_t> types() {
  std::vector<int64_t> out;
  if (bound != nullptr)
    for (int type : kKnown)
      if (bound->runs[type]) out.push_back(type);
  return out;
}

// raw [N, row_bytes] uint8 contiguous on the CPU, its rows K values of `fmt` each
void check_raw(const at::Tensor& raw, const Format& fmt, int64_t K, const char* op) {
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.device().is_cpu(), op,
              ": raw must be a contiguous [rows, row_bytes] uint8 CPU tensor");
  TORCH_CHECK(K > 0 && K % fmt.block == 0, op, ": ", K, " values a row is not a multiple of the format's block of ",
              fmt.block);
  TORCH_CHECK(raw.size(1) == fmt.row_bytes(K), op, ": rows of ", raw.size(1), " bytes, but ", K,
              " values of this format take ", fmt.row_bytes(K));
}

// grain: the rows a thread takes at least (fork_rule.h), each row K values by M inputs
int64_t grain_for(int64_t K, int64_t M) { return tokentui_fork::grain(K * M); }

// x [M, K] float32 -> [M, act_row_bytes] in the format's vec_dot_type (the CPU backend's conversion)
std::vector<uint8_t> convert(const float* x, int64_t M, int64_t K, const Format& fmt) {
  const int64_t bytes = fmt.act_row_bytes(K);
  std::vector<uint8_t> act(static_cast<size_t>(M * bytes));
  at::parallel_for(0, M, M >= 16 ? 1 : M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) fmt.act_from_float(x + m * K, act.data() + m * bytes, K);
  });
  return act;
}

at::Tensor product(const at::Tensor& x_in, const at::Tensor& raw, int64_t type) {
  const Format& fmt = checked(type);
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
              "product: x must be a [M, K] float32 CPU tensor");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = raw.size(0);
  check_raw(raw, fmt, K, "product");
  TORCH_CHECK(K % fmt.act_block == 0, "product: K = ", K, " is not a multiple of the activations' block");
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  const std::vector<uint8_t> act = convert(x.data_ptr<float>(), M, K, fmt);
  const int64_t rb = raw.size(1), ab = fmt.act_row_bytes(K);
  const uint8_t* w = raw.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  if (M >= 2 && through_sgemm(fmt)) {  // a prompt's rows: tinyBLAS, each thread its share of the tiles (ith of nth)
    // as many threads as fork_rule.h's grain gives the weight rows (tinyBLAS shares out its tiles itself)
    const int nth = static_cast<int>(std::clamp<int64_t>(N / grain_for(K, M), 1, at::get_num_threads()));
    at::parallel_for(0, nth, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const ggml_compute_params_abi params{static_cast<int>(t), nth, 0, nullptr, nullptr, false};
        TORCH_CHECK(bound->sgemm(&params, N, M, K / fmt.block, w, rb / fmt.type_size, act.data(),
                                 ab / fmt.act_type_size, o, N, fmt.type, fmt.act_type, GGML_ABI_F32),
                    "product: llamafile's sgemm refused ggml type ", fmt.type);
      }
    });
    return out;
  }
  tokentui_fork::shared_for(0, N, grain_for(K, M), 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)  // a weight row stays in cache while every activation row meets it
      for (int64_t m = 0; m < M; ++m)
        fmt.vec_dot(static_cast<int>(K), o + m * N + r, 0, w + r * rb, 0, act.data() + m * ab, 0, 1);
  });
  return out;
}

// raw's rows de-quantized into out ([N, K] float32, contiguous), as ggml's to_float does them.
void fill_float(const at::Tensor& raw, const Format& fmt, int64_t K, at::Tensor& out) {
  const int64_t N = raw.size(0), rb = raw.size(1);
  const uint8_t* w = raw.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, N, grain_for(K, 1), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fmt.to_float(w + r * rb, o + r * K, K);
  });
}

at::Tensor dequantize(const at::Tensor& raw, int64_t type, int64_t K) {
  const Format& fmt = checked(type);
  check_raw(raw, fmt, K, "dequantize");
  at::Tensor out = at::empty({raw.size(0), K}, at::TensorOptions().dtype(at::kFloat));
  fill_float(raw, fmt, K, out);
  return out;
}

at::Tensor rows(const at::Tensor& raw, int64_t type, int64_t K, const at::Tensor& ids_in) {
  const Format& fmt = checked(type);
  check_raw(raw, fmt, K, "rows");
  TORCH_CHECK(ids_in.scalar_type() == at::kLong && ids_in.device().is_cpu(), "rows: ids must be int64 on the CPU");
  const at::Tensor ids = ids_in.reshape({-1}).contiguous();
  const int64_t n = ids.numel(), N = raw.size(0), rb = raw.size(1);
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(id[i] >= 0 && id[i] < N, "rows: id ", id[i], " outside 0..", N - 1);
  at::Tensor out = at::empty({n, K}, at::TensorOptions().dtype(at::kFloat));
  const uint8_t* w = raw.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, grain_for(K, 1), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) fmt.to_float(w + id[i] * rb, o + i * K, K);
  });
  return out;
}

// x [N, K] float32 -> [N, row_bytes] in ggml type `type`: ggml's reference quantization (from_float_ref, what
// llama-quantize runs without an importance matrix) or, `cpu`, the CPU backend's from_float (what a product runs
// on its activations; the only one the 8-bit activation formats Q8_1 / Q8_K have). For tests and fixtures.
at::Tensor quantize(const at::Tensor& x_in, int64_t type, bool cpu) {
  TORCH_CHECK(bound != nullptr, "ggml: no library bound (tokentui_ggml::bind first)");
  TORCH_CHECK(type >= 0 && type < kTypes, "quantize: ggml type ", type, " unknown");
  bool known = false;
  for (int t : kKnown) known = known || t == type;
  known = known || type == GGML_ABI_Q8_1 || type == GGML_ABI_Q8_K;
  TORCH_CHECK(known, "quantize: ggml type ", type, " unknown");
  const ggml_type_traits* t = bound->traits(static_cast<int>(type));
  const ggml_from_float_t fn = type == GGML_ABI_F32 ? f32_from_float
                               : cpu                  ? bound->cpu_traits(static_cast<int>(type))->from_float
                                                      : t->from_float_ref;
  TORCH_CHECK(fn != nullptr, "quantize: ggml has no ", cpu ? "CPU" : "reference", " quantization to type ", type);
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "quantize: x must be [N, K] float32");
  const at::Tensor x = x_in.contiguous();
  const int64_t N = x.size(0), K = x.size(1);
  TORCH_CHECK(K % t->blck_size == 0, "quantize: ", K, " values a row is not a multiple of the block of ",
              t->blck_size);
  const int64_t rb = K / t->blck_size * static_cast<int64_t>(t->type_size);
  at::Tensor out = at::empty({N, rb}, at::TensorOptions().dtype(at::kByte));
  for (int64_t r = 0; r < N; ++r) fn(x.data_ptr<float>() + r * K, out.data_ptr<uint8_t>() + r * rb, K);
  return out;
}

}  // namespace

const Format& format(int64_t type) { return checked(type); }

const Interleaved* interleaved(int64_t type) {
  if (bound == nullptr || type < 0 || type >= kTypes || bound->packed[type].gemv == nullptr) return nullptr;
  return &bound->packed[type];
}

namespace {

// Rows [r0, r1) of the jobs' joined range: one vec_dot a row, or for a job in ggml's interleaved layout one gemv for
// the groups of 8 rows whose first row lies in [r0, r1) (each group so in exactly one range).
void run_range(const Job* jobs, int64_t K, int64_t r0, int64_t r1) {
  int64_t j = 0, first = 0;  // the job holding row r0, and its first row's index in the joined range
  while (r0 >= first + jobs[j].rows) first += jobs[j++].rows;
  for (int64_t r = r0; r < r1; ++r) {
    while (r >= first + jobs[j].rows) first += jobs[j++].rows;
    const Job& job = jobs[j];
    const Format& fmt = *job.format;
    if (job.packed != nullptr) {
      const int64_t a = r - first, b = std::min(r1 - first, job.rows);
      const int64_t g0 = (a + 7) / 8 * 8, g1 = (b + 7) / 8 * 8;
      if (g1 > g0)
        job.packed->gemv(static_cast<int>(K), job.out + g0, 0, job.weights + g0 * fmt.row_bytes(K), job.act, 1,
                         static_cast<int>(g1 - g0));
      r = first + b - 1;  // the loop goes on at the next job's (or the range's) end
      continue;
    }
    fmt.vec_dot(static_cast<int>(K), job.out + (r - first), 0, job.weights + (r - first) * fmt.row_bytes(K), 0,
                job.act, 0, 1);
  }
}

}  // namespace

void run_products(const Job* jobs, int64_t count, int64_t K) {
  int64_t total = 0;
  for (int64_t j = 0; j < count; ++j) total += jobs[j].rows;
  tokentui_fork::shared_for(0, total, grain_for(K, 1), 8, [&](int64_t r0, int64_t r1) { run_range(jobs, K, r0, r1); });
}

}  // namespace tokentui_ggml

TORCH_LIBRARY_FRAGMENT(tokentui_ggml, m) {
  m.def("bind(str path) -> str", &tokentui_ggml::bind);
  m.def("types() -> int[]", &tokentui_ggml::types);
  m.def("sgemm_types() -> int[]", &tokentui_ggml::sgemm_types);
  m.def("product(Tensor x, Tensor raw, int type) -> Tensor");
  m.def("dequantize(Tensor raw, int type, int K) -> Tensor");
  m.def("rows(Tensor raw, int type, int K, Tensor ids) -> Tensor");
  m.def("quantize(Tensor x, int type, bool cpu) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokentui_ggml, CPU, m) {
  m.impl("product", &tokentui_ggml::product);
  m.impl("dequantize", &tokentui_ggml::dequantize);
  m.impl("rows", &tokentui_ggml::rows);
  m.impl("quantize", &tokentui_ggml::quantize);
}
