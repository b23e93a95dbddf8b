// Sluice's own tensor type: a typed, shaped, contiguous buffer with shared ownership.
//
// Tensors cross module boundaries in this form so that only the backends include torch headers.
// A tensor can wrap memory owned by something else (a decoded body, a torch tensor) without a
// copy: the owner is kept alive for as long as any copy of the Tensor exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

// The numeric datatypes of the KServe v2 protocol that libtorch can hold.
enum class DataType { kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFp16, kBf16, kFp32, kFp64 };

using Shape = std::vector<int64_t>;

// Bytes per element.
size_t DataTypeSize(DataType dtype);
// KServe v2 name: "BOOL", "UINT8", ..., "FP32".
std::string_view DataTypeName(DataType dtype);
// Inverse of DataTypeName(); nullopt for names Sluice does not support.
std::optional<DataType> ParseDataType(std::string_view name);

// Product of the dimensions; nullopt when a dimension is negative or the product overflows.
std::optional<int64_t> ElementCount(const Shape& shape);
// "[32, 3, 224, 224]".
std::string ShapeToString(const Shape& shape);

// Thread-compatible. Copies share the buffer (shallow); the buffer is immutable once shared
// unless the holder knows it is the only one.
class Tensor {
 public:
  Tensor() = default;

  // Allocates zero-filled storage for `shape` (which must have non-negative dims).
  static Tensor Zeros(DataType dtype, Shape shape);
  // Allocates storage for `shape` without clearing it, for buffers about to be overwritten.
  static Tensor Uninitialized(DataType dtype, Shape shape);
  // Wraps `data` without copying; `owner` keeps it alive. `data` must hold the full shape.
  static Tensor Wrap(DataType dtype, Shape shape, std::shared_ptr<const void> owner, void* data);

  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t element_count() const { return element_count_; }
  size_t byte_size() const { return static_cast<size_t>(element_count_) * DataTypeSize(dtype_); }
  bool empty() const { return data_ == nullptr; }

  // Rows [begin, begin + count) of the leading dimension, sharing this tensor's buffer (no copy).
  // Requires a tensor of rank >= 1 and 0 <= begin <= begin + count <= shape()[0].
  Tensor SliceRows(int64_t begin, int64_t count) const;

  // The same buffer under another shape with the same element count (no copy).
  Tensor Reshaped(Shape shape) const;

  const void* data() const { return data_; }
  void* mutable_data() { return data_; }

  template <typename T>
  std::span<const T> values() const {
    return {static_cast<const T*>(data_), static_cast<size_t>(element_count_)};
  }
  template <typename T>
  std::span<T> mutable_values() {
    return {static_cast<T*>(data_), static_cast<size_t>(element_count_)};
  }

 private:
  DataType dtype_ = DataType::kFp32;
  Shape shape_;
  int64_t element_count_ = 0;
  std::shared_ptr<const void> owner_;
  void* data_ = nullptr;
};

}  // namespace sluice
