#include "kuiper/runtime/engine.h"

#include <algorithm>
#include <cmath>

#include "kuiper/op/ops.h"
#include "kuiper/runtime/cache_keys.h"
#include "kuiper/runtime/vision_input.h"

namespace kuiper {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

using PadRuns = std::vector<std::pair<size_t, size_t>>;

// Image-pad tokens of `runs` before position `position`.
int64_t pads_before(const PadRuns& runs, int64_t position) {
  int64_t pads = 0;
  for (const auto& [begin, end] : runs) {
    pads += std::max<int64_t>(0, std::min<int64_t>(static_cast<int64_t>(end), position) -
                                     static_cast<int64_t>(begin));
  }
  return pads;
}

// Whether the sampler's token is the arg-max of the raw logits row.
bool plain_argmax(const Sampler& sampler) {
  const SamplingParams& p = sampler.params();
  return sampler.greedy() && p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

// Whether a request's tokens can all be drawn on the device from its logits alone, before the
// host has the tokens before them: the plain arg-max, or op::sample_rows' warpers and draw with
// no penalty (a penalty reads the tokens so far). No image (a step holding image rows is not
// overlapped), no log-probabilities.
bool device_path(const Sampler& sampler, const GenerationOptions& options, bool images) {
  const bool drawn = sampler.samples_on_device() && sampler.params().repeat_penalty == 1.0f;
  return (plain_argmax(sampler) || drawn) && options.logprobs < 0 && !images;
}

// The log-softmax of `row` at `id` and its `k` largest entries.
TokenLogprob logprob_of(const std::vector<float>& row, int32_t id, int32_t k) {
  const float max = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (float v : row) sum += std::exp(static_cast<double>(v - max));
  const float log_z = max + static_cast<float>(std::log(sum));
  TokenLogprob out;
  out.id = id;
  out.logprob = row[static_cast<size_t>(id)] - log_z;
  std::vector<int32_t> order(row.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  const size_t top = std::min(order.size(), static_cast<size_t>(k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
                    [&](int32_t a, int32_t b) { return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)]; });
  for (size_t i = 0; i < top; ++i) {
    out.top.emplace_back(order[i], row[static_cast<size_t>(order[i])] - log_z);
  }
  return out;
}

}  // namespace

struct Engine::Request {
  Request(Sampler sampler, TextStream text) : sampler(std::move(sampler)), text(std::move(text)) {}

  Sequence sequence;
  int64_t prompt_tokens = 0;
  GenerationOptions options;
  Sampler sampler;
  TextStream text;
  Generation out;
  // Images (vision-language models): their pixels, the prompt's pad runs, the prompt's M-RoPE
  // positions, and the images' features while a prefill still needs them.
  std::vector<ProcessedImage> images;
  PadRuns pad_runs;
  RopeIndex rope;
  std::optional<ImageFeatures> features;
  int64_t features_row = 0;  // the pad (counted over the prompt) of the features' first row
  Clock::time_point added, scheduled, first_token;
  bool was_scheduled = false;
  bool sampled = false;
  bool cancelled = false;
  // Overlapped steps: the sequence's last token is a placeholder for the token at row fed_row of
  // the step in flight, until collect() reads it.
  bool placeholder = false;
  int64_t fed_row = -1;
  bool device_path() const { return kuiper::device_path(sampler, options, !images.empty()); }
};

// One span of a step with its model input (and the 3-D positions that input points at).
struct Engine::Entry {
  Request* request = nullptr;
  ScheduledSpan span;
  SequenceInput input;
  std::vector<int32_t> rope_positions;
};

Result<std::unique_ptr<Engine>> Engine::create(Model& model, Tokenizer tokenizer,
                                               const EngineOptions& options) {
  if (options.max_batch < 1) {
    return Status::Error("max_batch must be at least 1, not " + std::to_string(options.max_batch));
  }
  if (options.max_batch_tokens < 1) {
    return Status::Error("max_batch_tokens must be at least 1, not " +
                         std::to_string(options.max_batch_tokens));
  }
  if (model.kv_blocks() < 1 || model.kv_block_size() < 1) {
    return Status::Error("the model has no KV cache blocks");
  }
  return std::unique_ptr<Engine>(new Engine(model, std::move(tokenizer), options));
}

Engine::Engine(Model& model, Tokenizer tokenizer, const EngineOptions& options)
    : model_(model),
      tokenizer_(std::move(tokenizer)),
      max_context_(std::min(model.max_context(), model.kv_blocks() * model.kv_block_size())),
      pool_(model.kv_block_size(), model.kv_blocks()),
      scheduler_(pool_, SchedulerOptions{options.max_batch, options.max_batch_tokens}),
      overlap_steps_(options.overlap_steps) {
  for (int64_t id : model_.config().eos_token_ids) end_tokens_.insert(static_cast<int32_t>(id));
  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    if (std::optional<int32_t> id = tokenizer_.token_id(name)) end_tokens_.insert(*id);
  }
}

