// A prompt's rows times a matrix as stored, by llama.cpp's own CPU matrix product: a one-node ggml graph
// (ggml_mul_mat) computed by ggml's CPU backend, as llama-server computes every product of its prefill. The torch
// operation `tokentui_ggml::mul_mat(x, raw, type)`; core/model/quant/ggml_linear.py calls it for more than
// PRODUCT_ROWS rows of a matrix it has not repacked.
//
// Why the graph and not a kernel called directly (as ggml_ops.cpp calls vec_dot and tinyBLAS's Q8_0 kernel): what
// llama.cpp runs for a prompt's rows is chosen inside ggml_compute_forward_mul_mat (ggml-cpu.c) by format: its tiled
// integer kernels for the K-quants and IQ formats (ggml-cpu/tiled: Q2_K ... Q6_K, 16 x 16 tiles of 8-bit products),
// llamafile's tinyBLAS for Q8_0 / Q4_0 / Q5_0 / IQ4_NL and the float formats (F32, F16, BF16), vec_dot in chunks for
// the rest. The tiled kernels and tinyBLAS's float kernels share their work out through ggml's own thread pool
// (its chunk counter and barriers), which only a graph computation sets up; so the graph is the one way to get them,
// and it gives a prompt the arithmetic llama-server gives it (BENCHMARKS.md, issue 37: "A prompt's rows through
// ggml's graph"). ggml's threads are the OpenMP team of the one OpenMP runtime the process has (torch's libgomp
// satisfies libggml-cpu.so's), as many as torch's intra-op threads.
//
// The matrix, the activations and the output stay where they are: each is wrapped as a CPU buffer over its own
// memory (ggml_backend_cpu_buffer_from_ptr), nothing copied. Each calling thread keeps its own backend (its work
// buffer grows to the largest product and is reused) and its own small context for the graph's three tensors.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "ggml_abi.h"

