// Image classification routes on the model's `preprocess.image` settings:
//   POST /predict             LitServe style: {"image": "<base64 PNG/JPEG>"[, "model": "m"]}
//                             -> {"output": <class>, "label": ..., "probability": ..., "topk":
//                             [...]}
//   POST /predictions/{model} TorchServe style: raw PNG/JPEG bytes -> {"<label>": probability, ...}
// Images are decoded and preprocessed on a decode pool (so one batch's images decode in
// parallel and the I/O threads stay free), then batched by the engine like any request. A small
// image that would find the pool idle decodes on the I/O thread instead (no hand-off).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "codec/image.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "engine/engine.h"
#include "http/router.h"

namespace sluice {

// Thread-safe.
class PredictHandlers {
 public:
  // `default_model` serves /predict bodies that name no model; empty: the first loaded model (by
  // name) with preprocess.image.
  PredictHandlers(Engine& engine, ThreadPool& decode_pool, std::string default_model,
                  ImageLimits limits = {});

  // Class names for a model's outputs (labels.txt), used in top-k replies.
  void SetLabels(const std::string& model, std::vector<std::string> labels);

  void AddRoutes(Router& router);

  void Predict(const HttpRequest& request, const PathParams& params, Responder respond);
  void Predictions(const HttpRequest& request, const PathParams& params, Responder respond);

 private:
  enum class Style { kLitServe, kTorchServe };
  // Decodes `image` on the pool, submits it to `model`, answers in `style`.
  void Classify(const HttpRequest& request, std::string model, std::string image, Style style,
                Responder respond);
  std::string FirstImageModel() const;
  std::string FormatReply(const ModelConfig& config, const Tensor& scores, Style style) const;

  Engine& engine_;
  ThreadPool& decode_pool_;
  const std::string default_model_;
  const ImageLimits limits_;
  mutable Mutex mu_;
  std::map<std::string, std::vector<std::string>> labels_ GUARDED_BY(mu_);
};

// Loads labels.txt (one class name per line); empty when the file is absent.
std::vector<std::string> LoadLabels(const std::string& path);

}  // namespace sluice
