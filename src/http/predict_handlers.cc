// /predict and /predictions/{model}.
#include "http/predict_handlers.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <iterator>
#include <numeric>

#include "codec/base64.h"
#include "common/json_writer.h"

namespace sluice {
namespace {

// An encoded image (base64 text for /predict) up to this size decodes on the I/O thread that read
// it when the decode pool has no backlog: a 28x28 PNG takes tens of microseconds, less than waking
// a pool thread; a photo takes milliseconds, which would hold up the thread's other connections.
constexpr size_t kInlineDecodeBytes = 8 << 10;

// Softmax probabilities of a [1, K] (or [K]) FP32 output.
std::vector<double> Probabilities(const Tensor& scores) {
  auto logits = scores.values<float>();
  std::vector<double> p(logits.begin(), logits.end());
  if (p.empty()) return p;
  const double max = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (double& v : p) sum += (v = std::exp(v - max));
  for (double& v : p) v /= sum;
  return p;
}

// Shared between a request's handler, its decode task and a disconnect: whoever comes second
// cancels the queued request.
struct PendingCancel {
  std::shared_ptr<ModelScheduler> scheduler;
  std::atomic<RequestId> id{0};
  std::atomic<bool> client_gone{false};
};

}  // namespace

std::vector<std::string> LoadLabels(const std::string& path) {
  std::vector<std::string> labels;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels.push_back(line);
  }
  return labels;
}

PredictHandlers::PredictHandlers(Engine& engine, ThreadPool& decode_pool, std::string default_model,
                                 ImageLimits limits)
    : engine_(engine),
      decode_pool_(decode_pool),
      default_model_(std::move(default_model)),
      limits_(limits) {}

void PredictHandlers::SetLabels(const std::string& model, std::vector<std::string> labels) {
  MutexLock lock(mu_);
  labels_[model] = std::move(labels);
}

std::string PredictHandlers::FirstImageModel() const {
  for (const std::string& name : engine_.ModelNames()) {
    std::shared_ptr<ModelScheduler> scheduler = engine_.Find(name);
    if (scheduler && scheduler->config().preprocess_image) return name;
  }
  return "";
}

void PredictHandlers::AddRoutes(Router& router) {
  router.Post("/predict", [this](const HttpRequest& r, const PathParams& p, Responder respond) {
    Predict(r, p, std::move(respond));
  });
  router.Post("/predictions/{model}",
              [this](const HttpRequest& r, const PathParams& p, Responder respond) {
                Predictions(r, p, std::move(respond));
              });
  // An overloaded model refuses before the image is read.
  router.SetAdmission(
      "POST", "/predictions/{model}", [this](const PathParams& params) -> Result<AdmissionTicket> {
        std::shared_ptr<ModelScheduler> scheduler = engine_.Find(std::string(params.Get("model")));
        if (!scheduler) return AdmissionTicket();
        return scheduler->Admit();
      });
}

void PredictHandlers::Predict(const HttpRequest& request, const PathParams&, Responder respond) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto error = parser.parse(request.body.data(), request.body.size()).get(doc)) {
    respond(HttpResponse::Error(Status::InvalidArgument(
        fmt::format("malformed JSON: {}", simdjson::error_message(error)))));
    return;
  }
  std::string_view image_b64;
  if (doc["image"].get_string().get(image_b64)) {
    respond(HttpResponse::Error(
        Status::InvalidArgument("the body must be {\"image\": \"<base64 PNG or JPEG>\"}")));
    return;
  }
  std::string fallback = default_model_.empty() ? FirstImageModel() : default_model_;
  std::string_view model = fallback;
  simdjson::dom::element model_field;
  if (!doc["model"].get(model_field) && model_field.get_string().get(model)) {
    respond(HttpResponse::Error(Status::InvalidArgument("\"model\" must be a string")));
    return;
  }
  if (model.empty()) {
    respond(
        HttpResponse::Error(Status::NotFound("no model serves /predict: name one with \"model\"")));
    return;
  }
  // Base64 is decoded on the pool too; only the string is copied here.
  Classify(request, std::string(model), std::string(image_b64), Style::kLitServe,
           std::move(respond));
}

