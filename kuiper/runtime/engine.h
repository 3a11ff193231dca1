// The engine: many generation requests at once over one Model. Requests are queued as they
// come; every step() the scheduler picks a batch (decode tokens of the running requests, prefill
// chunks of the others, under a token budget), one Model::forward runs it over the requests' KV
// blocks, and each request whose span reached its last token samples its next one with its own
// sampler, so what a request generates does not depend on what else is in the batch. Text
// streams to each request's callback; finished requests are reported by the step that finished
// them and leave at once, their blocks going back to the pool (and its prefix cache).
//
// Qwen3-VL: a request's images are encoded by the vision tower when a chunk first reaches their
// pad tokens, and its tokens rotate at their M-RoPE positions (qwen3_vl_rope_index over the
// prompt; generated text after it at cache position + the prompt's delta).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kuiper/base/pending_read.h"
#include "kuiper/model/model.h"
#include "kuiper/model/rope_index.h"
#include "kuiper/op/ops.h"
#include "kuiper/runtime/block_pool.h"
#include "kuiper/runtime/generation.h"
#include "kuiper/runtime/scheduler.h"
#include "kuiper/runtime/text_stream.h"
#include "kuiper/tokenizer/tokenizer.h"
#include "kuiper/vision/preprocess.h"

namespace kuiper {

struct EngineOptions {
  int64_t max_batch = 8;            // requests running at once; at least 1
  int64_t max_batch_tokens = 2048;  // tokens one step runs; at least 1
  // Overlapped steps (vLLM's asynchronous scheduling): while every request takes the arg-max
  // (greedy, no penalties, no log-probabilities, no images), a step leaves its tokens on the
  // device and the next step is scheduled and launched on them before the host reads them: each
  // request that goes on holds a placeholder for its token, which the model reads from the
  // device (SequenceInput::fed). The host's work between steps (streaming text, finishing,
  // admitting, scheduling) then runs while the device computes. A request sure to end on its
  // token (max_tokens, the context's end) sits the next step out; one that ends on an end token
  // or a stop string read late leaves its row of the step already launched unused.
  bool overlap_steps = true;
};

// What the last step ran, and the KV pool after it. With overlapped steps, the step whose tokens
// the call read (a call that only launched one reports none).
struct StepStats {
  int64_t decode_tokens = 0;   // sequences that ran one token to sample the next
  int64_t prefill_tokens = 0;  // prompt tokens run (and recomputed ones after a preemption)
  int64_t used_blocks = 0;     // pool blocks in use
  // The forward and the sampling, until the sampled tokens were on the host: the device's share
  // of the step (the rest is the host's: scheduling, streaming text).
  double forward_seconds = 0;
};

// A request that finished (or failed) in a step.
struct FinishedRequest {
  int64_t id = 0;
  Result<Generation> generation = Status::Error("unset");
  // How many of the request's tokens (the prompt, then the generated ids) the cache held when
  // it finished: the request's keys and values the next one may reuse.
  int64_t cached_tokens = 0;
};

class Engine {
 public:
  // `model` must outlive the engine; its KV pool (kv_blocks() of kv_block_size() tokens) is
  // the engine's to hand out. End tokens: the config's eos ids, <|im_end|> and <|endoftext|>.
  // Fails on options out of range.
  static Result<std::unique_ptr<Engine>> create(Model& model, Tokenizer tokenizer,
                                                const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request: `prompt` with, for a vision-language model, per image in order a run of
  // merged_tokens <|image_pad|> ids (expand_image_pads) and its pixel values in `images`.
  // Returns its id. Fails, queueing nothing, on an empty prompt, a prompt longer than the
  // context (the message gives both lengths), images a model does not take or a pad count that
  // does not match them, or invalid options.
  Result<int64_t> add_request(std::vector<int32_t> prompt, std::vector<ProcessedImage> images,
                              const GenerationOptions& options, TextCallback on_text = nullptr);
  // Ends a request at the next step, reporting what it generated so far (kInterrupted).
  // Unknown ids are ignored.
  void cancel(int64_t id);

  // Runs one step and returns the requests that finished in it (with overlapped steps: launches
  // one and reads the tokens of the one before). A request's own failure (an
  // image the vision tower refuses, a model error in its span) finishes that request with the
  // error; the others go on. An error here means the engine itself cannot go on.
  Result<std::vector<FinishedRequest>> step();

  // Requests added and not yet reported finished; of those, the ones holding a place in the
  // running batch and the ones waiting for one.
  size_t unfinished() const { return requests_.size(); }
  size_t running() const { return scheduler_.running(); }
  size_t waiting() const { return scheduler_.waiting(); }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  Model& model() { return model_; }
  const Model& model() const { return model_; }
  // The most tokens one request may hold: the model's context, or the pool if smaller.
  int64_t max_context() const { return max_context_; }
  bool is_end_token(int32_t id) const { return end_tokens_.count(id) != 0; }
  const SchedulerStats& stats() const { return scheduler_.stats(); }
  const StepStats& last_step() const { return last_step_; }
  // Tokens whose keys and values the running requests hold now, each pool block counted once (a
  // prefix block that several requests share holds its tokens once; a block holds as many tokens
  // as the request that has written furthest into it). A walk over every running request's
  // blocks: ask for it when it is needed (the bench at the pool's peak), not after every step
  // (at 256 sequences it cost about 0.1 ms of host time a step, where the step is 14 ms).
  int64_t live_tokens();
  // The log-probabilities of the tokens request `id` has generated so far (when its options ask
  // for them); null for an id not running or waiting.
  const std::vector<TokenLogprob>* logprobs(int64_t id) const;
  const BlockPool& pool() const { return pool_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Request;
  struct Entry;

  Engine(Model& model, Tokenizer tokenizer, const EngineOptions& options);

  // A step as the scheduler picks it: its spans prepared and run (or left in flight); a step
  // run here adds its figures to `read`.
  Status schedule_and_run(StepStats* read, std::vector<FinishedRequest>* finished);
  // Finishes the requests cancel() marked (kInterrupted).
  void finish_cancelled(std::vector<FinishedRequest>* finished);
  // The model input of `span` in entry->input (images encoded on first need).
  Status prepare(Request& request, const ScheduledSpan& span, Entry* entry);
  // A step launched whose tokens the host has not read: each entry's request, span and row of
  // the step's tokens (-1: its span samples none), the tokens in step_tokens_[slot] on the device
  // and on their way to the host in reads_[slot].
  struct Launched {
    std::vector<int64_t> ids;
    std::vector<ScheduledSpan> spans;
    std::vector<int64_t> rows;
    int slot = 0;
    bool completed = false;  // the scheduler has been told its spans ran
    StepStats stats;
  };

  // Entries for `spans` (the scheduler's last step) in `entries`, the prepared ones in `ready`;
  // a request whose span cannot be prepared fails. A request holding a placeholder takes its
  // last token from its fed row.
  void prepare_spans(const std::vector<ScheduledSpan>& spans, std::vector<Entry>* entries,
                     std::vector<Entry*>* ready, std::vector<FinishedRequest>* finished);

  // Runs `entries` in one forward, then samples and advances every request whose span sampled;
  // or, where `may_overlap` and every entry's request takes the arg-max (device_path), leaves
  // the step in flight (in_flight_) with its tokens on the device.
  Status run(const std::vector<Entry*>& entries, std::vector<FinishedRequest>* finished,
             bool may_overlap);
  // One forward over `entries` (fed: the tokens their fed rows name, on the device; read only
  // where an entry is fed), its arg-max into the next token slot and the copy of it to the host
  // started.
  Status launch(const std::vector<Entry*>& entries, const Tensor* fed, Launched* step);
  // The step after `last`, scheduled and launched on last's tokens on the device, each request
  // that samples in `last` and goes on holding a placeholder token until they are read; none
  // where a request takes its tokens on the host or one is cancelled. A request whose span
  // cannot be prepared fails into `finished`.
  Result<std::optional<Launched>> launch_next(Launched& last,
                                              std::vector<FinishedRequest>* finished);
  // Reads `step`'s tokens and advances its requests (those that finished meanwhile skipped),
  // each placeholder giving way to its token.
  Status collect(Launched& step, std::vector<FinishedRequest>* finished);
  // op::sample_rows over `logits` and its tokens copied to the host, in `rows` order.
  Status sample_batch(const Tensor& logits, const std::vector<op::SampleRow>& rows,
                      const std::vector<int32_t>& recent, std::vector<int32_t>* tokens);
  // The request sampled `id` (with its log-probabilities when the request asked for them).
  void advance(Request& request, int32_t id, TokenLogprob* logprob,
               std::vector<FinishedRequest>* finished);
  // Reports the request (finished for `reason`, or failed with `error`) and drops it.
  void finish(Request& request, FinishReason reason, std::vector<FinishedRequest>* finished);
  void fail(Request& request, const Status& error, std::vector<FinishedRequest>* finished);

  Model& model_;
  Tokenizer tokenizer_;
  std::unordered_set<int32_t> end_tokens_;
  int64_t max_context_;
  BlockPool pool_;
  Scheduler scheduler_;
  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
  std::vector<float> logits_row_;  // a host copy of a row, for requests asking for logprobs
  // op::sample_rows' scratch and its tokens (int32, room for the largest step so far), kept
  // across steps so a step allocates nothing.
  op::SampleWorkspace sample_workspace_;
  Tensor sampled_;
  // live_tokens' scratch: a count for each pool block (all zero between calls) and the blocks
  // it touched.
  std::vector<int32_t> block_fill_;
  std::vector<int32_t> touched_blocks_;
  int64_t next_id_ = 1;
  int64_t cancelled_ = 0;  // requests cancel() marked since the last step finished them
  int64_t host_path_ = 0;  // unfinished requests whose tokens the host samples (not device_path)
  StepStats last_step_;
  bool overlap_steps_;
  // Overlapped steps: two token slots, so a step's arg-max does not overwrite the tokens the one
  // before still feeds; the reads last, so they wait for their copies before the slots go.
  std::optional<Launched> in_flight_;
  Tensor step_tokens_[2];
  PendingRead reads_[2];
  int next_slot_ = 0;
};

}  // namespace kuiper
