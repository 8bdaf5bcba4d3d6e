// The native boundary of TorchNeuron: what PyTorch asks of a device in C++ and a Python backend
// cannot provide through torch._C._acc (a device guard with indices, device generators, storages
// that resize). Everything else -- lowerings, dispatch, compile -- stays in Python; the few facts
// only Python knows (the device count, how to wait for the device, a storage's buffer) are asked
// of Python through the callbacks installed by `install`.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>
#include <torch/csrc/utils/pybind.h>

namespace torchneuron {

namespace py = pybind11;

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// guard.cpp: the per-thread current device, as CUDA keeps it, and the device count from Python
c10::DeviceIndex device_count() noexcept;
c10::DeviceIndex current_device() noexcept;
void set_current_device(c10::DeviceIndex index) noexcept;
// where threads that never set a device start: 0, or a rank's own device once processes share a node
void set_default_device(c10::DeviceIndex index) noexcept;
void check_device_index(c10::DeviceIndex index);
void synchronize_device(c10::DeviceIndex index);
bool device_ready(c10::DeviceIndex index);
// the dtypes a neuron tensor can hold (torch.accelerator.get_device_capability), given by Python at install
void set_supported_dtypes(const std::vector<c10::ScalarType>& dtypes);

// generator.cpp: Philox-shaped (seed, offset) generators, one default per device
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
std::pair<uint64_t, uint64_t> next_seed_offset(const at::Generator& generator, uint64_t increment);

// storage.cpp: storages whose data pointers are addresses no host memory uses, encoding the device, each
// owning its Python Storage (`owner`), which refers to it weakly
c10::Storage native_storage(py::handle owner);  // the living one, or a new one
void* storage_address(py::handle owner);
py::object owner_of(const c10::Storage& storage);  // None for one PyTorch allocated, not yet adopted
// the device's allocator, for storages PyTorch allocates itself, which then have no Python Storage
void register_allocator();
void adopt(const c10::Storage& storage, py::handle owner);
c10::DeviceIndex device_of_pointer(const void* pointer);
void resize_storage(const c10::Storage& storage, size_t nbytes);
void set_storage_nbytes(py::handle owner, size_t nbytes);
c10::Allocator* host_pinned_allocator();
bool is_pinned_pointer(const void* pointer);

// graph.cpp: torch.accelerator.Graph's implementation for neuron, where PyTorch has the interface
void register_graph_implementation();

// module.cpp: the Python callbacks, each called with the GIL held
struct Callbacks {
  void* device_count = nullptr;  // () -> int
  void* synchronize = nullptr;   // (index) -> None
  void* ready = nullptr;         // (index) -> bool
  void* resize = nullptr;        // (torch.UntypedStorage, nbytes) -> None
  void* new_graph = nullptr;     // () -> torch.neuron.NeuronGraph
};
Callbacks& callbacks();

} // namespace torchneuron
