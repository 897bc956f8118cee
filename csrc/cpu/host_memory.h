// Page-aligned host buffers, optionally placed on one NUMA node (mbind, no libnuma).
//
// Every allocation the engine makes goes through here, so tests can check that
// steady-state forwards allocate nothing (alloc_count() stays constant).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lk {

class HostBuffer {
 public:
  HostBuffer() = default;
  // node < 0: no placement. Placement failure (no NUMA, EPERM in a container) is not an error:
  // the pages then land where first touched, which the engine arranges to be the owning node.
  HostBuffer(size_t bytes, int node);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  // Grow (never shrink) to at least `bytes`, discarding contents. Returns true if it reallocated.
  bool ensure(size_t bytes, int node = -1);

 private:
  void release();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

uint64_t alloc_count();  // allocations made so far by HostBuffer
uint64_t live_bytes();   // bytes currently held by HostBuffers

}  // namespace lk
