// A C++ program that uses two models compiled by Cuvil, through their generated
// headers, like any other C library (see BUILD.bazel: the models are cc_library deps).
//
//   bazel run //examples/cpp_app -- [OUT_DIR]
//
// Both models classify the same synthetic 224x224 image (a smooth colour pattern,
// the same formula as tests/bazel/test_cpp_app.py uses). Prints each model's top-5
// classes; with OUT_DIR, also writes each model's logits as raw float32
// (OUT_DIR/resnet50.f32, OUT_DIR/mobilenet_v2.f32).
//
// Exit status 0 when both models ran, their outputs are finite, and a second run
// through the caller-owned-memory entry point (`<prefix>_run_with_scratch`) gave the
// same numbers; 1 otherwise.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "examples/models/mobilenetv2.h"
#include "examples/models/resnet50.h"

namespace {

constexpr int kSide = 224;

// A deterministic, smooth RGB pattern in about [-2, 2] (a normalised image).
std::vector<float> SyntheticImage() {
  std::vector<float> image(3 * kSide * kSide);
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < kSide; ++y) {
      for (int x = 0; x < kSide; ++x) {
        float v = std::sin(0.05f * static_cast<float>(x * (c + 1)) + 0.03f * static_cast<float>(y)) +
                  std::cos(0.02f * static_cast<float>(x + y) - static_cast<float>(c));
        image[(c * kSide + y) * kSide + x] = v;
      }
    }
  }
  return image;
}

struct Model {
  std::string name;
  cuvil_status (*create)(cuvil_ctx** ctx);
  cuvil_status (*destroy)(cuvil_ctx* ctx);
  cuvil_status (*run)(cuvil_ctx* ctx, const void* const* in, void* const* out);
  cuvil_status (*run_with_scratch)(void* scratch, size_t size, const void* const* in, void* const* out);
  size_t arena_size;
  size_t output_bytes;
};

bool Fail(const std::string& what, cuvil_status st) {
  std::fprintf(stderr, "cpp_app: %s: %s (%s)\n", what.c_str(), cuvil_status_message(st), cuvil_last_error());
  return false;
}

bool RunModel(const Model& m, const std::vector<float>& image, const char* out_dir) {
  cuvil_ctx* ctx = nullptr;
  cuvil_status st = m.create(&ctx);
  if (st != CUVIL_OK) return Fail(m.name + " create", st);
  std::unique_ptr<cuvil_ctx, cuvil_status (*)(cuvil_ctx*)> owned(ctx, m.destroy);

  std::vector<float> logits(m.output_bytes / sizeof(float));
  const void* inputs[] = {image.data()};
  void* outputs[] = {logits.data()};
  if ((st = m.run(ctx, inputs, outputs)) != CUVIL_OK) return Fail(m.name + " run", st);

  // The same model in caller-owned, 64-byte aligned scratch memory.
  size_t size = (m.arena_size + 63) / 64 * 64;
  void* scratch = size ? std::aligned_alloc(64, size) : nullptr;
  std::vector<float> again(logits.size());
  void* outputs2[] = {again.data()};
  st = m.run_with_scratch(scratch, m.arena_size, inputs, outputs2);
  std::free(scratch);
  if (st != CUVIL_OK) return Fail(m.name + " run_with_scratch", st);

  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      std::fprintf(stderr, "cpp_app: %s: logit %zu is not finite\n", m.name.c_str(), i);
      return false;
    }
    if (logits[i] != again[i]) {
      std::fprintf(stderr, "cpp_app: %s: logit %zu differs between run and run_with_scratch (%g vs %g)\n",
                   m.name.c_str(), i, logits[i], again[i]);
      return false;
    }
  }

  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  std::printf("%s top-5:", m.name.c_str());
  for (int k = 0; k < 5; ++k) std::printf(" %d (%.4f)", order[k], logits[order[k]]);
  std::printf("\n");

  if (out_dir != nullptr) {
    std::string path = std::string(out_dir) + "/" + m.name + ".f32";
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(logits.data(), sizeof(float), logits.size(), f) != logits.size() ||
        std::fclose(f) != 0) {
      std::fprintf(stderr, "cpp_app: cannot write %s\n", path.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const char* out_dir = argc > 1 ? argv[1] : nullptr;
  const std::vector<float> image = SyntheticImage();
  const Model models[] = {
      {"resnet50", resnet50_create, resnet50_destroy, resnet50_run, resnet50_run_with_scratch,
       RESNET50_ARENA_SIZE, resnet50_output_nbytes(0)},
      {"mobilenet_v2", mobilenet_v2_create, mobilenet_v2_destroy, mobilenet_v2_run,
       mobilenet_v2_run_with_scratch, MOBILENET_V2_ARENA_SIZE, mobilenet_v2_output_nbytes(0)},
  };
  bool ok = true;
  for (const Model& m : models) ok = RunModel(m, image, out_dir) && ok;
  return ok ? 0 : 1;
}
