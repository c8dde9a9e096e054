/* A C99 program that uses an installed dfp through its C API (dfp/dfp.h) only: it builds a small
 * CNN layer by layer, trains it in INT16 on synthetic Fashion-MNIST-shaped data (1 x 28 x 28,
 * 10 classes), half the steps with the built-in cross-entropy and half from its own loss's
 * gradient, then predicts, saves the state, loads it into a second model and checks that the
 * logits agree bit for bit. It prints "loss BEFORE -> AFTER" (held-out images) and exits 0 when
 * the loss fell and every check held (ctest Install.CConsumerBuildsAndTrains).
 * Usage: consumer_c STATE_FILE */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfp/dfp.h"

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    const dfp_status status_ = (call);                                                                 \
    if (status_ != DFP_OK) {                                                                           \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, dfp_status_name(status_),     \
              dfp_last_error());                                                                       \
      exit(2);                                                                                         \
    }                                                                                                  \
  } while (0)

enum { kChannels = 1, kSide = 28, kClasses = 10, kBatch = 32, kSteps = 30, kImage = kChannels * kSide * kSide };

/* A deterministic stream of uniform numbers in [0, 1) (xorshift64*). */
static uint64_t rng_state = 88172645463325252ull;
static float uniform(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (float)((rng_state * 2685821657736338717ull) >> 40) / 16777216.0f;
}

/* `count` images and labels: class k is a brighter 6 x 6 square at a place of its own, on noise. */
static void make_batch(float* images, int32_t* labels, int count) {
  int i, p;
  for (i = 0; i < count; ++i) {
    const int k = (int)(uniform() * kClasses) % kClasses;
    const int top = 3 + (k / 5) * 13, left = 1 + (k % 5) * 5;
    float* x = images + (size_t)i * kImage;
    for (p = 0; p < kImage; ++p) {
      const int h = p / kSide, w = p % kSide;
      const int inside = h >= top && h < top + 6 && w >= left && w < left + 6;
      x[p] = (inside ? 0.5f : 0.0f) + 2.0f * uniform() - 1.0f;
    }
    labels[i] = k;
  }
}

/* conv 3x3 (8) - BatchNorm - ReLU - max pool 2 - conv 3x3/2 (16) - ReLU - flatten - linear (10). */
static dfp_model* small_cnn(dfp_context* ctx) {
  dfp_model* m = NULL;
  int x = 0;
  CHECK(dfp_model_create(ctx, "small_cnn", &m));
  CHECK(dfp_model_input(m, kChannels, kSide, kSide, &x));
  CHECK(dfp_model_conv(m, x, 8, 3, 1, 1, 0, 1, "conv1", &x));
  CHECK(dfp_model_batchnorm(m, x, "bn1", &x));
  CHECK(dfp_model_relu(m, x, "relu1", &x));
  CHECK(dfp_model_maxpool(m, x, 2, 2, 0, 0, "pool1", &x));
  CHECK(dfp_model_conv(m, x, 16, 3, 2, 1, 1, 1, "conv2", &x));
  CHECK(dfp_model_relu(m, x, "relu2", &x));
  CHECK(dfp_model_flatten(m, x, "flatten", &x));
  CHECK(dfp_model_linear(m, x, kClasses, 1, "fc", &x));
  CHECK(dfp_model_softmax_cross_entropy(m, x, 0.0f));
  CHECK(dfp_model_build(m, kBatch, "int16", NULL));
  return m;
}

/* The gradient of this program's own loss, the mean softmax cross-entropy, for the logits z. */
static void cross_entropy_grad(const float* z, const int32_t* labels, float* grad) {
  int i, c;
  for (i = 0; i < kBatch; ++i) {
    const float* r = z + i * kClasses;
    double zmax = r[0], sum = 0;
    for (c = 1; c < kClasses; ++c) zmax = r[c] > zmax ? r[c] : zmax;
    for (c = 0; c < kClasses; ++c) sum += exp(r[c] - zmax);
    for (c = 0; c < kClasses; ++c) {
      const double p = exp(r[c] - zmax) / sum;
      grad[i * kClasses + c] = (float)((p - (c == labels[i] ? 1.0 : 0.0)) / kBatch);
    }
  }
}

