// ggml's CPU kernels as tokentui's library calls them (core/model/native/ggml_ops.cpp binds them, ggml_step.cpp uses
// them), in two parts.
//
// 1. The few declarations of ggml's ABI this needs, copied from the pinned llama.cpp's ggml/include/ggml.h
//    (`enum ggml_type`'s numbers, `struct ggml_type_traits`, `ggml_get_type_traits`) and ggml/include/ggml-cpu.h
//    (`struct ggml_type_traits_cpu`, `ggml_get_type_traits_cpu`, `ggml_cpu_init`). Why copied: tokentui's library is
//    built on the user's first start from these sources and torch's headers alone (core/model/native/q4_native.py),
//    before and without ggml's headers; ggml itself (libggml-cpu.so) is opened at run time with dlopen and its
//    functions found with dlsym, so only the layouts of these two structs and the functions' signatures must match
//    the library's (they have been stable since ggml split its CPU backend out, 2024-10).
// 2. tokentui's own interface between ggml_ops.cpp (which holds the bound library) and ggml_step.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
// ggml.h: the block formats' numbers in GGUF files and in ggml (stable: a removed format's number is never reused)
enum ggml_type_abi : int {
  GGML_ABI_F32 = 0, GGML_ABI_F16 = 1, GGML_ABI_Q4_0 = 2, GGML_ABI_Q4_1 = 3, GGML_ABI_Q5_0 = 6, GGML_ABI_Q5_1 = 7,
  GGML_ABI_Q8_0 = 8, GGML_ABI_Q8_1 = 9, GGML_ABI_Q2_K = 10, GGML_ABI_Q3_K = 11, GGML_ABI_Q4_K = 12,
  GGML_ABI_Q5_K = 13, GGML_ABI_Q6_K = 14, GGML_ABI_Q8_K = 15, GGML_ABI_IQ2_XXS = 16, GGML_ABI_IQ2_XS = 17,
  GGML_ABI_IQ3_XXS = 18, GGML_ABI_IQ1_S = 19, GGML_ABI_IQ4_NL = 20, GGML_ABI_IQ3_S = 21, GGML_ABI_IQ2_S = 22,
  GGML_ABI_IQ4_XS = 23, GGML_ABI_IQ1_M = 29, GGML_ABI_BF16 = 30, GGML_ABI_TQ1_0 = 34, GGML_ABI_TQ2_0 = 35,
  GGML_ABI_MXFP4 = 39,
};

typedef void (*ggml_to_float_t)(const void* x, float* y, int64_t k);
typedef void (*ggml_from_float_t)(const float* x, void* y, int64_t k);
typedef void (*ggml_vec_dot_t)(int n, float* s, size_t bs, const void* x, size_t bx, const void* y, size_t by,
                               int nrc);

struct ggml_type_traits {  // ggml.h
  const char* type_name;
  int64_t blck_size;
  int64_t blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  ggml_to_float_t to_float;
  ggml_from_float_t from_float_ref;
};

struct ggml_type_traits_cpu {  // ggml-cpu.h
  ggml_from_float_t from_float;
  ggml_vec_dot_t vec_dot;
  int vec_dot_type;  // enum ggml_type
  int64_t nrows;     // rows vec_dot may process at once (we always ask for one: nrc = 1 is valid for every kernel)
};

// repack.h (ggml-cpu): llama.cpp's kernels on 8 weight rows interleaved (its "repack" buffers): gemv for one
// activation row (from_float's blocks), gemm for 4 at a time (quantize_mat's 4-row interleaved blocks). s: the
// outputs (gemm: row y of the activations at s + y * bs), vx: the interleaved weights, nr: activation rows, nc: weight
// rows (a multiple of 8), n: values a row.
typedef void (*ggml_gemv_t)(int n, float* s, size_t bs, const void* vx, const void* vy, int nr, int nc);
typedef void (*ggml_quantize_mat_t)(const float* x, void* vy, int64_t k);  // 4 rows of k values
typedef int (*ggml_cpu_has_fn)(void);

// sgemm.h (ggml-cpu/llamafile): llamafile's tinyBLAS, what llama.cpp's CPU backend multiplies a prompt's rows with
// (ggml_compute_forward_mul_mat, more than one activation row) where it has a kernel for the pair of formats.
// C = Aᵀ B column-major: A the weights [m rows of k values], B the activations [n rows], C [n][ldc] (row j of the
// activations at C + j * ldc); lda / ldb in blocks, ldc in floats. Its thread share is by `ith` of `nth` in `params`,
// the CPU backend's own struct (ggml-cpu-impl.h), copied here as `ggml_compute_params_abi`: for the Q8_0 pair the
// pinned sgemm.cpp reads only ith and nth from it. Returns false where it has no kernel for the pair.
struct ggml_compute_params_abi {  // ggml-cpu-impl.h's ggml_compute_params
  int ith, nth;
  size_t wsize;
  void* wdata;
  void* threadpool;
  bool use_ref;
};
typedef bool (*ggml_sgemm_fn)(const ggml_compute_params_abi* params, int64_t m, int64_t n, int64_t k, const void* A,
                              int64_t lda, const void* B, int64_t ldb, void* C, int64_t ldc, int Atype, int Btype,
                              int Ctype);

