// The memory the ggml products read their matrices from (core/model/quant/ggml_linear.py): copies in transparent
// huge pages carved from chunks (huge_empty, also used by ggml_repack.cpp for its repacked copies), memory reserved
// ahead of a load and trimmed after it (reserve / trim_reserved), the copy of a file's matrix (resident), and the
// file's pages given back (in_file_map / release).
#include <ATen/ATen.h>
#include <sys/mman.h>
#include <torch/library.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "ggml_memory.h"

namespace tokentui_ggml {
namespace {

// A decode step reads each of its matrices once a token, whole, from memory (the model is far larger than the
// caches), so its speed is that of streaming them. Streamed from 4 KiB pages (a file's memory map, or torch's
// allocations where transparent huge pages are "madvise"), every page costs a TLB walk and the hardware prefetcher
// starts over at each page's end; from 2 MiB pages the same kernels run markedly faster (BENCHMARKS.md, "Side by
// side with llama-server": the measurements). So the matrices a step runs on are placed in anonymous memory asked to
// be backed by the kernel's transparent huge pages (madvise MADV_HUGEPAGE: a hint, plain pages where the kernel has
// none to give), carved one after another from chunks of kChunk bytes: a 1 MiB matrix mapped on its own would hold no
// whole 2 MiB page at all. A chunk is unmapped when the last tensor carved from it is freed.
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kChunk = size_t{64} << 20;
constexpr size_t kAlign = 64;  // a cache line: each matrix's first row starts on one, as torch's allocations do

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct Chunk {
  uint8_t* base = nullptr;
  size_t size = 0, used = 0;
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;
  Chunk(uint8_t* b, size_t s) : base(b), size(s) {}
  ~Chunk() { munmap(base, size); }
};

// An anonymous mapping of `size` bytes (a multiple of kHugePage) starting on a huge page's boundary: mapped a huge
// page larger, the unaligned ends unmapped.
std::shared_ptr<Chunk> new_chunk(size_t size) {
  void* p = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "resident: could not map ", size, " bytes of memory");
  const uintptr_t start = reinterpret_cast<uintptr_t>(p), aligned = round_up(start, kHugePage);
  const uintptr_t end = start + size + kHugePage;
  if (aligned > start) munmap(p, aligned - start);
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);  // EINVAL where THP is not built in: plain pages
  return std::make_shared<Chunk>(reinterpret_cast<uint8_t*>(aligned), size);
}

std::mutex arena_lock;
std::weak_ptr<Chunk> arena;  // the chunk small matrices are carved from now (gone once nothing carved from it lives)

// Memory reserved ahead of a load (`reserve`). Finding a huge page is the kernel's work when the page is first
// touched, and where memory is fragmented it compacts memory for each one: on a busy machine that took seconds for a
// 600 MB model (BENCHMARKS.md, issue 37's cold start), on the load's critical path. `reserve(bytes)` maps one chunk
// at once and touches its pages in order on a thread of its own, so that work overlaps what the process does next
// (importing transformers); `huge_empty` carves from it first, and waits for the thread to have passed what it
// carves (the thread writes a zero to each page it touches: it must never touch a page after a copy has written
// there). `trim_reserved` stops the thread, waits for it, and gives back the pages not carved.
struct Reserved {
  std::shared_ptr<Chunk> chunk;
  std::atomic<bool> stop{false};
  std::atomic<size_t> touched{0};  // bytes from the chunk's start the thread has touched (all of it once it ends)
  std::thread toucher;
  Reserved() = default;
  Reserved(const Reserved&) = delete;
  Reserved& operator=(const Reserved&) = delete;
  ~Reserved() { end(); }
  void end() {  // the thread stopped and waited for: nothing more is written
    stop = true;
    if (toucher.joinable()) toucher.join();
  }
};
std::shared_ptr<Reserved> reserved;  // guarded by arena_lock

// Wait until `r`'s thread has touched the first `end` bytes of its chunk, or has ended.
void wait_touched(const Reserved& r, size_t end) {
  while (r.touched.load(std::memory_order_acquire) < end) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

}  // namespace

// An uninitialised uint8 tensor of `sizes` in huge-page memory: carved from the reserved chunk while it has room,
// else from the current chunk (a new one where it is full or gone), or for more than a quarter of a chunk (a
// vocabulary's head) a mapping of its own.
at::Tensor huge_empty(at::IntArrayRef sizes) {
  int64_t count = 1;
  for (int64_t s : sizes) count *= s;
  const size_t bytes = round_up(static_cast<size_t>(std::max<int64_t>(count, 1)), kAlign);
  std::shared_ptr<Chunk> chunk;
  std::shared_ptr<Reserved> ahead;
  uint8_t* data = nullptr;
  {
    std::lock_guard<std::mutex> guard(arena_lock);
    if (reserved != nullptr && reserved->chunk->size - reserved->chunk->used >= bytes) {
      ahead = reserved;
      chunk = reserved->chunk;
    } else if (bytes > kChunk / 4) {
      chunk = new_chunk(round_up(bytes, kHugePage));
    } else {
      chunk = arena.lock();
      if (chunk == nullptr || chunk->size - chunk->used < bytes) arena = chunk = new_chunk(kChunk);
    }
    data = chunk->base + chunk->used;
    chunk->used += bytes;
  }
  if (ahead != nullptr) wait_touched(*ahead, static_cast<size_t>(data - chunk->base) + bytes);
  return at::from_blob(data, sizes, [chunk](void*) {}, at::TensorOptions().dtype(at::kByte));
}

