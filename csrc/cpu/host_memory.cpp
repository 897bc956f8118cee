#include "cpu/host_memory.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <new>

namespace lk {
namespace {

std::atomic<uint64_t> g_alloc_count{0};
std::atomic<uint64_t> g_live_bytes{0};

constexpr size_t kHuge = size_t(2) << 20;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

void place_on_node(void* p, size_t bytes, int node) {
  constexpr int kMpolPreferred = 1;
  constexpr int kMaxNodes = 1024;
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {0};
  if (node < 0 || node >= kMaxNodes) return;
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  // Preferred, not bind: a full node spills instead of failing the allocation.
  (void)syscall(SYS_mbind, p, bytes, kMpolPreferred, mask, (unsigned long)kMaxNodes, 0u);
}

}  // namespace

HostBuffer::HostBuffer(size_t bytes, int node) {
  if (bytes == 0) return;
  const size_t len = round_up(bytes, bytes >= kHuge ? kHuge : size_t(4096));
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (len >= kHuge) (void)madvise(p, len, MADV_HUGEPAGE);  // best effort; THP may be off
  if (node >= 0) place_on_node(p, len, node);
  ptr_ = p;
  bytes_ = len;
  g_alloc_count.fetch_add(1, std::memory_order_relaxed);
  g_live_bytes.fetch_add(len, std::memory_order_relaxed);
}

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

bool HostBuffer::ensure(size_t bytes, int node) {
  if (bytes <= bytes_) return false;
  *this = HostBuffer(bytes, node);
  return true;
}

void HostBuffer::release() {
  if (!ptr_) return;
  munmap(ptr_, bytes_);
  g_live_bytes.fetch_sub(bytes_, std::memory_order_relaxed);
  ptr_ = nullptr;
  bytes_ = 0;
}

uint64_t alloc_count() { return g_alloc_count.load(std::memory_order_relaxed); }
uint64_t live_bytes() { return g_live_bytes.load(std::memory_order_relaxed); }

}  // namespace lk
