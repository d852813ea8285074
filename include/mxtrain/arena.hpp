#pragma once
// One allocation for all activations, planned from the config before step 1 (no allocation in the step).
// Slots register the Tensor they will fill; finalize() allocates once and points every slot into it.
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

#include "mxtrain/tensor.hpp"

namespace mxt {

class Ops;

class Arena {
 public:
  struct Entry {
    std::string name;
    Tensor* slot;
    size_t offset, bytes;
  };
  // The slot's address must stay valid until finalize().
  void add(Tensor& slot, const std::string& name, DType t, std::initializer_list<int64_t> dims);
  void finalize(Ops& ops);
  ~Arena();
  size_t total_bytes() const { return total_; }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
  size_t total_ = 0;
  Ops* ops_ = nullptr;
  void* base_ = nullptr;
};

}  // namespace mxt
