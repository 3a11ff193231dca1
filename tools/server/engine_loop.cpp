#include "tools/server/engine_loop.h"

#include <glog/logging.h>

namespace kuiper::server {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Channel::Update Channel::take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, timeout, [&] {
    return !text_.empty() || !logprobs_.empty() || finished_.has_value();
  });
  Update update;
  update.text.swap(text_);
  update.logprobs.swap(logprobs_);
  if (finished_) {
    update.finished = std::move(finished_);
    finished_.reset();
  }
  return update;
}

void Channel::append(const std::string& text) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    text_ += text;
  }
  changed_.notify_all();
}

void Channel::append_logprobs(const TokenLogprob* begin, const TokenLogprob* end) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    logprobs_.insert(logprobs_.end(), begin, end);
  }
  changed_.notify_all();
}

void Channel::finish(FinishedRequest finished) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = std::move(finished);
  }
  changed_.notify_all();
}

EngineLoop::EngineLoop(Engine& engine, int64_t capacity, Metrics& metrics)
    : engine_(engine), capacity_(capacity), metrics_(metrics) {}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::start() {
  publish_gauges(0);
  thread_ = std::thread([this] { run(); });
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool EngineLoop::submit(const std::shared_ptr<Channel>& channel) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    if (in_flight_ >= capacity_) return false;
    inbox_.push_back(channel);
    ++in_flight_;
  }
  wake_.notify_all();
  return true;
}

void EngineLoop::cancel(const std::shared_ptr<Channel>& channel) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.push_back(channel);
  }
  wake_.notify_all();
}

void EngineLoop::cancel_all() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancel_all_ = true;
  }
  wake_.notify_all();
}

bool EngineLoop::healthy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return healthy_;
}

int64_t EngineLoop::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_;
}

void EngineLoop::report(FinishedRequest f) {
  const auto it = running_.find(f.id);
  if (it == running_.end()) return;
  const std::shared_ptr<Channel> channel = it->second;
  running_.erase(it);
  const double e2e = seconds_since(channel->submitted);
  std::string status = "error";
  if (f.generation.ok()) {
    const Generation& g = *f.generation;
    const GenerationStats& s = g.stats;
    status = g.finish == FinishReason::kInterrupted ? "cancelled" : "ok";
    const double itl = s.decode_steps > 0 ? s.decode_seconds / static_cast<double>(s.decode_steps)
                                          : 0.0;
    metrics_.finished(status, s.prompt_tokens, s.generated_tokens, s.first_token_seconds, itl,
                      s.decode_steps, e2e);
    LOG(INFO) << "request " << channel->log_id << " engine " << f.id << ": prompt "
              << s.prompt_tokens << " tokens (" << s.prompt_tokens - s.prefilled_tokens
              << " cached), output " << s.generated_tokens << " tokens, ttft "
              << s.first_token_seconds * 1e3 << " ms, duration " << e2e * 1e3 << " ms, "
              << status << " (" << finish_reason_name(g.finish) << ")";
  } else {
    metrics_.finished(status, static_cast<int64_t>(channel->prompt.size()), 0, 0.0, 0.0, 0, e2e);
    LOG(WARNING) << "request " << channel->log_id << " engine " << f.id << ": prompt "
                 << channel->prompt.size() << " tokens, duration " << e2e * 1e3
                 << " ms, error: " << f.generation.status().message();
  }
  channel->finish(std::move(f));
  std::lock_guard<std::mutex> lock(mutex_);
  --in_flight_;
}

void EngineLoop::admit(std::deque<std::shared_ptr<Channel>>* inbox,
                       std::vector<std::shared_ptr<Channel>>* cancels) {
  auto cancelled = [&](const std::shared_ptr<Channel>& c) {
    for (const auto& x : *cancels) {
      if (x == c) return true;
    }
    return false;
  };
  for (std::shared_ptr<Channel>& channel : *inbox) {
    if (cancelled(channel)) {
      // Never reached the engine: finished here, as the engine would report it.
      Generation g;
      g.finish = FinishReason::kInterrupted;
      g.stats.prompt_tokens = static_cast<int64_t>(channel->prompt.size());
      running_[-1] = channel;
      report({-1, std::move(g), 0});
      continue;
    }
    Channel* raw = channel.get();
    Result<int64_t> id = engine_.add_request(channel->prompt, std::move(channel->images),
                                             channel->options,
                                             [raw](const std::string& text) { raw->append(text); });
    if (!id.ok()) {
      running_[-1] = channel;
      report({-1, id.status(), 0});
      continue;
    }
    channel->images.clear();
    running_[*id] = channel;
  }
  for (const std::shared_ptr<Channel>& channel : *cancels) {
    for (const auto& [id, c] : running_) {
      if (c == channel) {
        engine_.cancel(id);
        break;
      }
    }
  }
}

void EngineLoop::publish_gauges(int64_t inbox_size) {
  EngineGauges g;
  g.running = static_cast<int64_t>(engine_.running());
  g.waiting = static_cast<int64_t>(engine_.waiting()) + inbox_size;
  g.kv_blocks_total = engine_.pool().blocks();
  g.kv_blocks_used = g.kv_blocks_total - engine_.pool().available();
  g.kv_block_size = engine_.pool().block_size();
  g.prefix_cache_hit_rate = engine_.stats().cached_fraction();
  metrics_.set_gauges(g);
}

void EngineLoop::run() {
  for (;;) {
    std::deque<std::shared_ptr<Channel>> inbox;
    std::vector<std::shared_ptr<Channel>> cancels;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return !inbox_.empty() || !cancels_.empty() || cancel_all_ || stopping_ ||
               engine_.unfinished() > 0;
      });
      if (stopping_ && inbox_.empty() && engine_.unfinished() == 0) return;
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      if (cancel_all_) {
        for (const auto& [id, c] : running_) cancels.push_back(c);
        for (const auto& c : inbox) cancels.push_back(c);
      }
    }
    admit(&inbox, &cancels);
    if (engine_.unfinished() > 0) {
      Result<std::vector<FinishedRequest>> step = engine_.step();
      if (step.ok()) {
        // The running requests' new log-probabilities go out with their text; a finished
        // request's last ones come with its finish.
        for (const auto& [id, c] : running_) {
          const std::vector<TokenLogprob>* lps = engine_.logprobs(id);
          if (c->options.logprobs < 0 || lps == nullptr || lps->size() <= c->logprobs_seen) {
            continue;
          }
          c->append_logprobs(lps->data() + c->logprobs_seen, lps->data() + lps->size());
          c->logprobs_seen = lps->size();
        }
        for (FinishedRequest& f : *step) report(std::move(f));
      } else {
        LOG(ERROR) << "the engine failed: " << step.status().message()
                   << "; its requests fail, and the server reports itself unhealthy";
        {
          std::lock_guard<std::mutex> lock(mutex_);
          healthy_ = false;
        }
        std::vector<int64_t> ids;
        for (const auto& [id, c] : running_) ids.push_back(id);
        for (int64_t id : ids) {
          engine_.cancel(id);
          report({id, step.status(), 0});
        }
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    publish_gauges(static_cast<int64_t>(inbox_.size()));
  }
}

}  // namespace kuiper::server
