// GGUF matrices repacked into ggml's 8-row interleaved layout and multiplied by llama.cpp's interleaved kernels
// (torch.ops.tokentui_ggml.repack / unpack / packed_product / packed_types), and the memory the decode step's matrices
// live in (resident / in_file_map / release: a copy in huge pages, the file's pages given back); core/model/quant/
// ggml_linear.py uses them, core/model/native/ggml_step.cpp runs the packed matrices' gemv.
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
#include <sys/mman.h>
#include <unistd.h>
#include <torch/library.h>

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
#include <vector>

#include "ggml_abi.h"

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

// ------------------------------------------------------------------------------------- memory in huge pages
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
  ~Reserved() {
    stop = true;
    if (toucher.joinable()) toucher.join();
  }
};
std::shared_ptr<Reserved> reserved;  // guarded by arena_lock

// Wait until `r`'s thread has touched the first `end` bytes of its chunk, or has ended.
void wait_touched(const Reserved& r, size_t end) {
  while (r.touched.load(std::memory_order_acquire) < end) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

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
  r->stop = true;
  if (r->toucher.joinable()) r->toucher.join();
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
// rows split over torch's threads in groups of 8.
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
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, 8 * K * M));
  at::parallel_for(0, N / 8, grain, [&](int64_t g0, int64_t g1) {
    const int nc = static_cast<int>((g1 - g0) * 8);
    const uint8_t* vx = w + g0 * 8 * rb;
    if (M4 > 0) kernels.gemm(static_cast<int>(K), o + g0 * 8, N, vx, act.data(), static_cast<int>(M4), nc);
    for (int64_t m = M4; m < M; ++m)
      kernels.gemv(static_cast<int>(K), o + m * N + g0 * 8, 0, vx, act.data() + m * ab, 1, nc);
  });
  return out;
}

std::vector<int64_t> packed_types() {
  std::vector<int64_t> out;
  for (int type : {GGML_ABI_Q4_0, GGML_ABI_Q4_K})
    if (interleaved(type) != nullptr) out.push_back(type);
  return out;
}

// release(raw) -> bytes given back: raw's whole pages dropped from memory (madvise MADV_DONTNEED) where raw lies in
// a read-only mapping of a file (a GGUF's memory map, whose repacked or resident copy is what runs): they are read from the file
// again if touched. 0, and nothing done, for any other memory (dropping an anonymous or writable page would lose it).
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
  m.def("packed_types() -> int[]", &tokentui_ggml::packed_types);
  m.def("repack(Tensor raw, int type, int K, bool huge=False) -> Tensor");
  m.def("unpack(Tensor packed, int type, int K) -> Tensor");
  m.def("packed_product(Tensor x, Tensor packed, int type, int K) -> Tensor");
  m.def("release(Tensor raw) -> int", &tokentui_ggml::release);
  m.def("in_file_map(Tensor raw) -> bool", &tokentui_ggml::in_file_map);
  m.def("resident(Tensor raw) -> Tensor");
  m.def("reserve(int bytes) -> int", &tokentui_ggml::reserve);
  m.def("trim_reserved() -> int", &tokentui_ggml::trim_reserved);
}

TORCH_LIBRARY_IMPL(tokentui_ggml, CPU, m) {
  m.impl("repack", &tokentui_ggml::repack);
  m.impl("unpack", &tokentui_ggml::unpack);
  m.impl("packed_product", &tokentui_ggml::packed_product);
  m.impl("resident", &tokentui_ggml::resident);
}
