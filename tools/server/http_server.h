// kuiper-server's HTTP side (cpp-httplib): the OpenAI routes, authentication, and the handlers
// that turn an API request into engine requests on the EngineLoop and their results into JSON
// or server-sent events. Handlers wait on their requests' Channels, never on the engine; a
// client that goes away (a failed write, or its socket closed while it waits) cancels its
// requests, which frees their KV blocks at the engine's next step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "kuiper/runtime/engine.h"
#include "kuiper/runtime/vision_input.h"
#include "kuiper/tokenizer/chat_template.h"
#include "tools/server/engine_loop.h"
#include "tools/server/metrics.h"

namespace httplib {
class Server;
}

namespace kuiper::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() says which)
  std::string api_key;  // empty: no authentication
  std::string model_name;  // the name /v1/models lists and requests must use
  int http_threads = 64;  // connections served at once
};

class HttpServer {
 public:
  // Everything passed must outlive the server. `vision` is null for a model without images;
  // `chat` holds the command line's template variables (a request's chat_template_kwargs add
  // to them).
  HttpServer(const Engine& engine, ChatTemplate chat_template, ChatOptions chat,
             const ImageInput* vision, EngineLoop& loop, Metrics& metrics, ServerOptions options);
  ~HttpServer();

  // Binds the address; fails naming it.
  Status bind();
  int port() const { return port_; }
  // Serves until stop().
  void listen();
  // Shutting down, first step: new completion requests are refused (503) while the ones in
  // flight go on. (cpp-httplib's stop() would cut their streams short.)
  void drain() { draining_ = true; }
  // Completion requests whose responses are not yet fully written.
  int active() const { return active_; }
  // Stops serving (safe from any thread); listen() returns.
  void stop();

 private:
  void routes();

  const Engine& engine_;
  ChatTemplate chat_template_;
  ChatOptions chat_;
  const ImageInput* vision_;
  EngineLoop& loop_;
  Metrics& metrics_;
  ServerOptions options_;
  int port_ = 0;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
  std::unique_ptr<httplib::Server> http_;
};

}  // namespace kuiper::server
