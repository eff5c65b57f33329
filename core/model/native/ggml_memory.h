// ggml_memory.cpp's one function other sources use: an uninitialised uint8 tensor in huge-page memory (its comment
// there says where it is carved from).
#pragma once
#include <ATen/ATen.h>

namespace tokentui_ggml {
at::Tensor huge_empty(at::IntArrayRef sizes);
}  // namespace tokentui_ggml
