// Span: a view of `size` consecutive elements someone else owns (C++20's std::span, which C++17
// lacks). Cheap to copy; valid while the viewed storage is.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

namespace kuiper {

template <typename T>
class Span {
 public:
  Span() = default;
  Span(T* data, size_t size) : data_(data), size_(size) {}
  // From a vector: Span<const int> of a std::vector<int>, Span<int> of a mutable one.
  template <typename V, typename = std::enable_if_t<std::is_convertible_v<
                            decltype(std::declval<V&>().data()), T*>>>
  Span(V& v) : data_(v.data()), size_(v.size()) {}  // NOLINT: implicit, as std::span's

  T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) const { return data_[i]; }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kuiper