Engine::~Engine() = default;

const std::vector<TokenLogprob>* Engine::logprobs(int64_t id) const {
  const auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second->out.logprobs;
}

Result<int64_t> Engine::add_request(std::vector<int32_t> prompt,
                                    std::vector<ProcessedImage> images,
                                    const GenerationOptions& options, TextCallback on_text) {
  if (prompt.empty()) return Status::Error("the prompt is empty");
  const ModelConfig& config = model_.config();
  const bool vision = config.vision.has_value();
  if (!vision && !images.empty()) {
    return Status::Error(std::string("a ") + architecture_name(config.arch) +
                         " model takes no images");
  }
  const int32_t image_pad = vision ? static_cast<int32_t>(config.image_token_id) : -1;
  if (vision) {
    KUIPER_RETURN_IF_ERROR(check_image_pads(prompt, image_pad, image_tokens(config, images)));
  }
  if (static_cast<int64_t>(prompt.size()) > max_context_) {
    return Status::Error("the prompt is " + std::to_string(prompt.size()) +
                         " tokens, longer than the context of " + std::to_string(max_context_) +
                         " tokens");
  }
  if (options.max_tokens == 0 || options.max_tokens < -1) {
    return Status::Error("max_tokens must be > 0 or -1 (no limit), not " +
                         std::to_string(options.max_tokens));
  }
  for (const std::string& stop : options.stop) {
    if (stop.empty()) return Status::Error("a stop string is empty");
  }
  if (options.logprobs < -1) {
    return Status::Error("logprobs must be >= 0 or -1 (none), not " +
                         std::to_string(options.logprobs));
  }
  KUIPER_ASSIGN_OR_RETURN(Sampler sampler, Sampler::create(options.sampling));
  auto request = std::make_unique<Request>(
      std::move(sampler), TextStream(tokenizer_, options.stop, std::move(on_text)));
  Request& r = *request;
  r.added = Clock::now();
  r.options = options;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::vector<uint64_t> fingerprints;
  if (!images.empty()) {
    std::vector<std::array<int64_t, 3>> grids;
    for (const ProcessedImage& image : images) {
      fingerprints.push_back(image_fingerprint(image));
      grids.push_back(image.grid);
    }
    KUIPER_ASSIGN_OR_RETURN(r.rope, qwen3_vl_rope_index(prompt, image_pad,
                                                        config.vision->spatial_merge_size, grids));
    r.pad_runs = image_pad_runs(prompt, image_pad);
    r.images = std::move(images);
  }
  r.sequence.id = next_id_++;
  r.sequence.keys = token_keys(prompt, image_pad, fingerprints);
  r.sequence.tokens = std::move(prompt);
  r.out.stats.prompt_tokens = r.prompt_tokens;
  scheduler_.add(&r.sequence);
  if (!r.device_path()) ++host_path_;
  const int64_t id = r.sequence.id;
  requests_.emplace(id, std::move(request));
  return id;
}

void Engine::cancel(int64_t id) {
  const auto it = requests_.find(id);
  if (it != requests_.end() && !it->second->cancelled) {
    it->second->cancelled = true;
    ++cancelled_;
  }
}

void Engine::finish_cancelled(std::vector<FinishedRequest>* finished) {
  if (cancelled_ == 0) return;  // a walk over every request only when one was cancelled
  std::vector<Request*> cancelled;
  for (const auto& [id, request] : requests_) {
    if (request->cancelled) cancelled.push_back(request.get());
  }
  for (Request* r : cancelled) finish(*r, FinishReason::kInterrupted, finished);
  cancelled_ = 0;
}

