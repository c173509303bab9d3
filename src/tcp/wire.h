#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

// Little-endian field encoding for the TCP protocol, independent of the host byte order.
// On little-endian hosts a field is one memcpy (one load or store): headers are encoded
// and parsed once per frame, so the byte loop showed in profiles of small batches.
namespace dlslime::tcp {

class WireWriter {
 public:
  explicit WireWriter(uint8_t* out) : p_(out) {}
  void u8(uint8_t v) { *p_++ = v; }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void i32(int32_t v) { put(static_cast<uint32_t>(v), 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(const void* src, size_t n) {
    std::memcpy(p_, src, n);
    p_ += n;
  }
  uint8_t* pos() const { return p_; }

 private:
  void put(uint64_t v, int n) {
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(p_, &v, static_cast<size_t>(n));
      p_ += n;
    } else {
      for (int i = 0; i < n; ++i) *p_++ = static_cast<uint8_t>(v >> (8 * i));
    }
  }
  uint8_t* p_;
};

class WireReader {
 public:
  explicit WireReader(const uint8_t* in) : p_(in) {}
  uint8_t u8() { return *p_++; }
  uint16_t u16() { return static_cast<uint16_t>(get(2)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  int32_t i32() { return static_cast<int32_t>(static_cast<uint32_t>(get(4))); }
  uint64_t u64() { return get(8); }
  void bytes(void* dst, size_t n) {
    std::memcpy(dst, p_, n);
    p_ += n;
  }

 private:
  uint64_t get(int n) {
    uint64_t v = 0;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&v, p_, static_cast<size_t>(n));
      p_ += n;
    } else {
      for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(*p_++) << (8 * i);
    }
    return v;
  }
  const uint8_t* p_;
};

}  // namespace dlslime::tcp
