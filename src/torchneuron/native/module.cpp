// The hooks PyTorch asks a device for (generators, storage resizing, device count and current
// device for torch.accelerator), registered in place of torch._C._acc's Python hooks, which cannot
// provide generators or resizing; and the Python module `torchneuron.native._C`.
#include "native.h"
#include <c10/core/Allocator.h>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace torchneuron {
namespace {

struct NeuronHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return true;
  }
  void init() const override {}
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    return at::Device(kNeuron, device_of_pointer(data));
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned_pointer(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return host_pinned_allocator();
  }
  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_device_index(device);
    set_current_device(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto previous = current_device();
    setCurrentDevice(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    auto previous = current_device();
    set_current_device(device);
    return previous;
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage(storage, newsize);
  }
};

// the callbacks live as long as the process: PyTorch may call them during interpreter shutdown
PyObject* keep(const py::object& callback) {
  return callback.inc_ref().ptr();
}

void install(const py::object& device_count_fn, const py::object& synchronize_fn, const py::object& ready_fn,
             const py::object& resize_fn, const py::object& new_graph_fn,
             const std::vector<c10::ScalarType>& supported_dtypes) {
  static bool installed = false;
  TORCH_CHECK(!installed, "torchneuron's native hooks are already installed");
  auto& c = callbacks();
  c.device_count = keep(device_count_fn);
  c.synchronize = keep(synchronize_fn);
  c.ready = keep(ready_fn);
  c.resize = keep(resize_fn);
  c.new_graph = keep(new_graph_fn);
  set_supported_dtypes(supported_dtypes);
  at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
  register_allocator();
  register_graph_implementation();  // after the backend's rename: its name is the registry's key
  installed = true;
}

} // namespace

Callbacks& callbacks() {
  static Callbacks instance;
  return instance;
}

} // namespace torchneuron

PYBIND11_MODULE(_C, m) {
  using namespace torchneuron;
  m.doc() = "TorchNeuron's native boundary: device guard, hooks, generators, storages";
  m.def("install", &install);
  m.def("device_count", [] { return device_count(); });
  m.def("current_device", [] { return current_device(); });
  m.def("check_device", &check_device_index);
  m.def("set_default_device", &set_default_device);
  m.def("set_device", [](c10::DeviceIndex index) {
    check_device_index(index);
    set_current_device(index);
  });
  m.def("exchange_device", [](c10::DeviceIndex index) {
    auto previous = current_device();
    if (index >= 0) {
      check_device_index(index);
      set_current_device(index);
    }
    return previous;
  });
  m.def("default_generator", [](c10::DeviceIndex index) { return default_generator(index); });
  m.def("next_seed_offset", &next_seed_offset, py::arg("generator"), py::arg("increment") = 1);
  m.def("native_storage", &native_storage);
  m.def("storage_address", [](py::handle owner) { return reinterpret_cast<uintptr_t>(storage_address(owner)); });
  m.def("owner_of", &owner_of);
  m.def("set_storage_nbytes", &set_storage_nbytes);
  m.def("adopt", &adopt);
  // torch.profiler(profile_memory=True) hears of allocations only from C++ allocators; neuron buffers are
  // held in Python, which reports each allocation (bytes > 0) and free (bytes < 0) here while a profile runs
  m.def("report_memory", [](int64_t address, int64_t bytes, int64_t allocated, c10::DeviceIndex index) {
    c10::reportMemoryUsageToProfiler(reinterpret_cast<void*>(address), bytes, allocated, allocated,
                                     c10::Device(kNeuron, index));
  });
  // Every op's output is a new tensor: built here on its shared storage, it costs half of
  // torch.Tensor._make_wrapper_subclass, which parses fifteen arguments and gives the tensor a storage of
  // its own that would then be replaced. The dispatch keys are the ones that function gives (the
  // device's and autograd's, and Python's for __torch_dispatch__). Given `versions_of`, the tensor shares
  // that tensor's version counter, as `versions_of.<a view>.detach()` would, without being an autograd view.
  m.def("new_tensor", [](py::handle cls, py::handle owner, at::IntArrayRef sizes, at::IntArrayRef strides,
                         int64_t offset, at::ScalarType dtype, py::handle versions_of) {
    auto tensor = at::detail::make_tensor<c10::TensorImpl>(
        native_storage(owner), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
    auto* impl = tensor.unsafeGetTensorImpl();
    impl->set_sizes_and_strides(sizes, strides, offset);
    impl->set_python_dispatch(true);
    if (!versions_of.is_none()) {
      impl->set_version_counter(THPVariable_Unpack(versions_of.ptr()).unsafeGetTensorImpl()->version_counter());
    }
    return py::reinterpret_steal<py::object>(
        THPVariable_Wrap(tensor, reinterpret_cast<PyTypeObject*>(cls.ptr())));
  }, py::arg("cls"), py::arg("owner"), py::arg("sizes"), py::arg("strides"), py::arg("offset"), py::arg("dtype"),
     py::arg("versions_of") = py::none());
  // A compiled graph reads storages, so a lazily conjugated or negated input (x.conj(), a complex view's imag)
  // is resolved first: asked of every input of every call, one call here instead of two methods a tensor
  m.def("any_flagged", [](py::handle tensors) {
    for (auto item : tensors) {
      if (THPVariable_Check(item.ptr())) {
        const auto& tensor = THPVariable_Unpack(item.ptr());
        if (tensor.is_conj() || tensor.is_neg()) {
          return true;
        }
      }
    }
    return false;
  });
}