Status Engine::prepare(Request& r, const ScheduledSpan& span, Entry* entry) {
  const Sequence& s = r.sequence;
  SequenceInput& in = entry->input;
  in.tokens = Span<const int32_t>(s.tokens.data() + span.start, static_cast<size_t>(span.count));
  in.start = span.start;
  in.blocks = s.blocks.blocks();
  in.logits = span.samples() ? LogitRows::kLast : LogitRows::kNone;
  if (r.images.empty()) return Status::Ok();
  // M-RoPE: prompt tokens at their 3-D positions, later ones at position + the prompt's delta.
  const int64_t P = r.prompt_tokens, end = span.start + span.count;
  const int64_t pads = pads_before(r.pad_runs, end) - pads_before(r.pad_runs, span.start);
  if (pads == 0) {
    // Text only: every token of the span has the same delta (it changes only after an image).
    in.rope_offset = span.start < P ? r.rope.positions[static_cast<size_t>(span.start)] - span.start
                                    : r.rope.delta;
    return Status::Ok();
  }
  const int64_t row = pads_before(r.pad_runs, span.start);
  if (!r.features || row < r.features_row) {
    // The images from the first one the cache does not hold whole (the prefix cache may hold
    // the others; after a preemption it may hold fewer than when they were encoded).
    size_t first = 0;
    while (static_cast<int64_t>(r.pad_runs[first].second) <= span.start) ++first;
    const std::vector<ProcessedImage> fresh(r.images.begin() + static_cast<std::ptrdiff_t>(first),
                                            r.images.end());
    KUIPER_ASSIGN_OR_RETURN(ImagePixels pixels, image_pixels(fresh));
    KUIPER_ASSIGN_OR_RETURN(ImageFeatures features, model_.encode_images(pixels));
    r.features = std::move(features);
    r.features_row = pads_before(r.pad_runs, static_cast<int64_t>(r.pad_runs[first].first));
  }
  std::vector<int32_t>& rope = entry->rope_positions;
  rope.resize(static_cast<size_t>(3 * span.count));
  for (int64_t a = 0; a < 3; ++a) {
    for (int64_t t = 0; t < span.count; ++t) {
      const int64_t i = span.start + t;
      rope[static_cast<size_t>(a * span.count + t)] =
          i < P ? r.rope.positions[static_cast<size_t>(a * P + i)]
                : static_cast<int32_t>(i + r.rope.delta);
    }
  }
  in.rope_positions = rope;
  in.image = &*r.features;
  in.image_row = row - r.features_row;
  return Status::Ok();
}

int64_t Engine::live_tokens() {
  const int64_t block_size = pool_.block_size();
  block_fill_.resize(static_cast<size_t>(pool_.blocks()), 0);
  touched_blocks_.clear();
  for (const auto& [id, request] : requests_) {
    const Sequence& s = request->sequence;
    const std::vector<int32_t>& blocks = s.blocks.blocks();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const int64_t held = std::min(block_size, s.computed - static_cast<int64_t>(i) * block_size);
      if (held <= 0) break;
      int32_t& fill = block_fill_[static_cast<size_t>(blocks[i])];
      if (fill == 0) touched_blocks_.push_back(blocks[i]);
      fill = std::max(fill, static_cast<int32_t>(held));
    }
  }
  int64_t total = 0;
  for (const int32_t b : touched_blocks_) {
    total += block_fill_[static_cast<size_t>(b)];
    block_fill_[static_cast<size_t>(b)] = 0;
  }
  return total;
}

Result<std::vector<FinishedRequest>> Engine::step() {
  std::vector<FinishedRequest> finished;
  StepStats read;  // the step (or steps) whose tokens this call reads
  bool launched = false;
  if (in_flight_) {
    // The last step's tokens are still on their way: launch the step after it on them, then
    // read them and advance their requests while the device works.
    const Clock::time_point start = Clock::now();
    Launched last = std::move(*in_flight_);
    in_flight_.reset();
    KUIPER_ASSIGN_OR_RETURN(in_flight_, launch_next(last, &finished));
    launched = in_flight_.has_value();
    KUIPER_RETURN_IF_ERROR(collect(last, &finished));
    read = last.stats;
    read.forward_seconds = seconds_between(start, Clock::now());
  }
  finish_cancelled(&finished);
  if (!launched) KUIPER_RETURN_IF_ERROR(schedule_and_run(&read, &finished));
  last_step_ = read;
  last_step_.used_blocks = pool_.blocks() - pool_.available();
  return finished;
}