void PredictHandlers::Predictions(const HttpRequest& request, const PathParams& params,
                                  Responder respond) {
  if (request.body.empty()) {
    respond(HttpResponse::Error(Status::InvalidArgument("empty body: send a PNG or JPEG image")));
    return;
  }
  Classify(request, std::string(params.Get("model")), request.body, Style::kTorchServe,
           std::move(respond));
}

void PredictHandlers::Classify(const HttpRequest& request, std::string model, std::string image,
                               Style style, Responder respond) {
  if (!IsValidModelName(model)) {
    respond(HttpResponse::Error(
        Status::InvalidArgument(fmt::format("invalid model name {}", JsonQuote(model)))));
    return;
  }
  std::shared_ptr<ModelScheduler> scheduler = engine_.Find(model);
  if (!scheduler) {
    respond(HttpResponse::Error(Status::NotFound(fmt::format("unknown model '{}'", model))));
    return;
  }
  const ModelConfig& config = scheduler->config();
  if (!config.preprocess_image || config.inputs.size() != 1) {
    respond(HttpResponse::Error(Status::InvalidArgument(
        fmt::format("model '{}' takes no images (its config has no preprocess.image)", model))));
    return;
  }
  // A route without admission at its header (/predict names its model in the body) is admitted
  // here, before the image is decoded: an overloaded model refuses for the cost of the read.
  std::shared_ptr<const void> admission = request.admission;
  if (!admission) {
    auto admitted = scheduler->Admit();
    if (!admitted.ok()) return respond(HttpResponse::Error(admitted.status()));
    admission = std::move(*admitted);
  }
  auto pending = std::make_shared<PendingCancel>();
  pending->scheduler = scheduler;
  if (request.trace) request.trace->model = config.name;
  if (request.on_disconnect) {
    request.on_disconnect([pending] {
      pending->client_gone = true;
      if (RequestId id = pending->id.load()) pending->scheduler->Cancel(id);
    });
  }
  const bool inline_decode = image.size() <= kInlineDecodeBytes;
  // The body's copy, the decoded pixels and the tensor stay counted against the memory budget
  // until the answer is formatted.
  auto task = [this, scheduler, pending, image = std::move(image), style, post = request.post,
               respond, arrived = request.arrived, received = request.received,
               memory = request.memory, admission = std::move(admission),
               trace = request.trace]() mutable {
    if (pending->client_gone) return respond(HttpResponse::Error(Status::Cancelled("gone")));
    const ModelConfig& config = scheduler->config();
    const ImagePreprocessConfig& preprocess = *config.preprocess_image;
    std::string decoded_b64;
    std::string_view bytes = image;
    if (style == Style::kLitServe) {
      auto decoded = Base64Decode(image);
      if (!decoded.ok()) return respond(HttpResponse::Error(decoded.status()));
      decoded_b64 = std::move(*decoded);
      bytes = decoded_b64;
    }
    auto pixels = DecodeImage(bytes, preprocess.channels, limits_, DecodeMinSide(preprocess));
    if (!pixels.ok()) return respond(HttpResponse::Error(pixels.status()));
    // The base64-decoded bytes, the pixels and the fp32 tensor made from them (four bytes a
    // pixel value); the body (or its copy here) is counted from its header.
    const size_t decoded_bytes = decoded_b64.size() + pixels->pixels.size() * 5;
    if (memory && !memory->Grow(decoded_bytes)) {
      return respond(HttpResponse::Error(MemoryBudgetExceeded(*memory, decoded_bytes)));
    }
    const TensorSpec& spec = config.inputs[0];
    // A UINT8 input takes the raw pixels, [H, W, C], normalised on the device (GPU models).
    auto tensor = spec.datatype == DataType::kUInt8 ? PreprocessImageUint8(*pixels, preprocess)
                                                    : PreprocessImage(*pixels, preprocess);
    if (!tensor.ok()) return respond(HttpResponse::Error(tensor.status()));
    Shape shape = tensor->shape();
    if (tensor->dtype() != spec.datatype || spec.shape.size() != shape.size() ||
        !std::equal(shape.begin(), shape.end(), spec.shape.begin(),
                    [](int64_t got, int64_t want) { return want < 0 || got == want; })) {
      return respond(HttpResponse::Error(Status::InvalidArgument(fmt::format(
          "the preprocessed image is {} but model '{}' takes {} {}", ShapeToString(shape),
          config.name, DataTypeName(spec.datatype), ShapeToString(spec.shape)))));
    }
    shape.insert(shape.begin(), 1);
    auto infer = std::make_unique<InferRequest>();
    infer->inputs.push_back(tensor->Reshaped(shape));
    infer->arrived = arrived;  // Its wait for a decoder and the decode count in its deadline.
    const Clock::time_point decoded_at = Clock::Real().Now();
    infer->done = [this, scheduler, style, post, respond, received, decoded_at, memory,
                   trace](InferResponse&& response) mutable {
      post([this, scheduler, style, respond = std::move(respond), received, decoded_at,
            memory = std::move(memory), trace = std::move(trace),
            response = std::move(response)]() mutable {
        if (trace) trace->SetEngineTimes(response);
        if (!response.status.ok()) return respond(HttpResponse::Error(response.status));
        const Clock::time_point encode_start = Clock::Real().Now();
        if (trace) trace->End(TraceStage::kRespond, encode_start);
        HttpResponse http;
        http.body = FormatReply(scheduler->config(), response.outputs[0], style);
        const RequestTimes& t = response.times;
        auto ms = [](Clock::time_point a, Clock::time_point b) {
          return a == Clock::time_point{} || b < a ? 0.0 : SecondsBetween(a, b) * 1e3;
        };
        http.headers.emplace_back(
            "Server-Timing",
            fmt::format("decode;dur={:.3f}, queue;dur={:.3f}, infer;dur={:.3f}, encode;dur={:.3f}",
                        ms(received, decoded_at), ms(t.enqueue, t.compute_start),
                        ms(t.compute_start, t.compute_end), ms(encode_start, Clock::Real().Now())));
        if (trace) trace->End(TraceStage::kEncode, Clock::Real().Now());
        respond(std::move(http));
      });
    };
    auto id = scheduler->Submit(std::move(infer));
    admission.reset();  // Queued (or refused): it no longer counts as incoming.
    if (!id.ok()) return respond(HttpResponse::Error(id.status()));
    pending->id = *id;
    if (pending->client_gone) scheduler->Cancel(*id);
  };
  // A small image whose decode would find the pool idle decodes here: a hand-off to a sleeping
  // pool thread costs more than the decode. Larger ones, or any while the pool has a backlog,
  // leave the I/O thread free.
  if (inline_decode && decode_pool_.queued() == 0) return task();
  if (!decode_pool_.TrySubmit(std::move(task))) {
    respond(HttpResponse::Error(Status::Unavailable("image decode queue full")));
  }
}