namespace tokentui_ggml {
namespace {

struct GraphFns {
  ggml_init_fn init;
  ggml_free_fn free;
  ggml_overhead_fn tensor_overhead;
  ggml_graph_overhead_custom_fn graph_overhead_custom;
  ggml_new_tensor_2d_fn new_tensor_2d;
  ggml_mul_mat_fn mul_mat;
  ggml_new_graph_custom_fn new_graph_custom;
  ggml_build_forward_expand_fn build_forward_expand;
  ggml_backend_cpu_init_fn backend_cpu_init;
  ggml_backend_cpu_set_n_threads_fn set_n_threads;
  ggml_backend_free_fn backend_free;
  ggml_backend_cpu_buffer_from_ptr_fn buffer_from_ptr;
  ggml_backend_buffer_free_fn buffer_free;
  ggml_backend_tensor_alloc_fn tensor_alloc;
  ggml_backend_graph_compute_fn graph_compute;
};

const GraphFns* fns = nullptr;  // set once by bind_mul_mat (under ggml_ops.cpp's bind lock), never freed

constexpr size_t kGraphNodes = 4;  // the graph's one mul_mat node (its two inputs are leaves)

// This thread's CPU backend and the memory of its graph's context, kept from call to call.
struct ThreadState {
  void* backend = nullptr;
  std::vector<uint8_t> context;
  ~ThreadState() {
    if (backend != nullptr && fns != nullptr) fns->backend_free(backend);
  }
};
thread_local ThreadState state;

// A CPU buffer over `ptr` (ggml's object, freed on scope exit; the memory stays the caller's).
struct Wrapped {
  void* buffer;
  Wrapped(void* ptr, size_t size) : buffer(fns->buffer_from_ptr(ptr, size)) {}
  ~Wrapped() { fns->buffer_free(buffer); }
  Wrapped(const Wrapped&) = delete;
  Wrapped& operator=(const Wrapped&) = delete;
};

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % GGML_ABI_TENSOR_ALIGNMENT == 0; }

template <class T>
bool find(void* handle, const char* name, T& out) {
  out = reinterpret_cast<T>(dlsym(handle, name));
  return out != nullptr;
}

// mul_mat_takes(raw) -> whether mul_mat can run on this matrix's bytes: the graph functions are bound and the bytes
// start on ggml's alignment (a GGUF's tensors do unless the file sets a smaller general.alignment)
bool mul_mat_takes(const at::Tensor& raw) { return fns != nullptr && aligned(raw.data_ptr()); }

// mul_mat(x [M, K] float32, raw [N, row_bytes] uint8 of ggml type `type`) -> [M, N] float32: x W^T as ggml computes
// ggml_mul_mat(W, x) on the CPU.
at::Tensor mul_mat(const at::Tensor& x_in, const at::Tensor& raw, int64_t type) {
  TORCH_CHECK(fns != nullptr, "mul_mat: the bound ggml library has no CPU backend graph functions");
  const Format& fmt = format(type);
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
              "mul_mat: x must be a [M, K] float32 CPU tensor");
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.device().is_cpu(),
              "mul_mat: raw must be a contiguous [rows, row_bytes] uint8 CPU tensor");
  const int64_t M = x_in.size(0), K = x_in.size(1), N = raw.size(0);
  TORCH_CHECK(K > 0 && K % fmt.block == 0 && raw.size(1) == fmt.row_bytes(K), "mul_mat: rows of ", raw.size(1),
              " bytes do not hold ", K, " values of ggml type ", type);
  TORCH_CHECK(aligned(raw.data_ptr()), "mul_mat: the matrix's bytes are not ", GGML_ABI_TENSOR_ALIGNMENT,
              "-byte aligned, as ggml's buffers must be");
  at::Tensor out = at::empty({M, N}, x_in.options());
  if (M == 0 || N == 0) return out;
  at::Tensor x = x_in.contiguous();
  if (!aligned(x.data_ptr())) x = x.clone();  // a view's offset: torch's own allocations are 64-byte aligned

  if (state.backend == nullptr) {
    state.backend = fns->backend_cpu_init();
    TORCH_CHECK(state.backend != nullptr, "mul_mat: ggml's CPU backend did not start");
    state.context.resize(3 * fns->tensor_overhead() + fns->graph_overhead_custom(kGraphNodes, false));
  }
  fns->set_n_threads(state.backend, at::get_num_threads());
  void* ctx = fns->init(ggml_init_params_abi{state.context.size(), state.context.data(), true});
  TORCH_CHECK(ctx != nullptr, "mul_mat: ggml_init failed");
  struct Context {
    void* ctx;
    ~Context() { fns->free(ctx); }
  } owner{ctx};
  void* w = fns->new_tensor_2d(ctx, static_cast<int>(type), K, N);  // ggml's ne0: the values of a row
  void* a = fns->new_tensor_2d(ctx, GGML_ABI_F32, K, M);
  void* y = fns->mul_mat(ctx, w, a);                                 // [N values] x M rows, float32
  Wrapped wb(raw.data_ptr(), static_cast<size_t>(raw.numel()));
  Wrapped ab(x.data_ptr(), static_cast<size_t>(x.numel()) * sizeof(float));
  Wrapped yb(out.data_ptr(), static_cast<size_t>(out.numel()) * sizeof(float));
  const bool placed = fns->tensor_alloc(wb.buffer, w, raw.data_ptr()) == 0 &&
                      fns->tensor_alloc(ab.buffer, a, x.data_ptr()) == 0 &&
                      fns->tensor_alloc(yb.buffer, y, out.data_ptr()) == 0;
  TORCH_CHECK(placed, "mul_mat: ggml refused a tensor's memory");
  void* graph = fns->new_graph_custom(ctx, kGraphNodes, false);
  fns->build_forward_expand(graph, y);
  const int status = fns->graph_compute(state.backend, graph);
  TORCH_CHECK(status == 0, "mul_mat: ggml's graph computation failed (status ", status, ")");
  return out;
}

}  // namespace

bool bind_mul_mat(void* handle) {
  auto* f = new GraphFns{};
  const bool all =
      find(handle, "ggml_init", f->init) && find(handle, "ggml_free", f->free) &&
      find(handle, "ggml_tensor_overhead", f->tensor_overhead) &&
      find(handle, "ggml_graph_overhead_custom", f->graph_overhead_custom) &&
      find(handle, "ggml_new_tensor_2d", f->new_tensor_2d) && find(handle, "ggml_mul_mat", f->mul_mat) &&
      find(handle, "ggml_new_graph_custom", f->new_graph_custom) &&
      find(handle, "ggml_build_forward_expand", f->build_forward_expand) &&
      find(handle, "ggml_backend_cpu_init", f->backend_cpu_init) &&
      find(handle, "ggml_backend_cpu_set_n_threads", f->set_n_threads) &&
      find(handle, "ggml_backend_free", f->backend_free) &&
      find(handle, "ggml_backend_cpu_buffer_from_ptr", f->buffer_from_ptr) &&
      find(handle, "ggml_backend_buffer_free", f->buffer_free) &&
      find(handle, "ggml_backend_tensor_alloc", f->tensor_alloc) &&
      find(handle, "ggml_backend_graph_compute", f->graph_compute);
  if (!all) {
    delete f;
    return false;
  }
  fns = f;
  return true;
}

}  // namespace tokentui_ggml

TORCH_LIBRARY_FRAGMENT(tokentui_ggml, m) {
  m.def("mul_mat_takes(Tensor raw) -> bool", &tokentui_ggml::mul_mat_takes);
  m.def("mul_mat(Tensor x, Tensor raw, int type) -> Tensor");
}

TORCH_LIBRARY_IMPL(tokentui_ggml, CPU, m) { m.impl("mul_mat", &tokentui_ggml::mul_mat); }
