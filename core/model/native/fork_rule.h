// When a parallel loop of tokentui's native library splits over torch's threads, and how: one rule for the products
// (ggml_ops.cpp, ggml_repack.cpp, q4_kernels.h, i16_kernels.h: `shared_for`) and attention (step_math.h). A loop
// whose items hold `work` multiply-adds each runs on one thread under ~64K multiply-adds in all (a fork costs more
// than it saves there), and splits above it.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace tokentui_fork {

constexpr int64_t kWorkPerThread = int64_t{1} << 16;  // the multiply-adds a thread takes at least

// at::parallel_for's grain for items of `work` multiply-adds each: the items a thread takes at least.
inline int64_t grain(int64_t work) { return std::max<int64_t>(1, kWorkPerThread / std::max<int64_t>(1, work)); }

// The chunks a thread's share is cut into (`shared_for`): the unit a thread done with its own share takes from
// another's (BENCHMARKS.md, "Each thread its own rows, the rest shared").
constexpr int64_t kChunksPerShare = 16;

// fn(b, e) over [begin, end) on torch's threads: each thread takes its own contiguous share (as at::parallel_for
// would split the range) front to back, a chunk at a time (chunks: whole multiples of `align` items, at least
// `grain`), and a thread done with its own share takes chunks from the back of the others' until none is left.
// Each thread so reads one run of rows in order, as with fixed shares, the hardware prefetcher's best case (chunks
// handed out in turn, interleaving the threads' rows, lost a quarter of Q4_0's layer time at 2 threads on a 2-core
// EPYC); and the threads still finish together where they run at different speeds (a 2-vCPU Xeon whose two
// vCPUs ran ggml's Q4_0 kernel 1.5x apart; another busy process on one of the cores), as ggml's threadpool hands
// out chunks. One thread, or a range too small to fork, runs as at::parallel_for does.
//
// Hand-written: at::parallel_for has fixed shares only, and OpenMP's dynamic / guided schedules hand chunks out in
// turn. Each share is one 64-bit word (next item << 32 | end, relative to `begin`) that its owner advances from the
// front and other threads pull in from the back, both by compare-and-swap, so no item is run twice or skipped.
template <class F>
void shared_for(int64_t begin, int64_t end, int64_t grain, int64_t align, const F& fn) {
  const int64_t total = end - begin;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), total / std::max<int64_t>(1, grain));
  if (threads < 2 || at::in_parallel_region() || total >= (int64_t{1} << 32)) {
    at::parallel_for(begin, end, grain, fn);
    return;
  }
  const auto up = [align](int64_t n) { return (n + align - 1) / align * align; };
  const auto down = [align](int64_t n) { return n / align * align; };
  const int64_t per = up((total + threads - 1) / threads);  // a share
  const int64_t chunk = up(std::max<int64_t>(grain, per / kChunksPerShare));
  struct alignas(64) Share {  // a cache line each: the owner's and the others' updates do not share one
    std::atomic<uint64_t> span;
  };
  std::vector<Share> shares(static_cast<size_t>(threads));
  for (int64_t t = 0; t < threads; ++t)
    shares[t].span.store(static_cast<uint64_t>(std::min(total, t * per)) << 32 |
                             static_cast<uint64_t>(std::min(total, (t + 1) * per)),
                         std::memory_order_relaxed);
  const auto take = [&](std::atomic<uint64_t>& span, bool front) {  // chunks of one share until it is empty
    uint64_t s = span.load(std::memory_order_relaxed);
    while (true) {
      const int64_t lo = static_cast<int64_t>(s >> 32), hi = static_cast<int64_t>(s & 0xffffffffu);
      if (lo >= hi) return;
      // (a share starts on a multiple of `align` and each chunk is one: every range starts on one, the last
      // share's end, the range's, being the one end that may not be)
      const int64_t b = front ? lo : std::max(lo, down(hi - chunk)), e = front ? std::min(hi, lo + chunk) : hi;
      const uint64_t rest = front ? static_cast<uint64_t>(e) << 32 | static_cast<uint64_t>(hi)
                                  : static_cast<uint64_t>(lo) << 32 | static_cast<uint64_t>(b);
      if (span.compare_exchange_weak(s, rest, std::memory_order_acq_rel, std::memory_order_relaxed)) {
        fn(begin + b, begin + e);
        s = span.load(std::memory_order_relaxed);
      }
    }
  };
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) take(shares[t].span, true);
    for (int64_t k = 1; k < threads; ++k) take(shares[(t0 + k) % threads].span, false);
  });
}

}  // namespace tokentui_fork
