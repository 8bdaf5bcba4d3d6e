// torch.accelerator.Graph on neuron: PyTorch's backend-agnostic graph interface (torch >= 2.13), each call
// handed to a torch.neuron.NeuronGraph (device/graphs.py), which captures into adaptive eager's queue.
// Releases without the interface build without it.
#include "native.h"

#if __has_include(<ATen/core/GraphImplInterface.h>)
#include <ATen/core/GraphImplInterface.h>
#define TORCHNEURON_GRAPH_INTERFACE 1
#endif

namespace torchneuron {

#ifdef TORCHNEURON_GRAPH_INTERFACE
namespace {

struct NeuronGraphImpl final : at::GraphImplInterface {
  explicit NeuronGraphImpl(const at::GraphImplArgs&) {}
  ~NeuronGraphImpl() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      graph_ = py::object();
    } else {
      graph_.release();  // the interpreter is gone: nothing left to free it
    }
  }
  void capture_begin(at::MempoolId_t /*pool*/, at::GraphCaptureMode /*mode*/) override {
    call("capture_begin");
  }
  void capture_end() override {
    call("capture_end");
  }
  void instantiate() override {}  // the program compiles at the first replay
  void replay() override {
    call("replay");
  }
  void reset() override {
    call("reset");
  }
  at::MempoolId_t pool() const override {
    return {0, 0};  // no private pool: each replay's results are new buffers of the same storages
  }
  void enable_debug_mode() override {}
  void debug_dump(const std::string& /*path*/) override {
    TORCH_CHECK(false, "neuron: graphs have no debug dump; XLA's dump flags (XLA_FLAGS=--xla_dump_to=DIR) show "
                       "the replayed program");
  }

 private:
  py::object graph_;

  void call(const char* method) {
    py::gil_scoped_acquire gil;
    if (!graph_) {
      graph_ = py::reinterpret_borrow<py::object>(static_cast<PyObject*>(callbacks().new_graph))();
    }
    graph_.attr(method)();
  }
};

} // namespace

void register_graph_implementation() {
  at::GraphImplRegistry()->Register(
      c10::DeviceTypeName(kNeuron, /*lower_case=*/false),
      [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
        return std::make_unique<NeuronGraphImpl>(args);
      });
}
#else
void register_graph_implementation() {}
#endif

} // namespace torchneuron