namespace {

// The step's decode and prefill token counts.
StepStats span_stats(const std::vector<ScheduledSpan>& spans) {
  StepStats stats;
  for (const ScheduledSpan& span : spans) {
    const bool decode = span.count == 1 && span.samples();
    (decode ? stats.decode_tokens : stats.prefill_tokens) += span.count;
  }
  return stats;
}

}  // namespace

void Engine::prepare_spans(const std::vector<ScheduledSpan>& spans, std::vector<Entry>* entries,
                           std::vector<Entry*>* ready, std::vector<FinishedRequest>* finished) {
  const Clock::time_point now = Clock::now();
  entries->assign(spans.size(), Entry());
  ready->clear();
  for (size_t i = 0; i < spans.size(); ++i) {
    Request& r = *requests_.at(spans[i].sequence->id);
    if (!r.was_scheduled) {
      r.was_scheduled = true;
      r.scheduled = now;
      r.out.stats.prefilled_tokens = r.prompt_tokens - spans[i].start;
    }
    Entry& e = (*entries)[i];
    e.request = &r;
    e.span = spans[i];
    const Status prepared = prepare(r, spans[i], &e);
    if (!prepared.ok()) {
      fail(r, prepared, finished);
      continue;
    }
    if (r.placeholder && spans[i].start + spans[i].count == r.sequence.size()) {
      e.input.fed = r.fed_row;
    }
    ready->push_back(&e);
  }
}

Status Engine::schedule_and_run(StepStats* read, std::vector<FinishedRequest>* finished) {
  const std::vector<ScheduledSpan> spans = scheduler_.schedule();
  StepStats stats = span_stats(spans);
  if (spans.empty()) {
    if (scheduler_.idle()) return Status::Ok();
    return Status::Error("engine: " + std::to_string(scheduler_.waiting()) +
                         " requests wait but none fits in the KV pool of " +
                         std::to_string(pool_.blocks()) + " blocks");
  }
  std::vector<Entry> entries;
  std::vector<Entry*> ready;
  prepare_spans(spans, &entries, &ready, finished);
  if (ready.empty()) return Status::Ok();
  const Clock::time_point forward_start = Clock::now();
  const Status status = run(ready, finished, /*may_overlap=*/true);
  stats.forward_seconds = seconds_between(forward_start, Clock::now());
  if (in_flight_) {
    in_flight_->stats = stats;  // the call that reads its tokens reports it
  } else {
    read->decode_tokens += stats.decode_tokens;
    read->prefill_tokens += stats.prefill_tokens;
    read->forward_seconds += stats.forward_seconds;
  }
  if (!status.ok()) {
    if (ready.size() == 1) {
      fail(*ready[0]->request, status, finished);
    } else {
      // A failed forward wrote nothing that any request counts on: run each span alone to find
      // whose it was (check_batch names an entry, but not every error can).
      for (Entry* e : ready) {
        const std::vector<Entry*> one = {e};
        const Status alone = run(one, finished, /*may_overlap=*/false);
        if (!alone.ok()) fail(*e->request, alone, finished);
      }
    }
  }
  return Status::Ok();
}

