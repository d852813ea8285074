#include "mxtrain/arena.hpp"

#include "mxtrain/ops.hpp"

namespace mxt {

void Arena::add(Tensor& slot, const std::string& name, DType t, std::initializer_list<int64_t> dims) {
  slot = Tensor(nullptr, t, dims);
  const size_t bytes = slot.bytes();
  entries_.push_back({name, &slot, total_, bytes});
  total_ += (bytes + 255) / 256 * 256;  // keep every buffer 256-byte aligned for vector loads
}

void Arena::finalize(Ops& ops) {
  ops_ = &ops;
  base_ = ops.alloc(total_ ? total_ : 256);
  for (auto& e : entries_) {
    e.slot->data = static_cast<char*>(base_) + e.offset;
    e.slot->device = ops.device();
  }
}

Arena::~Arena() {
  if (ops_ && base_) ops_->release(base_);
}

}  // namespace mxt
