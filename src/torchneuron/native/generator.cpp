// Device generators. torch.Generator(device="neuron"), torch.neuron.default_generators and every
// `generator=` argument reach a backend only through the hooks' getNewGenerator/getDefaultGenerator,
// which a Python backend cannot implement. The state is Philox-shaped, as CUDA's: a seed and an
// offset (16 bytes), the layout DTensor's RNG tracker assumes; each random op takes the key
// (seed, offset) and advances the offset, so eager, adaptive eager and compiled code agree.
#include "native.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/GeneratorImpl.h>

#include <cstring>
#include <deque>
#include <mutex>

namespace torchneuron {
namespace {

constexpr size_t kStateBytes = 2 * sizeof(uint64_t);

struct NeuronGeneratorImpl final : c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    auto seed = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(seed);
    return seed;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }
  void set_state(const c10::TensorImpl& state) override {
    at::detail::check_rng_state(state);
    TORCH_CHECK(state.numel() == kStateBytes, "RNG state is wrong size: expected ", kStateBytes,
                " bytes (seed, offset), got ", state.numel());
    uint64_t values[2];
    std::memcpy(values, state.data(), kStateBytes);
    seed_ = values[0];
    offset_ = values[1];
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, c10::ScalarType::Byte,
                                       std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    uint64_t values[2] = {seed_, offset_};
    std::memcpy(state.data_ptr(), values, kStateBytes);
    return state.getIntrusivePtr();
  }
  std::pair<uint64_t, uint64_t> next(uint64_t increment) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto offset = offset_;
    offset_ += increment;
    return {seed_, offset};
  }

 private:
  NeuronGeneratorImpl* clone_impl() const override {
    auto* copy = new NeuronGeneratorImpl(device().index(), seed_);
    copy->offset_ = offset_;
    return copy;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  if (index == -1) {
    return current_device();
  }
  check_device_index(index);
  return index;
}

} // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::mutex mutex;
  // a deque: references handed out stay valid as devices are added
  static std::deque<at::Generator> generators;
  index = resolve(index);
  std::lock_guard<std::mutex> lock(mutex);
  while (static_cast<c10::DeviceIndex>(generators.size()) <= index) {
    generators.push_back(at::make_generator<NeuronGeneratorImpl>(static_cast<c10::DeviceIndex>(generators.size())));
  }
  return generators[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<NeuronGeneratorImpl>(resolve(index));
}

std::pair<uint64_t, uint64_t> next_seed_offset(const at::Generator& generator, uint64_t increment) {
  TORCH_CHECK(generator.device().type() == kNeuron,
              "Expected a 'neuron' device type for generator but found '", generator.device().type(), "'");
  return static_cast<NeuronGeneratorImpl*>(generator.unsafeGetGeneratorImpl())->next(increment);
}

} // namespace torchneuron
