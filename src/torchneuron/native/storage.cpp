// Storages, and the host memory PyTorch calls pinned. FSDP2 frees and re-allocates parameters with
// untyped_storage().resize_(0)/resize_(n), DDP and FSDP compare data_ptr()s, and every view of a storage
// must report the same one. A wrapper tensor made in Python gets a data-less storage of its own ("an
// invalid python storage"); these storages are shared by all views of one neuron Storage, resize through
// the hooks, and carry a data pointer that identifies them. The device buffer itself stays a PJRT buffer
// held by the Python Storage.
// Ownership: a native storage owns its Python Storage (one strong reference, its data pointer's
// context), as a CUDA storage owns its memory, so `s = t.untyped_storage()` keeps the bytes after `t` is
// freed. The Python Storage refers to its native storage only weakly (no cycle: `del t` frees the bytes at
// once), and makes a new one when a tensor needs it after every native holder has gone.
// Pinned memory: PJRT stages host transfers itself, so pinned blocks are ordinary host memory, but
// PyTorch allocates them through the hooks (DDP's reducer, pin_memory(), DataLoader) and then asks
// isPinnedPtr about them, so the allocator remembers its blocks.
#include "native.h"

#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/utils/pybind.h>

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

void* new_address(size_t nbytes, c10::DeviceIndex index) {
  if (nbytes == 0) {
    return nullptr;  // as CUDA's empty storages
  }
  auto rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  auto offset = next_address.fetch_add(rounded);
  return reinterpret_cast<void*>(kBase | (uintptr_t(index) << kDeviceShift) | offset);
}

// a storage PyTorch allocates itself (torch.UntypedStorage(n, device="neuron")) has no Python Storage
// until a tensor views it (`adopt`)
void no_owner(void*) {}

bool interpreter_running() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

void release_owner(void* owner) {
  if (!interpreter_running()) {
    return;  // the interpreter is going, and its objects with it
  }
  py::gil_scoped_acquire gil;
  Py_DECREF(static_cast<PyObject*>(owner));
}

c10::DataPtr owned_data_ptr(void* address, py::handle owner, c10::DeviceIndex index) {
  return c10::DataPtr(address, owner.inc_ref().ptr(), &release_owner, c10::Device(kNeuron, index));
}

struct NeuronAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    auto index = current_device();
    return c10::DataPtr(new_address(nbytes, index), nullptr, &no_owner, c10::Device(kNeuron, index));
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &no_owner;
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

// The Python Storage's attributes read and kept here, by interned name: `native`, a capsule holding a weak
// reference to its native storage (None: none), released with the capsule; `address`, its data pointer
// (None until one is given); `nbytes` and `device_index`.
struct Names {
  PyObject* native = PyUnicode_InternFromString("native");
  PyObject* address = PyUnicode_InternFromString("address");
  PyObject* nbytes = PyUnicode_InternFromString("nbytes");
  PyObject* device_index = PyUnicode_InternFromString("device_index");
};

const Names& names() {
  static const Names instance;
  return instance;
}

py::object get(py::handle owner, PyObject* name) {
  auto* value = PyObject_GetAttr(owner.ptr(), name);
  if (value == nullptr) {
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(value);
}

void set(py::handle owner, PyObject* name, py::object value) {
  if (PyObject_SetAttr(owner.ptr(), name, value.ptr()) != 0) {
    throw py::error_already_set();
  }
}

void set_address(py::handle owner, void* address) {
  set(owner, names().address, py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(address)));
}

c10::DeviceIndex device_index_of(py::handle owner) {
  return static_cast<c10::DeviceIndex>(PyLong_AsLong(get(owner, names().device_index).ptr()));
}

size_t nbytes_of(py::handle owner) {
  return PyLong_AsSize_t(get(owner, names().nbytes).ptr());
}

void release_weak(PyObject* capsule) {
  c10::raw::weak_intrusive_ptr::decref(static_cast<c10::StorageImpl*>(PyCapsule_GetPointer(capsule, nullptr)));
}