Status Engine::launch(const std::vector<Entry*>& entries, const Tensor* fed, Launched* step) {
  std::vector<SequenceInput> batch;
  batch.reserve(entries.size());
  bool feeds = false;  // a step after one that sampled nothing has no tokens to feed
  for (const Entry* e : entries) {
    batch.push_back(e->input);
    feeds = feeds || e->input.fed >= 0;
  }
  KUIPER_ASSIGN_OR_RETURN(const Tensor logits,
                          feeds && fed != nullptr ? model_.forward(batch, *fed)
                                                  : model_.forward(batch));
  const int slot = next_slot_;
  next_slot_ ^= 1;
  const int64_t n = logits.dim(0);
  if (n > 0) {
    Tensor& tokens = step_tokens_[slot];
    if (!tokens.defined() || tokens.device() != logits.device() || tokens.numel() < n) {
      KUIPER_ASSIGN_OR_RETURN(tokens, Tensor::empty({n}, DataType::kInt32, logits.device()));
    }
    Tensor rows = tokens.rows(0, n);
    // Every row the arg-max where all take it; else every row through op::sample_rows (the
    // arg-max rows at temperature 0), each drawing request's uniform from its own generator, once
    // a token as in turn.
    std::vector<op::SampleRow> sample_rows;
    std::vector<int32_t> recent;  // no penalty on this path: no window
    int64_t row = 0;
    bool draws = false;
    for (const Entry* e : entries) {
      if (e->input.logits != LogitRows::kLast) continue;
      Sampler& sampler = e->request->sampler;
      if (plain_argmax(sampler)) {
        sample_rows.push_back(op::SampleRow{});
        sample_rows.back().row = row;
      } else {
        sample_rows.push_back(sampler.sample_row(row, e->request->sequence.tokens, &recent));
        draws = true;
      }
      ++row;
    }
    if (draws) {
      KUIPER_RETURN_IF_ERROR(op::sample_rows(logits, sample_rows, recent, sample_workspace_, rows));
    } else {
      KUIPER_RETURN_IF_ERROR(op::argmax(logits, rows));
    }
    KUIPER_RETURN_IF_ERROR(reads_[slot].start(rows.raw(), rows.device(),
                                              static_cast<size_t>(n) * sizeof(int32_t)));
  }
  step->slot = slot;
  step->ids.clear();
  step->spans.clear();
  step->rows.clear();
  int64_t row = 0;
  for (const Entry* e : entries) {
    step->ids.push_back(e->request->sequence.id);
    step->spans.push_back(e->span);
    step->rows.push_back(e->input.logits == LogitRows::kLast ? row++ : -1);
  }
  return Status::Ok();
}

Result<std::optional<Engine::Launched>> Engine::launch_next(
    Launched& last, std::vector<FinishedRequest>* finished) {
  if (!overlap_steps_ || cancelled_ > 0 || host_path_ > 0) return std::optional<Launched>();
  // last's spans ran (on the device, in order before anything launched now), but those of
  // requests that ended on tokens read since it was launched.
  for (size_t i = 0; i < last.ids.size(); ++i) {
    if (requests_.count(last.ids[i]) != 0) scheduler_.completed(last.spans[i]);
  }
  last.completed = true;
  // Each request that samples in `last` and goes on holds a placeholder for that token (collect
  // puts the token in its place); one sure to end on it sits the next step out.
  for (size_t i = 0; i < last.ids.size(); ++i) {
    const auto it = requests_.find(last.ids[i]);
    if (last.rows[i] < 0 || it == requests_.end()) continue;
    Request& r = *it->second;
    const auto generated = static_cast<int64_t>(r.out.ids.size());
    if (r.options.max_tokens > 0 && generated + 1 >= r.options.max_tokens) continue;
    if (r.sequence.size() >= max_context_) continue;  // its token would be the context's last
    r.sequence.append(0);
    r.placeholder = true;
    r.fed_row = last.rows[i];
  }
  const std::vector<ScheduledSpan> spans = scheduler_.schedule();
  if (spans.empty()) return std::optional<Launched>();
  std::vector<Entry> entries;
  std::vector<Entry*> ready;
  prepare_spans(spans, &entries, &ready, finished);
  if (ready.empty()) return std::optional<Launched>();
  const Clock::time_point start = Clock::now();
  Launched next;
  KUIPER_RETURN_IF_ERROR(launch(ready, &step_tokens_[last.slot], &next));
  next.stats = span_stats(spans);
  next.stats.forward_seconds = seconds_between(start, Clock::now());
  return std::optional<Launched>(std::move(next));
}