std::string PredictHandlers::FormatReply(const ModelConfig& config, const Tensor& scores,
                                         Style style) const {
  std::vector<double> p = Probabilities(scores);
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k =
      std::min(order.size(), static_cast<size_t>(std::max(1, config.postprocess_topk)));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](size_t a, size_t b) { return p[a] > p[b]; });
  std::vector<std::string> labels;
  {
    MutexLock lock(mu_);
    auto it = labels_.find(config.name);
    if (it != labels_.end()) labels = it->second;
  }
  auto label = [&](size_t i) { return i < labels.size() ? labels[i] : std::to_string(i); };
  JsonWriter json;
  json.BeginObject();
  if (style == Style::kTorchServe) {
    for (size_t r = 0; r < k; ++r) json.Field(label(order[r]), p[order[r]]);
  } else {
    json.Field("output", static_cast<int64_t>(order[0]))
        .Field("label", label(order[0]))
        .Field("probability", p[order[0]]);
    json.Key("topk").BeginArray();
    for (size_t r = 0; r < k; ++r) {
      json.BeginObject()
          .Field("index", static_cast<int64_t>(order[r]))
          .Field("label", label(order[r]))
          .Field("probability", p[order[r]])
          .EndObject();
    }
    json.EndArray();
  }
  json.EndObject();
  return json.str();
}

}  // namespace sluice