namespace {

// reserve(bytes) -> the bytes reserved (`bytes` rounded up to whole huge pages; 0 where a reservation is already
// made or bytes <= 0): one chunk mapped now, its pages touched by a thread started here (above).
int64_t reserve(int64_t bytes) {
  std::lock_guard<std::mutex> guard(arena_lock);
  if (bytes <= 0 || reserved != nullptr) return 0;
  auto r = std::make_shared<Reserved>();
  r->chunk = new_chunk(round_up(static_cast<size_t>(bytes), kHugePage));
  Reserved* raw = r.get();  // the thread ends before `r` does: ~Reserved joins it
  r->toucher = std::thread([raw] {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), size = raw->chunk->size;
    volatile uint8_t* base = raw->chunk->base;
    size_t at = 0;
    for (; at < size && !raw->stop.load(std::memory_order_relaxed); at += page) {
      base[at] = 0;
      if ((at + page) % kHugePage == 0) raw->touched.store(at + page, std::memory_order_release);
    }
    raw->touched.store(size, std::memory_order_release);  // ended: nothing more is written
  });
  reserved = r;
  return static_cast<int64_t>(r->chunk->size);
}

// trim_reserved() -> bytes given back: the reservation's thread stopped and waited for, the whole huge pages past
// what was carved from its chunk unmapped, and the reservation closed (later matrices are carved as before). 0
// where none was made.
int64_t trim_reserved() {
  std::shared_ptr<Reserved> r;
  {
    std::lock_guard<std::mutex> guard(arena_lock);
    r.swap(reserved);
  }
  if (r == nullptr) return 0;
  r->end();
  Chunk& chunk = *r->chunk;
  const size_t keep = round_up(chunk.used, kHugePage);
  if (keep >= chunk.size) return 0;
  munmap(chunk.base + keep, chunk.size - keep);
  const int64_t given = static_cast<int64_t>(chunk.size - keep);
  chunk.size = keep;  // the chunk's own unmapping (its last tensor freed, or now where none was carved) covers the rest
  return given;
}

// Whether [start, end) lies inside one read-only mapping of a file (/proc/self/maps): a GGUF's memory map.
bool in_read_only_file_map(uintptr_t start, uintptr_t end) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, path;
    uint64_t inode = 0;
    in >> range >> perms >> offset >> dev >> inode >> path;
    const size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    const uintptr_t a = std::stoull(range.substr(0, dash), nullptr, 16),
                    b = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (a <= start && end <= b)
      return inode != 0 && !path.empty() && path[0] == '/' && perms.size() > 1 && perms[1] != 'w';
  }
  return false;
}

bool in_file_map(const at::Tensor& raw) {
  const auto start = reinterpret_cast<uintptr_t>(raw.data_ptr());
  return in_read_only_file_map(start, start + raw.nbytes());
}

// resident(raw) -> a copy of raw's bytes (contiguous uint8, any shape) in huge-page memory (huge_empty). Where raw
// lies in a read-only mapping of a file, it is copied a slice at a time and each slice's whole file pages are given
// back (MADV_DONTNEED, as `release` does) once copied, so a large matrix (a tied embedding and head: ~150 MiB for a
// Qwen-sized vocabulary) is never held twice, in the file's pages and in the copy: the load's peak memory.
at::Tensor resident(const at::Tensor& raw) {
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.device().is_cpu(),
              "resident: raw must be a contiguous uint8 CPU tensor");
  at::Tensor out = huge_empty(raw.sizes());
  uint8_t* dst = out.data_ptr<uint8_t>();
  const uint8_t* src = raw.data_ptr<uint8_t>();
  const size_t n = static_cast<size_t>(raw.nbytes());
  const auto start = reinterpret_cast<uintptr_t>(src);
  const bool give_back = n > 0 && in_read_only_file_map(start, start + n);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  constexpr size_t SLICE = size_t{8} << 20;
  uintptr_t given = (start + page - 1) / page * page;  // the first whole page not yet given back
  for (size_t at = 0; at < n; at += SLICE) {
    const size_t len = std::min(SLICE, n - at);
    std::memcpy(dst + at, src + at, len);
    const uintptr_t upto = (start + at + len) / page * page;  // whole pages copied so far end here
    if (give_back && upto > given && madvise(reinterpret_cast<void*>(given), upto - given, MADV_DONTNEED) == 0)
      given = upto;
  }
  return out;
}

// release(raw) -> bytes given back: raw's whole pages dropped from memory (madvise MADV_DONTNEED) where raw lies in
// a read-only mapping of a file (a GGUF's memory map, whose repacked or resident copy is what runs): they are read
// from the file again if touched. 0, and nothing done, for any other memory (dropping an anonymous or writable page
// would lose it).
int64_t release(const at::Tensor& raw) {
  const auto start = reinterpret_cast<uintptr_t>(raw.data_ptr()), end = start + raw.nbytes();
  if (!in_read_only_file_map(start, end)) return 0;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (start + page - 1) / page * page, b = end / page * page;
  if (b <= a || madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED) != 0) return 0;
  return static_cast<int64_t>(b - a);
}

}  // namespace
}  // namespace tokentui_ggml

TORCH_LIBRARY_FRAGMENT(tokentui_ggml, m) {
  m.def("release(Tensor raw) -> int", &tokentui_ggml::release);
  m.def("in_file_map(Tensor raw) -> bool", &tokentui_ggml::in_file_map);
  m.def("resident(Tensor raw) -> Tensor");
  m.def("reserve(int bytes) -> int", &tokentui_ggml::reserve);
  m.def("trim_reserved() -> int", &tokentui_ggml::trim_reserved);
}

TORCH_LIBRARY_IMPL(tokentui_ggml, CPU, m) {
  m.impl("resident", &tokentui_ggml::resident);
}
