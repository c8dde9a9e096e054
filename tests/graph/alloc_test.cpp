// A training step allocates nothing: this binary's malloc family interposes the C library's for
// every library in the process (dfp, oneDNN, TBB, libstdc++), and counts what warm training steps
// allocate. dfp's own code must allocate nothing in any precision; oneDNN's primitives allocate
// inside every execute() (its execution context, its OpenMP regions), which no caller can prevent,
// so allocations with a oneDNN or libgomp frame on their stack are counted apart and reported.
#include <execinfo.h>
#include <gtest/gtest.h>
#include <link.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/dfp.h"
#include "dfp/layer_op.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {
std::atomic<bool> counting{false};
std::atomic<long> own{0}, foreign{0};
// Code ranges of oneDNN and its OpenMP runtime, found before counting starts.
struct Range {
  uintptr_t lo, hi;
};
Range foreign_code[64];
int n_foreign = 0;
thread_local bool in_note = false;

bool is_foreign(void* pc) {
  const auto a = reinterpret_cast<uintptr_t>(pc);
  for (int i = 0; i < n_foreign; ++i)
    if (a >= foreign_code[i].lo && a < foreign_code[i].hi) return true;
  return false;
}
void note() {
  if (!counting.load(std::memory_order_relaxed) || in_note) return;
  in_note = true;
  void* frames[48];
  const int k = backtrace(frames, 48);
  bool f = false;
  for (int i = 0; i < k && !f; ++i) f = is_foreign(frames[i]);
  (f ? foreign : own).fetch_add(1, std::memory_order_relaxed);
  in_note = false;
}
void find_foreign_code() {
  n_foreign = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void*) {
        if (!std::strstr(info->dlpi_name, "libdnnl") && !std::strstr(info->dlpi_name, "libgomp")) return 0;
        for (int i = 0; i < info->dlpi_phnum && n_foreign < 64; ++i)
          if (info->dlpi_phdr[i].p_type == PT_LOAD) {
            const uintptr_t lo = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
            foreign_code[n_foreign++] = {lo, lo + info->dlpi_phdr[i].p_memsz};
          }
        return 0;
      },
      nullptr);
  void* warm[4];
  backtrace(warm, 4);  // its first call loads libgcc (allocating): not while counting
}
}  // namespace

extern "C" {
void* malloc(size_t n) { note(); return __libc_malloc(n); }
void* calloc(size_t a, size_t b) { note(); return __libc_calloc(a, b); }
void* realloc(void* p, size_t n) { note(); return __libc_realloc(p, n); }
void* aligned_alloc(size_t a, size_t n) { note(); return __libc_memalign(a, n); }
void* memalign(size_t a, size_t n) { note(); return __libc_memalign(a, n); }
int posix_memalign(void** p, size_t a, size_t n) {
  note();
  *p = __libc_memalign(a, n);
  return *p ? 0 : 12;  // ENOMEM
}
}

using namespace dfp;

namespace {
// Runs `f` three times to warm up (first use: oneDNN's kernels, thread pools), then three times
// counting: the counts are then in `own` and `foreign`.
template <class F>
void count_three(F&& f) {
  for (int i = 0; i < 3; ++i) f();
  own = foreign = 0;
  counting = true;
  for (int i = 0; i < 3; ++i) f();
  counting = false;
}

// N(0, 1) images of 3 x 16 x 16 in the blocked layout, real channels only: padding lanes stay zero.
std::vector<float> random_images(int n, uint32_t seed) {
  std::vector<float> x(blocked_size(n, 3, 16, 16));
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      for (int k = 0; k < 256; ++k) x[(size_t(i) * 256 + k) * 16 + c] = nd(g);
  return x;
}
}  // namespace

