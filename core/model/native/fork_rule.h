// When a parallel loop of tokentui's native library splits over torch's threads: one rule for the products
// (ggml_ops.cpp, ggml_repack.cpp) and attention (step_math.h). A loop whose items hold `work` multiply-adds each runs
// on one thread under ~64K multiply-adds in all (a fork costs more than it saves there), and splits above it.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace tokentui_fork {

constexpr int64_t kWorkPerThread = int64_t{1} << 16;  // the multiply-adds a thread takes at least

// at::parallel_for's grain for items of `work` multiply-adds each: the items a thread takes at least.
inline int64_t grain(int64_t work) { return std::max<int64_t>(1, kWorkPerThread / std::max<int64_t>(1, work)); }

// The chunks a thread's share is cut into when rows are taken in turn (`in_turn_for`): 32 against 4, 16 and one
// fixed share a thread in BENCHMARKS.md, "Rows taken in turn".
constexpr int64_t kChunksPerThread = 32;

// fn(b, e) over [begin, end) on torch's threads, as at::parallel_for with `grain` would fork it, but cut into chunks
// (whole multiples of `align` items, at least `grain`) that each thread takes in turn as it finishes the last, rather
// than one fixed share a thread: the threads finish together even where they run at different speeds (as ggml's
// threadpool hands out its chunks). One thread, or a range too small to fork, runs as at::parallel_for does.
template <class F>
void in_turn_for(int64_t begin, int64_t end, int64_t grain, int64_t align, const F& fn) {
  const int64_t total = end - begin;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), total / std::max<int64_t>(1, grain));
  if (threads < 2 || at::in_parallel_region()) {
    at::parallel_for(begin, end, grain, fn);
    return;
  }
  int64_t size = std::max<int64_t>(grain, (total + kChunksPerThread * threads - 1) / (kChunksPerThread * threads));
  size = (size + align - 1) / align * align;
  const int64_t chunks = (total + size - 1) / size;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1))
      fn(begin + c * size, std::min(end, begin + (c + 1) * size));
  });
}

}  // namespace tokentui_fork
