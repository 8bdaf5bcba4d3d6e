// Storages, and the host memory PyTorch calls pinned. FSDP2 frees and re-allocates parameters with untyped_storage().resize_(0)/resize_(n),
// DDP and FSDP compare data_ptr()s, and every view of a storage must report the same one. A wrapper
// tensor made in Python gets a data-less storage of its own ("an invalid python storage"); these
// storages are shared by all views of one neuron Storage, resize through the hooks, and carry a data
// pointer that identifies them. The device buffer itself stays a PJRT buffer held by Python.
// Pinned memory: PJRT stages host transfers itself, so pinned blocks are ordinary host memory, but
// PyTorch allocates them through the hooks (DDP's reducer, pin_memory(), DataLoader) and then asks
// isPinnedPtr about them, so the allocator remembers its blocks.
#include "native.h"

#include <c10/core/impl/alloc_cpu.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace py = pybind11;

namespace torchneuron {
namespace {

// Far above any user-space address (x86-64 and arm64 stop at 2^57), so a neuron pointer never equals
// a host one; the device index sits in bits 52-59, and addresses are never reused.
constexpr uintptr_t kBase = uintptr_t(1) << 60;
constexpr int kDeviceShift = 52;
constexpr uintptr_t kAlignment = 512;
std::atomic<uintptr_t> next_address{0};

void no_delete(void*) {}
// a storage PyTorch allocates itself (torch.UntypedStorage(n, device="neuron")) has no Python Storage yet;
// its data pointer's deleter, another no-op, says so
void allocated_by_pytorch_delete(void*) {}

c10::DataPtr virtual_data_ptr(size_t nbytes, c10::DeviceIndex index, c10::DeleterFnPtr deleter) {
  c10::Device device(kNeuron, index);
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, nullptr, deleter, device);
  }
  auto rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  auto offset = next_address.fetch_add(rounded);
  auto* address = reinterpret_cast<void*>(kBase | (uintptr_t(index) << kDeviceShift) | offset);
  return c10::DataPtr(address, nullptr, deleter, device);
}

struct NeuronAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    return virtual_data_ptr(nbytes, current_device(), &allocated_by_pytorch_delete);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &no_delete;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "neuron storages hold no host data; copy tensors instead");
  }
};

NeuronAllocator allocator;

std::mutex pinned_mutex;
std::unordered_set<const void*> pinned_blocks;

void free_pinned(void* block) {
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned_blocks.erase(block);
  }
  c10::free_cpu(block);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* block = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (block != nullptr) {
      std::lock_guard<std::mutex> lock(pinned_mutex);
      pinned_blocks.insert(block);
    }
    return c10::DataPtr(block, block, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

PinnedAllocator pinned_allocator;

} // namespace

c10::Allocator* host_pinned_allocator() {
  return &pinned_allocator;
}

bool is_pinned_pointer(const void* pointer) {
  std::lock_guard<std::mutex> lock(pinned_mutex);
  return pinned_blocks.count(pointer) != 0;
}

c10::DataPtr virtual_data_ptr(size_t nbytes, c10::DeviceIndex index) {
  return virtual_data_ptr(nbytes, index, &no_delete);
}

void register_allocator() {
  c10::SetAllocator(kNeuron, &allocator);
}

bool allocated_by_pytorch(const c10::Storage& storage) {
  return storage.data_ptr().get_deleter() == &allocated_by_pytorch_delete;
}

c10::DeviceIndex device_of_pointer(const void* pointer) {
  auto address = reinterpret_cast<uintptr_t>(pointer);
  TORCH_CHECK((address & kBase) != 0, "not a neuron data pointer: ", pointer);
  return static_cast<c10::DeviceIndex>((address & ~kBase) >> kDeviceShift);
}

c10::Storage new_storage(size_t nbytes, c10::DeviceIndex index) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, virtual_data_ptr(nbytes, index), &allocator,
                      /*resizable=*/true);
}

void resize_storage(const c10::Storage& storage, size_t nbytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  py::gil_scoped_acquire gil;
  // Python resizes the buffer, then calls set_storage_nbytes: every resize, this one or a tensor's
  // resize_, goes through the Python storage
  py::reinterpret_borrow<py::object>(static_cast<PyObject*>(callbacks().resize))(
      reinterpret_cast<uintptr_t>(impl), nbytes);
}

void set_storage_nbytes(const c10::Storage& storage, size_t nbytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(virtual_data_ptr(nbytes, storage.device().index()));
  impl->set_nbytes(nbytes);
}

} // namespace torchneuron