void refer_weakly(py::handle owner, c10::StorageImpl* impl) {
  auto* weak = c10::raw::intrusive_ptr::make_weak(impl);
  set(owner, names().native, py::reinterpret_steal<py::object>(PyCapsule_New(weak, nullptr, &release_weak)));
}

// the native storage the Storage refers to, if one still lives
c10::intrusive_ptr<c10::StorageImpl> living_native(py::handle owner) {
  auto capsule = get(owner, names().native);
  if (capsule.is_none()) {
    return {};
  }
  auto* weak = static_cast<c10::StorageImpl*>(PyCapsule_GetPointer(capsule.ptr(), nullptr));
  return c10::intrusive_ptr<c10::StorageImpl>::reclaim(c10::raw::weak_intrusive_ptr::lock(weak));
}

} // namespace

c10::Allocator* host_pinned_allocator() {
  return &pinned_allocator;
}

bool is_pinned_pointer(const void* pointer) {
  std::lock_guard<std::mutex> lock(pinned_mutex);
  return pinned_blocks.count(pointer) != 0;
}

void register_allocator() {
  c10::SetAllocator(kNeuron, &allocator);
}

c10::DeviceIndex device_of_pointer(const void* pointer) {
  auto address = reinterpret_cast<uintptr_t>(pointer);
  TORCH_CHECK((address & kBase) != 0, "not a neuron data pointer: ", pointer);
  return static_cast<c10::DeviceIndex>((address & ~kBase) >> kDeviceShift);
}

namespace {

// the Storage's data pointer, given one now (for `nbytes` on device `index`) if it has none
void* address_or_new(py::handle owner, size_t nbytes, c10::DeviceIndex index) {
  auto given = get(owner, names().address);
  if (!given.is_none()) {
    return PyLong_AsVoidPtr(given.ptr());
  }
  auto* address = new_address(nbytes, index);
  set_address(owner, address);
  return address;
}

} // namespace

void* storage_address(py::handle owner) {
  return address_or_new(owner, nbytes_of(owner), device_index_of(owner));
}

c10::Storage native_storage(py::handle owner) {
  if (auto impl = living_native(owner)) {
    return c10::Storage(std::move(impl));
  }
  // every op's output takes this path once: each attribute is read once
  auto nbytes = nbytes_of(owner);
  auto index = device_index_of(owner);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       owned_data_ptr(address_or_new(owner, nbytes, index), owner, index), &allocator,
                       /*resizable=*/true);
  refer_weakly(owner, storage.unsafeGetStorageImpl());
  return storage;
}

py::object owner_of(const c10::Storage& storage) {
  if (storage.data_ptr().get_deleter() != &release_owner) {
    return py::none();
  }
  return py::reinterpret_borrow<py::object>(static_cast<PyObject*>(storage.data_ptr().get_context()));
}

void adopt(const c10::Storage& storage, py::handle owner) {
  TORCH_CHECK(storage.data_ptr().get_deleter() == &no_owner, "this neuron storage already has a Storage");
  auto* impl = storage.unsafeGetStorageImpl();
  auto* address = impl->data_ptr().get();
  impl->set_data_ptr_noswap(owned_data_ptr(address, owner, storage.device().index()));
  set_address(owner, address);
  refer_weakly(owner, impl);
}

void resize_storage(const c10::Storage& storage, size_t nbytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  py::gil_scoped_acquire gil;
  // Python resizes the buffer, then calls set_storage_nbytes: every resize, this one or a tensor's
  // resize_, goes through the Python storage
  py::reinterpret_borrow<py::object>(static_cast<PyObject*>(callbacks().resize))(storage, nbytes);
}

void set_storage_nbytes(py::handle owner, size_t nbytes) {
  // a new address, as CUDA's reallocation gives
  auto* address = new_address(nbytes, device_index_of(owner));
  set_address(owner, address);
  if (auto impl = living_native(owner)) {
    impl->set_data_ptr_noswap(owned_data_ptr(address, owner, impl->device().index()));
    impl->set_nbytes(nbytes);
  }
}

} // namespace torchneuron
