// Datatype tables and Tensor construction.
#include "sluice/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

namespace sluice {
namespace {

struct DataTypeInfo {
  DataType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DataTypeInfo, 10> kDataTypes = {{
    {DataType::kBool, "BOOL", 1},
    {DataType::kUInt8, "UINT8", 1},
    {DataType::kInt8, "INT8", 1},
    {DataType::kInt16, "INT16", 2},
    {DataType::kInt32, "INT32", 4},
    {DataType::kInt64, "INT64", 8},
    {DataType::kFp16, "FP16", 2},
    {DataType::kBf16, "BF16", 2},
    {DataType::kFp32, "FP32", 4},
    {DataType::kFp64, "FP64", 8},
}};

const DataTypeInfo& Info(DataType dtype) { return kDataTypes[static_cast<size_t>(dtype)]; }

}  // namespace

size_t DataTypeSize(DataType dtype) { return Info(dtype).size; }
std::string_view DataTypeName(DataType dtype) { return Info(dtype).name; }

std::optional<DataType> ParseDataType(std::string_view name) {
  for (const auto& info : kDataTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<int64_t> ElementCount(const Shape& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (dim != 0 && count > std::numeric_limits<int64_t>::max() / dim) return std::nullopt;
    count *= dim;
  }
  return count;
}

std::string ShapeToString(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

Tensor Tensor::Zeros(DataType dtype, Shape shape) {
  Tensor t = Uninitialized(dtype, std::move(shape));
  std::memset(t.data_, 0, t.byte_size());
  return t;
}

Tensor Tensor::Uninitialized(DataType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.element_count_ = ElementCount(shape).value_or(0);
  t.shape_ = std::move(shape);
  // 64-byte alignment suits SIMD kernels and pinned-copy engines alike.
  size_t bytes = (std::max<size_t>(t.byte_size(), 1) + 63) / 64 * 64;
  void* data = std::aligned_alloc(64, bytes);
  if (data == nullptr) throw std::bad_alloc();
  t.owner_ =
      std::shared_ptr<const void>(data, [](const void* p) { std::free(const_cast<void*>(p)); });
  t.data_ = data;
  return t;
}

Tensor Tensor::Wrap(DataType dtype, Shape shape, std::shared_ptr<const void> owner, void* data) {
  Tensor t;
  t.dtype_ = dtype;
  t.element_count_ = ElementCount(shape).value_or(0);
  t.shape_ = std::move(shape);
  t.owner_ = std::move(owner);
  t.data_ = data;
  return t;
}

Tensor Tensor::Reshaped(Shape shape) const {
  assert(ElementCount(shape).value_or(-1) == element_count_);
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::SliceRows(int64_t begin, int64_t count) const {
  assert(!shape_.empty() && begin >= 0 && count >= 0 && begin + count <= shape_[0]);
  Tensor t;
  t.dtype_ = dtype_;
  t.shape_ = shape_;
  t.shape_[0] = count;
  t.element_count_ = ElementCount(t.shape_).value_or(0);
  const size_t row_bytes = shape_[0] == 0 ? 0 : byte_size() / static_cast<size_t>(shape_[0]);
  t.owner_ = owner_;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin) * row_bytes;
  return t;
}

}  // namespace sluice