// ggml.h / ggml-backend.h / ggml-cpu.h: a one-node graph (ggml_mul_mat) computed by the CPU backend, as llama.cpp
// computes its prompt's products (ggml_mul_mat.cpp). Only pointers to ggml's own objects are held (its context,
// tensors, graph, backend and buffers stay opaque), and `ggml_init_params` is the one struct passed by value.
struct ggml_init_params_abi {  // ggml.h's ggml_init_params
  size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
typedef void* (*ggml_init_fn)(ggml_init_params_abi params);                       // -> ggml_context*
typedef void (*ggml_free_fn)(void* ctx);
typedef size_t (*ggml_overhead_fn)(void);                                         // ggml_tensor_overhead
typedef size_t (*ggml_graph_overhead_custom_fn)(size_t size, bool grads);
typedef void* (*ggml_new_tensor_2d_fn)(void* ctx, int type, int64_t ne0, int64_t ne1);  // -> ggml_tensor*
typedef void* (*ggml_mul_mat_fn)(void* ctx, void* a, void* b);                    // -> ggml_tensor*
typedef void* (*ggml_new_graph_custom_fn)(void* ctx, size_t size, bool grads);    // -> ggml_cgraph*
typedef void (*ggml_build_forward_expand_fn)(void* graph, void* tensor);
typedef void* (*ggml_backend_cpu_init_fn)(void);                                  // -> ggml_backend_t
typedef void (*ggml_backend_cpu_set_n_threads_fn)(void* backend, int n_threads);
typedef void (*ggml_backend_free_fn)(void* backend);
typedef void* (*ggml_backend_cpu_buffer_from_ptr_fn)(void* ptr, size_t size);     // -> ggml_backend_buffer_t
typedef void (*ggml_backend_buffer_free_fn)(void* buffer);
typedef int (*ggml_backend_tensor_alloc_fn)(void* buffer, void* tensor, void* addr);     // -> enum ggml_status
typedef int (*ggml_backend_graph_compute_fn)(void* backend, void* graph);                // -> enum ggml_status
constexpr size_t GGML_ABI_TENSOR_ALIGNMENT = 32;  // ggml-impl.h's TENSOR_ALIGNMENT: where a buffer's base must start

typedef const ggml_type_traits* (*ggml_get_type_traits_fn)(int type);
typedef const ggml_type_traits_cpu* (*ggml_get_type_traits_cpu_fn)(int type);
typedef void (*ggml_cpu_init_fn)(void);
}

namespace tokentui_ggml {

// One weight format as the bound library runs it: its blocks, its conversions, its dot product and the format the
// activations are converted to for it (vec_dot_type: Q8_0 for Q4_0 / Q8_0, Q8_1 for Q4_1, Q8_K for K-quants, ...).
struct Format {
  int type;
  int64_t block;           // values a block
  int64_t type_size;       // bytes a block
  ggml_to_float_t to_float;
  ggml_from_float_t from_float_ref;
  ggml_vec_dot_t vec_dot;
  int act_type;            // vec_dot_type
  int64_t act_block;       // its values a block and bytes a block
  int64_t act_type_size;
  ggml_from_float_t act_from_float;  // the CPU backend's conversion of float32 rows to act_type
  int64_t row_bytes(int64_t k) const { return k / block * type_size; }
  int64_t act_row_bytes(int64_t k) const { return k / act_block * act_type_size; }
};

// llama.cpp's interleaved kernels for a format, where the bound library has them and llama.cpp itself would use
// them on this CPU (repack.cpp's ggml_repack_get_optimal_repack_type on x86: Q4_0 and Q4_K, 8 rows interleaved 8
// bytes at a time, with AVX2): the weights repacked once (ggml_repack.cpp), products by gemv / gemm.
struct Interleaved {
  ggml_gemv_t gemv = nullptr;
  ggml_gemv_t gemm = nullptr;
  ggml_quantize_mat_t quantize4 = nullptr;  // 4 activation rows -> gemm's interleaved blocks
};

// The interleaved kernels of ggml type `type`, or nullptr where the bound library has none for it (or none is bound).
const Interleaved* interleaved(int64_t type);

// The format of ggml type `type` from the bound library (TORCH_CHECK fails, one line, when nothing is bound or the
// library has no CPU kernel for it).
const Format& format(int64_t type);

// One product job for run_products: rows of a weight matrix times one converted activation row.
struct Job {
  const Format* format;
  const uint8_t* weights;  // [rows, row_bytes], or with `packed` the rows 8 at a time in ggml's interleaved layout
  const Interleaved* packed;  // nullptr: one vec_dot a row
  int64_t rows;
  const uint8_t* act;      // the activation row in format->act_type
  float* out;              // [rows]
};

// Every job's rows, split over torch's threads as one range (fork_rule.h's shared_for), so a layer's q, k and v (or
// gate and up) fork once; each row one vec_dot of K values, or a packed job's rows one gemv a group of 8.
void run_products(const Job* jobs, int64_t count, int64_t K);

// ggml_mul_mat.cpp: finds the CPU backend's graph functions in the library just opened (bind calls it once); false
// where the library lacks one (then `mul_mat_takes` is false for every matrix and ggml_linear.py keeps the product).
bool bind_mul_mat(void* handle);

}  // namespace tokentui_ggml
