// The device step's decode graphs (DeviceOptions::graphs, step_graphs.h): the static buffers a
// graph reads, the captures (at load, and of a longer shape when a step first meets it), and a
// decode step's replay.
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <utility>
#include <vector>

#include "llm/llama/device_step.h"

namespace sluice::llm::llama {
namespace {

int64_t RoundUpToGraphKeys(int64_t keys) {
  return (keys + DeviceStepModel::kGraphKeys - 1) / DeviceStepModel::kGraphKeys *
         DeviceStepModel::kGraphKeys;
}

}  // namespace

void DeviceStepModel::SetUpGraphs(int64_t scratch_row) {
  scratch_row_ = scratch_row;
  buckets_ = DecodeBuckets(serve_.slots);
  graph_keys_ = RoundUpToGraphKeys(serve_.context_length);
  const int64_t most = buckets_.back();
  const int64_t size = 4 * most + most * graph_keys_;
  const auto longs = at::TensorOptions().dtype(at::kLong);
  graph_inputs_ = at::zeros({size}, longs.device(device_.device));
  graph_host_ = at::zeros({size}, longs.pinned_memory(device_.device.is_cuda()));
  iota_ = at::arange(std::max(most, graph_keys_), longs.device(device_.device));
  // Every bucket at the shortest key lengths: the shapes a server's first steps meet, captured
  // before it serves rather than in a step's time, over padding (the scratch row written, every
  // key masked but the first).
  for (int64_t keys = kGraphKeys; keys <= std::min(graph_keys_, kGraphKeysAtLoad);
       keys += kGraphKeys) {
    for (int bucket : buckets_) {
      if (!graphs_off_.empty() || static_cast<int>(graphs_.size()) >= device_.max_graphs) return;
      WriteGraphInputs(nullptr, bucket, keys);
      CaptureGraph(bucket, keys);
    }
  }
}

void DeviceStepModel::WriteGraphInputs(const StepBatch* step, int64_t bucket, int64_t keys) {
  // Sequence i (token i) in row i of each block; the bucket's padded sequences token 0 at
  // position 0 writing the scratch row, their keys row 0 (masked but the first).
  const int64_t most = buckets_.back(), block = serve_.kv_block_size,
                used = 4 * most + bucket * keys, n = step != nullptr ? step->size() : 0;
  int64_t* h = graph_host_.data_ptr<int64_t>();
  std::fill(h, h + used, 0);
  std::fill(h + 3 * most, h + 3 * most + bucket, scratch_row_);
  for (int64_t i = 0; i < n; ++i) {
    const auto t = static_cast<size_t>(i);
    h[i] = step->tokens[t];
    h[most + i] = step->positions[t];
    h[2 * most + i] = step->rope_rows[t];
    h[3 * most + i] = step->cache_rows[t];
    for (int64_t m = 0; m < step->kv_lengths[t]; ++m) {
      h[4 * most + i * keys + m] = KeyRow(step->tables[t], m, block);
    }
  }
  graph_inputs_.narrow(0, 0, used).copy_(graph_host_.narrow(0, 0, used));
}

at::Tensor DeviceStepModel::DecodeBody(int64_t sequences, int64_t keys) {
  const int64_t most = buckets_.back();
  const at::Tensor rows = iota_.narrow(0, 0, sequences);
  StepTensors in;
  in.tokens = graph_inputs_.narrow(0, 0, sequences);
  in.positions = graph_inputs_.narrow(0, most, sequences);
  in.rope_rows = graph_inputs_.narrow(0, 2 * most, sequences);
  in.cache_rows = graph_inputs_.narrow(0, 3 * most, sequences);
  in.logit_rows = rows;
  // Sequence i's one query is token i; its keys are positions 0 .. keys - 1, those past its own
  // masked (as Batch masks them), whatever row they read.
  AttentionBatch b;
  b.sequences = sequences;
  b.queries = 1;
  b.keys = keys;
  b.query_rows = b.tokens = b.slots = rows;
  b.key_rows = graph_inputs_.narrow(0, 4 * most, sequences * keys);
  Mask(in.positions.view({sequences, 1, 1, 1, 1}), iota_.narrow(0, 0, keys), &b);
  in.batches.push_back(std::move(b));
  return Forward(in, {});
}

bool DeviceStepModel::CaptureGraph(int64_t bucket, int64_t keys) {
  const std::pair<int64_t, int64_t> shape{bucket, keys};
  DecodeGraph& g = graphs_[shape];
  try {
    g.graph =
        device_.graphs->Capture([this, &g, bucket, keys] { g.out = DecodeBody(bucket, keys); });
    return true;
  } catch (const c10::Error& e) {
    // The device cannot capture the step: every later step runs op by op.
    graphs_off_ = e.what_without_backtrace();
  } catch (const std::exception& e) {
    graphs_off_ = e.what();
  }
  graphs_.erase(shape);
  return false;
}

at::Tensor DeviceStepModel::Graphed(const StepBatch& step) {
  const int64_t n = step.size();
  if (device_.graphs == nullptr || !graphs_off_.empty() ||
      static_cast<int64_t>(step.logit_rows.size()) != n) {
    return {};
  }
  for (int64_t i = 0; i < n; ++i) {
    if (step.logit_rows[static_cast<size_t>(i)] != i) return {};
  }
  const int64_t bucket = DecodeBucket(static_cast<int>(n), buckets_);
  if (bucket == 0) return {};
  int64_t keys = 0;
  for (int64_t length : step.kv_lengths) keys = std::max(keys, length);
  keys = std::min(RoundUpToGraphKeys(keys), graph_keys_);
  const std::pair<int64_t, int64_t> shape{bucket, keys};
  auto it = graphs_.find(shape);
  if (it == graphs_.end() && static_cast<int>(graphs_.size()) >= device_.max_graphs) return {};
  WriteGraphInputs(&step, bucket, keys);
  if (it == graphs_.end()) {
    if (!CaptureGraph(bucket, keys)) return {};
    it = graphs_.find(shape);
  }
  it->second.graph->Replay();
  ++graph_replays_;
  return it->second.out.narrow(0, 0, n);
}

}  // namespace sluice::llm::llama