int main(int argc, char** argv) {
  static float images[kBatch * kImage], test_images[kBatch * kImage];
  static int32_t labels[kBatch], test_labels[kBatch];
  float logits[kBatch * kClasses], grad[kBatch * kClasses], logits2[kBatch * kClasses];
  dfp_context *ctx = NULL, *ctx2 = NULL;
  dfp_model *m = NULL, *m2 = NULL, *missing = NULL;
  dfp_sgd* sgd = NULL;
  dfp_step_result before, after;
  dfp_tensor_view fc;
  size_t tensors = 0, params = 0;
  int step, finite = 0;
  const char* isa = NULL;

  if (argc != 2) {
    fprintf(stderr, "usage: %s STATE_FILE\n", argv[0]);
    return 2;
  }
  CHECK(dfp_context_create(2, 1, &ctx));
  CHECK(dfp_context_isa(ctx, &isa));
  m = small_cnn(ctx);
  CHECK(dfp_model_parameter_count(m, &params));
  CHECK(dfp_model_tensor_count(m, &tensors));
  CHECK(dfp_model_tensor(m, "fc.weight", &fc));
  if (fc.ndim != 2 || fc.shape[0] != kClasses || fc.shape[1] != 16 * 7 * 7 || fc.grad == NULL) {
    fprintf(stderr, "fc.weight: unexpected view (%d dimensions, %d x %d)\n", fc.ndim, fc.shape[0], fc.shape[1]);
    return 1;
  }
  printf("kernels %s, %zu parameters in %zu tensors\n", isa, params, tensors);

  make_batch(test_images, test_labels, kBatch);
  CHECK(dfp_model_forward(m, test_images, sizeof test_images / sizeof *test_images, test_labels, kBatch, 0, &before));
  CHECK(dfp_sgd_create(m, 0.9f, 5e-4f, 0, &sgd));
  for (step = 0; step < kSteps; ++step) {
    make_batch(images, labels, kBatch);
    if (step % 2 == 0) {
      CHECK(dfp_model_forward(m, images, sizeof images / sizeof *images, labels, kBatch, 1, NULL));
      CHECK(dfp_model_backward(m, &finite));
    } else {
      CHECK(dfp_model_logits(m, images, sizeof images / sizeof *images, kBatch, 1, logits, kBatch * kClasses));
      cross_entropy_grad(logits, labels, grad);
      CHECK(dfp_model_backward_logits(m, grad, kBatch * kClasses, &finite));
    }
    if (finite) CHECK(dfp_sgd_step(sgd, 0.05f));
  }
  CHECK(dfp_model_forward(m, test_images, sizeof test_images / sizeof *test_images, test_labels, kBatch, 0, &after));
  printf("held-out top-1 %d/%d -> %d/%d\n", before.correct1, kBatch, after.correct1, kBatch);

  /* Inference, the state on disk, and a second model (another seed) that reads it. */
  CHECK(dfp_model_predict(m, test_images, sizeof test_images / sizeof *test_images, kBatch, logits, kBatch * kClasses));
  CHECK(dfp_model_save(m, argv[1]));
  CHECK(dfp_context_create(2, 99, &ctx2));
  m2 = small_cnn(ctx2);
  CHECK(dfp_model_load(m2, argv[1]));
  CHECK(dfp_model_predict(m2, test_images, sizeof test_images / sizeof *test_images, kBatch, logits2,
                          kBatch * kClasses));
  if (memcmp(logits, logits2, sizeof logits) != 0) {
    fprintf(stderr, "the loaded model's logits differ from the saved model's\n");
    return 1;
  }

  /* An error is a status and a message, not a crash. */
  if (dfp_model_create_zoo(ctx, "no-such-model", 1, 28, 28, 10, &missing) != DFP_ERR_INVALID_ARGUMENT ||
      missing != NULL || strstr(dfp_last_error(), "no-such-model") == NULL) {
    fprintf(stderr, "an unknown model was not refused as expected: %s\n", dfp_last_error());
    return 1;
  }

  dfp_sgd_destroy(sgd);
  dfp_model_destroy(m2);
  dfp_model_destroy(m);
  dfp_context_destroy(ctx2);
  dfp_context_destroy(ctx);
  printf("loss %.4f -> %.4f\n", before.loss, after.loss);
  return after.loss < before.loss ? 0 : 1;
}
