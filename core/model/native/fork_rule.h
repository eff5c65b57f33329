// When a parallel loop of tokentui's native library splits over torch's threads: one rule for the products
// (ggml_ops.cpp, ggml_repack.cpp) and attention (step_math.h). A loop whose items hold `work` multiply-adds each runs
// on one thread under ~64K multiply-adds in all (a fork costs more than it saves there), and splits above it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tokentui_fork {

constexpr int64_t kWorkPerThread = int64_t{1} << 16;  // the multiply-adds a thread takes at least

// at::parallel_for's grain for items of `work` multiply-adds each: the items a thread takes at least.
inline int64_t grain(int64_t work) { return std::max<int64_t>(1, kWorkPerThread / std::max<int64_t>(1, work)); }

}  // namespace tokentui_fork
