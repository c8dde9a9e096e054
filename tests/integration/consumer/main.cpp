// Trains a LeNet in INT16 for a few steps on one fixed batch through the public API only, and
// prints "loss FIRST -> LAST" (the test checks that it falls).
#include <cstdio>
#include <random>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/model.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/status.hpp"

int main() {
  try {
    dfp::Context ctx(dfp::ContextOptions{.threads = 2});
    dfp::Model m(ctx, "lenet");
    dfp::build_model(m, "lenet", 1, 28, 28, 10);
    dfp::PrecisionPolicy policy;
    policy.precision = dfp::Precision::int16;
    const int batch = 16;
    m.build(batch, policy);
    dfp::Sgd sgd(ctx, m, {0.9f, 5e-4f, false});
    std::vector<float> nchw(size_t(batch) * 28 * 28), x(dfp::blocked_size(batch, 1, 28, 28));
    std::mt19937 g(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (float& v : nchw) v = nd(g);
    dfp::to_blocked(nchw.data(), x.data(), batch, 1, 28, 28);
    std::vector<int32_t> y(batch);
    for (int i = 0; i < batch; ++i) y[i] = i % 10;
    double first = 0, last = 0;
    for (int step = 0; step < 20; ++step) {
      const dfp::StepResult r = m.forward(x.data(), y.data(), batch, true);
      (step == 0 ? first : last) = r.loss;
      if (m.backward()) sgd.step(0.02f);
    }
    std::printf("loss %.4f -> %.4f\n", first, last);
    return last < first ? 0 : 1;
  } catch (const dfp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