TEST(Allocation, TrainingStepsAllocateNothing) {
  Context ctx(ContextOptions{.threads = 2});
  find_foreign_code();
  // ResNet-20, and a graph of grouped convolutions (groups cutting channel blocks and whole ones).
  auto grouped = [](Model& m) {
    auto x = m.input(3, 16, 16);
    x = m.relu(m.batchnorm(m.conv(x, 12, 3, 1, 1, false, "c0"), "bn0"), "r0");
    x = m.relu(m.conv(x, 32, 3, 1, 1, true, "g1", 4), "r1");
    x = m.conv(x, 32, 3, 2, 1, false, "g2", 2);
    m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 10, true, "fc"));
  };
  for (int graph = 0; graph < 2; ++graph) {
    for (Precision p : {Precision::fp32, Precision::int16, Precision::bf16, Precision::fp16}) {
      SCOPED_TRACE(graph ? "grouped" : "resnet20");
      Model m(ctx, "r");
      if (graph) grouped(m);
      else build_model(m, "resnet20", 3, 16, 16, 10);
      PrecisionPolicy pol;
      pol.precision = p;
      m.build(8, pol);
      // The timed and the sampled paths (profiling; rounding statistics every step) allocate nothing
      // either.
      m.set_profiling(p == Precision::int16 || p == Precision::bf16);
      m.set_numerics_interval(p == Precision::int16 || p == Precision::bf16 ? 1 : 0);
      Sgd sgd(ctx, m, {0.9f, 5e-4f, true});
      const std::vector<float> x = random_images(8, 1);
      const std::vector<int32_t> y = {0, 1, 2, 3, 4, 5, 6, 7};
      count_three([&] {
        m.forward(x.data(), y.data(), 8, true);
        m.backward();
        sgd.step(0.01f);
      });
      EXPECT_EQ(own.load(), 0) << precision_name(p) << ": allocations by dfp in 3 training steps";
      if (p == Precision::int16) {
        EXPECT_EQ(foreign.load(), 0) << "int16 calls no oneDNN primitive";
      }
      std::printf("%s: %ld allocations inside oneDNN/libgomp in 3 steps\n", precision_name(p), foreign.load());
    }
  }
}

// INT16 calls no oneDNN primitive and plans every buffer in build(), so even the first steps
// allocate nothing in dfp: LeNet's second conv (6 channels, 5x5) runs with its columns unfolded
// and needs its unfolded dx' from step 1 on.
TEST(Allocation, FirstInt16StepsAllocateNothing) {
  Context ctx(ContextOptions{.threads = 2});
  find_foreign_code();
  for (const char* model : {"lenet", "resnet20"}) {
    Model m(ctx, "r");
    build_model(m, model, 1, 28, 28, 10);
    PrecisionPolicy pol;
    pol.precision = Precision::int16;
    m.build(4, pol);
    Sgd sgd(ctx, m, {0.9f, 5e-4f, true});
    std::vector<float> x(blocked_size(4, 1, 28, 28));
    std::mt19937 g(2);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (size_t i = 0; i < x.size(); i += 16) x[i] = nd(g);  // channel 0 of each pixel
    const std::vector<int32_t> y = {0, 1, 2, 3};
    own = foreign = 0;
    counting = true;
    for (int i = 0; i < 2; ++i) {
      m.forward(x.data(), y.data(), 4, true);
      m.backward();
      sgd.step(0.01f);
    }
    counting = false;
    EXPECT_EQ(own.load(), 0) << model << ": allocations by dfp in the first 2 int16 training steps";
  }
}

// The API for other programs allocates nothing once built either: inference on a full and a
// partial batch, a training forward without labels, backward from the caller's gradient, the
// input gradient, and the parameter writes picked up by weights_updated().
TEST(Allocation, ApiCallsAllocateNothing) {
  Context ctx(ContextOptions{.threads = 2});
  find_foreign_code();
  for (Precision p : {Precision::fp32, Precision::int16, Precision::bf16, Precision::fp16}) {
    Model m(ctx, "r");
    build_model(m, "resnet20", 3, 16, 16, 10);
    m.set_input_grad(true);
    PrecisionPolicy pol;
    pol.precision = p;
    m.build(8, pol);
    const std::vector<float> x = random_images(8, 3);
    std::vector<float> z(8 * 10), dz(8 * 10), dx(8 * 3 * 16 * 16);
    const Parameter& fc = m.parameters().back();
    count_three([&] {
      m.logits(x.data(), 8, true, z.data());
      for (size_t i = 0; i < z.size(); ++i) dz[i] = (z[i] - (int(i % 10) == int(i / 10) ? 1.f : 0.f)) / 40.f;
      m.backward(dz.data());
      m.input_grad(dx.data());
      fc.value[0] += 1e-3f;
      m.weights_updated();
      m.predict(x.data(), 8, z.data());
      m.predict(x.data(), 3, z.data());
    });
    EXPECT_EQ(own.load(), 0) << precision_name(p) << ": allocations by dfp in 3 rounds of API calls";
  }
}

