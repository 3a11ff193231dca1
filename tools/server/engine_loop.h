// The engine thread of kuiper-server. One thread owns the Engine and runs step() while there is
// work; HTTP threads never touch the Engine: they post requests and cancellations into a
// mutex-protected inbox, and read each request's text and finish from its own Channel (a
// mutex and a condition variable), so a slow or gone client never holds up the batch.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kuiper/runtime/engine.h"
#include "tools/server/metrics.h"

namespace kuiper::server {

// One engine request as the HTTP side sees it. The engine thread appends text and finally sets
// the result; the HTTP thread takes them.
class Channel {
 public:
  struct Update {
    std::string text;                        // new text since the last take
    std::vector<TokenLogprob> logprobs;      // new tokens' log-probabilities (when asked for)
    std::optional<FinishedRequest> finished;  // set once, with the last take
  };
  // Waits up to `timeout` for new text or the finish, and takes what there is.
  Update take(std::chrono::milliseconds timeout);

  // Engine side.
  void append(const std::string& text);
  void append_logprobs(const TokenLogprob* begin, const TokenLogprob* end);
  void finish(FinishedRequest finished);

  std::vector<int32_t> prompt;
  std::vector<ProcessedImage> images;
  GenerationOptions options;
  std::chrono::steady_clock::time_point submitted;
  std::string log_id;  // the API's id (chatcmpl-...), for the log line
  size_t logprobs_seen = 0;  // engine thread: log-probabilities appended so far

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string text_;
  std::vector<TokenLogprob> logprobs_;
  std::optional<FinishedRequest> finished_;
};

class EngineLoop {
 public:
  // `capacity`: how many requests may be in flight (running, or waiting in the inbox or the
  // engine's queue: --max-batch + --max-queue) before submit() refuses more. Counting every
  // request in flight rather than the engine's queue keeps the count exact between steps.
  EngineLoop(Engine& engine, int64_t capacity, Metrics& metrics);
  ~EngineLoop();

  void start();
  // Waits until every submitted request finished, then stops the thread.
  void stop();

  // Posts `channel`'s request; false (posting nothing) when the queue is full or the loop is
  // stopping.
  bool submit(const std::shared_ptr<Channel>& channel);
  // Ends the request at the engine's next step (it finishes as cancelled); a request still in
  // the inbox never reaches the engine.
  void cancel(const std::shared_ptr<Channel>& channel);
  // Cancels every request (the end of the shutdown grace period).
  void cancel_all();
  // False once the engine failed as a whole (every request since fails).
  bool healthy() const;
  // Requests submitted and not yet finished.
  int64_t in_flight() const;
  // The most requests in flight at once (the constructor's capacity).
  int64_t capacity() const { return capacity_; }

 private:
  void run();
  // Engine thread: adds the inbox's requests, applies the cancellations.
  void admit(std::deque<std::shared_ptr<Channel>>* inbox,
             std::vector<std::shared_ptr<Channel>>* cancels);
  void report(FinishedRequest finished);
  void publish_gauges(int64_t inbox_size);

  Engine& engine_;
  const int64_t capacity_;
  Metrics& metrics_;
  std::thread thread_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Channel>> inbox_;
  std::vector<std::shared_ptr<Channel>> cancels_;
  bool cancel_all_ = false;
  bool stopping_ = false;
  bool healthy_ = true;
  int64_t in_flight_ = 0;

  // Engine thread only.
  std::unordered_map<int64_t, std::shared_ptr<Channel>> running_;  // engine id -> channel
};

}  // namespace kuiper::server