Status Engine::collect(Launched& step, std::vector<FinishedRequest>* finished) {
  const int32_t* tokens = nullptr;
  if (std::any_of(step.rows.begin(), step.rows.end(), [](int64_t row) { return row >= 0; })) {
    KUIPER_ASSIGN_OR_RETURN(const void* host, reads_[step.slot].wait());
    tokens = static_cast<const int32_t*>(host);
  }
  for (size_t i = 0; i < step.ids.size(); ++i) {
    const auto it = requests_.find(step.ids[i]);
    if (it == requests_.end()) continue;  // it ended on the tokens read before: its row is unused
    Request& r = *it->second;
    if (!step.completed) scheduler_.completed(step.spans[i]);
    if (step.rows[i] < 0) continue;
    if (r.placeholder) {  // the placeholder gives way to the token
      r.sequence.tokens.pop_back();
      r.sequence.keys.pop_back();
      r.placeholder = false;
      r.fed_row = -1;
    }
    advance(r, tokens[step.rows[i]], nullptr, finished);
  }
  return Status::Ok();
}

Status Engine::run(const std::vector<Entry*>& entries, std::vector<FinishedRequest>* finished,
                   bool may_overlap) {
  // A step whose every request takes the arg-max leaves its tokens on the device, so that the
  // next call can launch the step after it before reading them.
  bool overlap = may_overlap && overlap_steps_;
  for (const Entry* e : entries) {
    overlap = overlap && e->request->device_path() && e->input.logits != LogitRows::kAll &&
              e->input.image == nullptr;
  }
  if (overlap) {
    Launched step;
    KUIPER_RETURN_IF_ERROR(launch(entries, nullptr, &step));
    in_flight_ = std::move(step);
    return Status::Ok();
  }
  std::vector<SequenceInput> batch;
  batch.reserve(entries.size());
  for (const Entry* e : entries) batch.push_back(e->input);
  KUIPER_ASSIGN_OR_RETURN(const Tensor logits, model_.forward(batch));
  // Greedy requests with no penalty take the arg-max of their row: one op over every row and one
  // copy back for the whole batch, rather than a sampling call (and a copy) per request.
  int64_t argmax_rows = 0;
  for (const Entry* e : entries) {
    if (e->input.logits == LogitRows::kLast && plain_argmax(e->request->sampler)) ++argmax_rows;
  }
  std::vector<int32_t> argmax;
  if (argmax_rows > 1) {
    KUIPER_ASSIGN_OR_RETURN(Tensor ids,
                            Tensor::empty({logits.dim(0)}, DataType::kInt32, logits.device()));
    KUIPER_RETURN_IF_ERROR(op::argmax(logits, ids));
    KUIPER_ASSIGN_OR_RETURN(const Tensor host, ids.to(DeviceType::kCpu));
    argmax.assign(host.data<int32_t>(), host.data<int32_t>() + host.numel());
  }
  // Every other row the device can sample goes through one op::sample_rows call and one copy
  // back (a lone plain greedy row keeps op::sample's arg-max, which needs no sort). Each request
  // still draws its uniform from its own generator, once a step as alone, so a seed gives the
  // same tokens whatever else is in the batch.
  std::vector<op::SampleRow> sample_rows;
  std::vector<int32_t> recent;
  std::vector<int64_t> sampled_at(static_cast<size_t>(logits.dim(0)), -1);  // row -> its index
  int64_t row = 0;
  for (const Entry* e : entries) {
    if (e->input.logits != LogitRows::kLast) continue;
    const int64_t at = row++;
    Sampler& sampler = e->request->sampler;
    if (plain_argmax(sampler) || !sampler.samples_on_device()) continue;
    sampled_at[static_cast<size_t>(at)] = static_cast<int64_t>(sample_rows.size());
    sample_rows.push_back(sampler.sample_row(at, e->request->sequence.tokens, &recent));
  }
  std::vector<int32_t> sampled;
  Status sampled_status = Status::Ok();
  if (!sample_rows.empty()) {
    sampled_status = sample_batch(logits, sample_rows, recent, &sampled);
  }
  row = 0;
  for (Entry* e : entries) {
    Request& r = *e->request;
    scheduler_.completed(e->span);
    if (r.features && r.sequence.computed >= static_cast<int64_t>(r.pad_runs.back().second)) {
      r.features.reset();  // the prefill is past the last image
    }
    if (e->input.logits != LogitRows::kLast) continue;
    const int64_t at = row++;
    const int64_t batched = sampled_at[static_cast<size_t>(at)];
    auto token = [&]() -> Result<int32_t> {
      if (batched >= 0) {
        KUIPER_RETURN_IF_ERROR(sampled_status);
        return sampled[static_cast<size_t>(batched)];
      }
      if (!argmax.empty() && plain_argmax(r.sampler)) return argmax[static_cast<size_t>(at)];
      return r.sampler.sample(logits.rows(at, 1), r.sequence.tokens);
    };
    Result<int32_t> id = token();
    if (!id.ok()) {
      fail(r, id.status(), finished);
      continue;
    }
    std::optional<TokenLogprob> logprob;
    if (r.options.logprobs >= 0) {
      const Tensor row_logits = logits.rows(at, 1);
      logits_row_.resize(static_cast<size_t>(row_logits.numel()));
      const Status copied = Tensor::view(logits_row_.data(), row_logits.shape(), DataType::kFp32,
                                         DeviceType::kCpu)
                                .copy_from(row_logits);
      if (!copied.ok()) {
        fail(r, copied, finished);
        continue;
      }
      logprob = logprob_of(logits_row_, *id, r.options.logprobs);
    }
    advance(r, *id, logprob ? &*logprob : nullptr, finished);
  }
  return Status::Ok();
}