// The C API (include/dfp/dfp.h) adds nothing that allocates: its calls take plain NCHW images
// into a blocked buffer planned at dfp_model_build, and report through status codes.
TEST(Allocation, CApiCallsAllocateNothing) {
  find_foreign_code();
  dfp_context* ctx = nullptr;
  ASSERT_EQ(dfp_context_create(2, 1, &ctx), DFP_OK) << dfp_last_error();
  for (const char* p : {"fp32", "int16", "bf16", "fp16"}) {
    dfp_model* m = nullptr;
    ASSERT_EQ(dfp_model_create_zoo(ctx, "resnet20", 3, 16, 16, 10, &m), DFP_OK) << dfp_last_error();
    ASSERT_EQ(dfp_model_build(m, 8, p, nullptr), DFP_OK) << dfp_last_error();
    dfp_sgd* sgd = nullptr;
    ASSERT_EQ(dfp_sgd_create(m, 0.9f, 5e-4f, 0, &sgd), DFP_OK);
    std::vector<float> x(8 * 3 * 16 * 16), z(8 * 10), dz(8 * 10);
    std::mt19937 g(4);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (float& v : x) v = nd(g);
    const std::vector<int32_t> y = {0, 1, 2, 3, 4, 5, 6, 7};
    dfp_tensor_view fc{};
    ASSERT_EQ(dfp_model_tensor(m, "fc.weight", &fc), DFP_OK);
    int failures = 0;
    count_three([&] {
      failures += dfp_model_forward(m, x.data(), x.size(), y.data(), 8, 1, nullptr) != DFP_OK;
      failures += dfp_model_backward(m, nullptr) != DFP_OK;
      failures += dfp_sgd_step(sgd, 0.01f) != DFP_OK;
      failures += dfp_model_logits(m, x.data(), x.size(), 8, 1, z.data(), z.size()) != DFP_OK;
      for (size_t i = 0; i < z.size(); ++i) dz[i] = (z[i] - (int(i % 10) == int(i / 10) ? 1.f : 0.f)) / 40.f;
      failures += dfp_model_backward_logits(m, dz.data(), dz.size(), nullptr) != DFP_OK;
      failures += dfp_sgd_step(sgd, 0.01f) != DFP_OK;
      fc.data[0] += 1e-3f;
      failures += dfp_model_weights_updated(m) != DFP_OK;
      failures += dfp_model_predict(m, x.data(), 3 * 3 * 16 * 16, 3, z.data(), z.size()) != DFP_OK;
    });
    EXPECT_EQ(failures, 0) << dfp_last_error();
    EXPECT_EQ(own.load(), 0) << p << ": allocations by dfp in 3 rounds of C API calls";
    dfp_sgd_destroy(sgd);
    dfp_model_destroy(m);
  }
  dfp_context_destroy(ctx);
}

// A LayerOp (the PyTorch bridge's layer) allocates nothing once its shapes are planned: training
// forwards and backwards with a new weight version each time (so each re-loads the weights), and an
// inference pass of another batch size (its own plan), in every precision, grouped or not.
TEST(Allocation, LayerOpCallsAllocateNothing) {
  Context ctx(ContextOptions{.threads = 2});
  find_foreign_code();
  for (int groups : {1, 4})
    for (Precision p : {Precision::fp32, Precision::int16, Precision::bf16, Precision::fp16}) {
      LayerOpSpec spec;
      spec.in_channels = 32;
      spec.out_channels = 16;
      spec.kernel = 3;
      spec.pad = 1;
      spec.groups = groups;
      spec.bias = true;
      spec.name = "layer4.1.downsample.0";  // longer than a short string keeps in place
      PrecisionPolicy pol;
      pol.precision = p;
      LayerOp op(ctx, spec, pol);
      std::vector<float> x(8 * 32 * 8 * 8, 0.5f), y(8 * 16 * 8 * 8), dx(x.size()), w(op.weight_count(), 0.01f),
          dw(w.size()), b(16), db(16);
      uint64_t version = 0;
      count_three([&] {
        w[0] += 1e-3f;
        const uint64_t t = op.forward(x.data(), 8, 8, 8, w.data(), b.data(), ++version, y.data(), true, true);
        op.backward(t, y.data(), dx.data(), dw.data(), db.data());
        op.forward(x.data(), 3, 8, 8, w.data(), b.data(), version, y.data(), false, false);
      });
      EXPECT_EQ(own.load(), 0) << precision_name(p) << " groups " << groups << ": allocations by dfp in 3 rounds";
    }
}
