// The device guard. PyTorch's autograd engine starts one worker thread per device from the guard's
// device count and switches devices through it; DeviceGuard, torch.accelerator and events go through
// it too. torch 2.13's Python guard only names the device type (no count, no current device), so
// backward on neuron:1 asserts inside the engine. Streams: PJRT orders each device's work, so every
// device has one in-order stream; events record host-side completion times for elapsed_time.
#include "native.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <bitset>
#include <chrono>

namespace py = pybind11;

namespace torchneuron {
namespace {

thread_local c10::DeviceIndex current = -1;  // -1: not set in this thread, the process's default
std::atomic<c10::DeviceIndex> default_device{0};
std::atomic<int> cached_count{-1};
std::bitset<static_cast<size_t>(c10::ScalarType::NumOptions)> supported;  // set once, by set_supported_dtypes

py::object call(void* callback, py::args args) {
  return py::reinterpret_borrow<py::object>(static_cast<PyObject*>(callback))(*args);
}

struct Event {
  c10::DeviceIndex device;
  bool timed;
  std::chrono::steady_clock::time_point time;
};

struct NeuronGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kNeuron;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    auto previous = getDevice();
    if (device.index() != previous.index()) {
      setDevice(device);
    }
    return previous;
  }
  c10::Device getDevice() const override {
    return c10::Device(kNeuron, current_device());
  }
  void setDevice(c10::Device device) const override {
    check_device_index(device.index());
    set_current_device(device.index());
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    set_current_device(device.index());
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    auto index = device_index == -1 ? stream.device_index() : device_index;
    bool timed = flag == c10::EventFlag::BACKEND_DEFAULT;
    if (timed) {
      synchronize_device(index);  // the time the work recorded so far completed
    }
    if (*event == nullptr) {
      *event = new Event{index, timed, {}};
    }
    auto* recorded = static_cast<Event*>(*event);
    recorded->device = index;
    recorded->timed = timed;
    recorded->time = std::chrono::steady_clock::now();
  }
  void block(void* event, const c10::Stream& stream) const override {}  // one in-order stream
  bool queryEvent(void* event) const override {
    return event == nullptr || device_ready(static_cast<Event*>(event)->device);
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      synchronize_device(static_cast<Event*>(event)->device);
    }
  }
  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {
    delete static_cast<Event*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex device_index) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a->timed && b->timed,
                "Both events must be created with argument 'enable_timing=True'.");
    return std::chrono::duration<double, std::milli>(b->time - a->time).count();
  }
  bool queryStream(const c10::Stream& stream) const override {
    return device_ready(stream.device_index());
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    synchronize_device(stream.device_index());
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    synchronize_device(device_index == -1 ? current_device() : device_index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {}
#if __has_include(<c10/core/DeviceCapability.h>)
  // torch.accelerator.get_device_capability (torch >= 2.13): the dtypes a neuron tensor can hold
  c10::DeviceCapability getDeviceCapability(c10::Device /*device*/) const override {
    c10::DeviceCapability capability;
#define TORCHNEURON_SUPPORTED(_, name) \
  capability.capability_data.supported_scalar_types.has_##name = supported[static_cast<size_t>(c10::ScalarType::name)];
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(TORCHNEURON_SUPPORTED)
#undef TORCHNEURON_SUPPORTED
    return capability;
  }
#endif
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl)

} // namespace

void set_supported_dtypes(const std::vector<c10::ScalarType>& dtypes) {
  for (auto dtype : dtypes) {
    supported.set(static_cast<size_t>(dtype));
  }
}

c10::DeviceIndex device_count() noexcept {
  int count = cached_count.load();
  if (count >= 0) {
    return static_cast<c10::DeviceIndex>(count);
  }
  if (callbacks().device_count == nullptr || !Py_IsInitialized()) {
    return 0;
  }
  py::gil_scoped_acquire gil;
  try {
    count = call(callbacks().device_count, py::make_tuple()).cast<int>();
  } catch (py::error_already_set& error) {
    // noexcept here: a platform that cannot start has no devices (device_count() reports why)
    error.discard_as_unraisable(__func__);
    return 0;
  }
  cached_count.store(count);
  return static_cast<c10::DeviceIndex>(count);
}

c10::DeviceIndex current_device() noexcept {
  return current >= 0 ? current : default_device.load();
}

void set_default_device(c10::DeviceIndex index) noexcept {
  default_device.store(index);
}

void set_current_device(c10::DeviceIndex index) noexcept {
  current = index;
}

void check_device_index(c10::DeviceIndex index) {
  auto count = device_count();
  TORCH_CHECK(index >= 0 && index < count, "Invalid device ordinal: neuron:", static_cast<int>(index),
              " (", static_cast<int>(count), " neuron device(s) available)");
}

void synchronize_device(c10::DeviceIndex index) {
  py::gil_scoped_acquire gil;
  call(callbacks().synchronize, py::make_tuple(index));
}

bool device_ready(c10::DeviceIndex index) {
  py::gil_scoped_acquire gil;
  return call(callbacks().ready, py::make_tuple(index)).cast<bool>();
}

} // namespace torchneuron