Status Engine::sample_batch(const Tensor& logits, const std::vector<op::SampleRow>& rows,
                            const std::vector<int32_t>& recent, std::vector<int32_t>* tokens) {
  const int64_t n = static_cast<int64_t>(rows.size());
  if (!sampled_.defined() || sampled_.device() != logits.device() || sampled_.numel() < n) {
    KUIPER_ASSIGN_OR_RETURN(sampled_, Tensor::empty({n}, DataType::kInt32, logits.device()));
  }
  Tensor out = sampled_.rows(0, n);
  KUIPER_RETURN_IF_ERROR(op::sample_rows(logits, rows, recent, sample_workspace_, out));
  tokens->resize(static_cast<size_t>(n));
  return Tensor::view(tokens->data(), {n}, DataType::kInt32, DeviceType::kCpu).copy_from(out);
}

void Engine::advance(Request& r, int32_t id, TokenLogprob* logprob,
                     std::vector<FinishedRequest>* finished) {
  GenerationStats& stats = r.out.stats;
  if (!r.sampled) {
    const Clock::time_point now = Clock::now();
    r.sampled = true;
    r.first_token = now;
    stats.first_token_seconds = seconds_between(r.added, now);
    stats.prefill_seconds = seconds_between(r.scheduled, now);
  } else {
    ++stats.decode_steps;
  }
  if (!r.options.ignore_eos && is_end_token(id)) {
    return finish(r, FinishReason::kEndToken, finished);
  }
  r.out.ids.push_back(id);
  if (logprob != nullptr) r.out.logprobs.push_back(std::move(*logprob));
  r.sequence.append(id);
  if (r.text.feed(id)) return finish(r, FinishReason::kStopString, finished);
  if (r.options.max_tokens > 0 && static_cast<int64_t>(r.out.ids.size()) >= r.options.max_tokens) {
    return finish(r, FinishReason::kMaxTokens, finished);
  }
  // The new token would run at position size - 1.
  if (r.sequence.size() - 1 >= max_context_) return finish(r, FinishReason::kContextFull, finished);
}

void Engine::finish(Request& r, FinishReason reason, std::vector<FinishedRequest>* finished) {
  if (reason != FinishReason::kStopString && r.text.finish()) reason = FinishReason::kStopString;
  Generation& out = r.out;
  out.finish = reason;
  out.text = r.text.text();
  out.stats.generated_tokens = static_cast<int64_t>(out.ids.size());
  if (out.stats.decode_steps > 0) {
    out.stats.decode_seconds = seconds_between(r.first_token, Clock::now());
  }
  const int64_t id = r.sequence.id;
  finished->push_back({id, std::move(out), r.sequence.computed});
  if (!r.device_path()) --host_path_;
  scheduler_.remove(&r.sequence);
  requests_.erase(id);
}

void Engine::fail(Request& r, const Status& error, std::vector<FinishedRequest>* finished) {
  const int64_t id = r.sequence.id;
  finished->push_back({id, error, r.sequence.computed});
  if (!r.device_path()) --host_path_;
  scheduler_.remove(&r.sequence);
  requests_.erase(id);
}

}  // namespace kuiper
