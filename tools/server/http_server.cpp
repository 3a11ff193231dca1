#include "tools/server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <cstring>

#include <glog/logging.h>
#include <httplib.h>

#include "kuiper/runtime/chat_session.h"
#include "tools/server/openai_api.h"

namespace kuiper::server {

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// How often a waiting handler looks at its client's socket.
constexpr std::chrono::milliseconds kPoll(20);

// The largest request body read (images come inline as data URIs).
constexpr size_t kMaxBodyBytes = size_t{64} << 20;

// The method each route answers, for the 405 a known path asked with another method gets.
const char* route_method(const std::string& path) {
  if (path == "/health" || path == "/metrics" || path == "/v1/models") return "GET";
  if (path == "/v1/chat/completions" || path == "/v1/completions") return "POST";
  return nullptr;
}

std::string dump(const Json& j) {
  // Generated text is valid UTF-8; a logprob's token may be part of a character.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(dump(error.to_json()), "application/json");
}

// Constant-time equality: the time taken does not depend on where the strings differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (b.empty() ? 0 : b[i % b.size()]));
  }
  return diff == 0;
}

// The socket of this request's connection: the one whose local port, peer address and peer
// port are the request's (cpp-httplib 0.11 does not hand handlers their socket). -1 when not
// found.
int connection_socket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || fd < 0) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
      continue;
    }
    auto port_of = [](const sockaddr_storage& a) {
      if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
      if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
      return static_cast<uint16_t>(0);
    };
    auto address_of = [](const sockaddr_storage& a) {
      char text[INET6_ADDRSTRLEN] = "";
      if (a.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof text);
      } else if (a.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, text,
                  sizeof text);
      }
      return std::string(text);
    };
    if (port_of(local) == req.local_port && port_of(peer) == req.remote_port &&
        address_of(peer) == req.remote_addr) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// Raises the accept queue of the socket listening on `port` to `backlog`. cpp-httplib 0.11
// listens with a backlog of 5 (compiled into the library): 32 clients connecting at once
// overflow it, and the connections the kernel drops come back to clients as read errors. On
// Linux, listen() again on a listening socket sets its backlog.
void raise_backlog(int port, int backlog) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || fd < 0) continue;
    int listening = 0;
    socklen_t size = sizeof listening;
    sockaddr_storage local{};
    socklen_t local_len = sizeof local;
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 ||
        !listening ||
        getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
      continue;
    }
    const uint16_t local_port =
        local.ss_family == AF_INET    ? ntohs(reinterpret_cast<const sockaddr_in&>(local).sin_port)
        : local.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6&>(local).sin6_port)
                                      : 0;
    if (local_port == port && ::listen(static_cast<int>(fd), backlog) != 0) {
      LOG(WARNING) << "cannot raise the listen backlog: " << std::strerror(errno);
    }
  }
  closedir(dir);
}

// The client closed its end (or reset it). Data it sent ahead (a pipelined request) is not a
// close.
bool peer_closed(int fd) {
  if (fd < 0) return false;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

// The engine requests of one API request (n choices) and what they produced so far. It lives
// until its response is written (the stream's provider holds it), counted in `active`.
struct Job {
  explicit Job(std::atomic<int>& active) : active(active) { ++active; }
  ~Job() { --active; }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  std::atomic<int>& active;
  ApiRequest request;
  std::string id;  // chatcmpl-... / cmpl-...
  int64_t created = 0;
  std::vector<std::shared_ptr<Channel>> channels;
  std::vector<std::string> text;  // per choice
  std::vector<std::string> echo;  // per choice: its prompt's text (echo), sent before its own
  // Per choice: log-probabilities taken but not yet sent, and how many were sent.
  std::vector<std::vector<TokenLogprob>> logprobs;
  std::vector<size_t> logprobs_sent;
  std::vector<std::optional<FinishedRequest>> finished;
  int64_t prompt_tokens = 0;
  int fd = -1;
  bool role_sent = false;  // chat: the role; completions: the echoed prompts
  bool cancelled = false;

  bool done() const {
    for (const auto& f : finished) {
      if (!f) return false;
    }
    return true;
  }
  // Takes every channel's news; `wait` bounds the wait on the first unfinished one.
  // Returns each choice's new text.
  std::vector<std::string> poll(std::chrono::milliseconds wait) {
    std::vector<std::string> fresh(channels.size());
    for (size_t i = 0; i < channels.size(); ++i) {
      if (finished[i]) continue;
      Channel::Update u = channels[i]->take(wait);
      wait = std::chrono::milliseconds(0);
      fresh[i] = std::move(u.text);
      text[i] += fresh[i];
      logprobs.resize(channels.size());
      logprobs[i].insert(logprobs[i].end(), u.logprobs.begin(), u.logprobs.end());
      if (u.finished) finished[i] = std::move(u.finished);
    }
    return fresh;
  }
  void cancel(EngineLoop& loop) {
    if (cancelled) return;
    cancelled = true;
    for (size_t i = 0; i < channels.size(); ++i) {
      if (!finished[i]) loop.cancel(channels[i]);
    }
  }
};

}  // namespace

HttpServer::HttpServer(const Engine& engine, ChatTemplate chat_template, ChatOptions chat,
                       const ImageInput* vision, EngineLoop& loop, Metrics& metrics,
                       ServerOptions options)
    : engine_(engine),
      chat_template_(std::move(chat_template)),
      chat_(std::move(chat)),
      vision_(vision),
      loop_(loop),
      metrics_(metrics),
      options_(std::move(options)),
      http_(std::make_unique<httplib::Server>()) {
  const int threads = options_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_read_timeout(30);
  http_->set_write_timeout(30);
  http_->set_keep_alive_max_count(1000);
  http_->set_payload_max_length(kMaxBodyBytes);
  routes();
}

HttpServer::~HttpServer() = default;

Status HttpServer::bind() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    if (port_ <= 0) return Status::Error("cannot bind " + options_.host + " to a free port");
  } else {
    if (!http_->bind_to_port(options_.host, options_.port)) {
      return Status::Error("cannot bind " + options_.host + ":" + std::to_string(options_.port) +
                           " (in use, or not an address of this machine?)");
    }
    port_ = options_.port;
  }
  raise_backlog(port_, 1024);
  return Status::Ok();
}

void HttpServer::listen() { http_->listen_after_bind(); }

void HttpServer::stop() { http_->stop(); }

void HttpServer::routes() {
  httplib::Server& http = *http_;
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string header = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const bool ok = header.rfind(prefix, 0) == 0 &&
                    same_secret(header.substr(prefix.size()), options_.api_key);
    if (ok) return httplib::Server::HandlerResponse::Unhandled;
    metrics_.rejected("unauthorized");
    ApiError error;
    error.status = 401;
    error.type = "authentication_error";
    error.code = "invalid_api_key";
    error.message = header.empty() ? "missing Authorization: Bearer <key> header"
                                   : "invalid API key";
    send_error(res, error);
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError error;
    error.status = res.status;
    // No handler ran: httplib answers an unrouted GET or POST with 404 and a method it has no
    // handlers for (PUT, DELETE, ...) with 400. A known path gets a 405 naming the method it
    // takes (as vLLM and SGLang answer), any other path a 404.
    const char* method = route_method(req.path);
    const bool routed_method = req.method == "GET" || req.method == "POST" || req.method == "HEAD";
    if (res.status == 404 || (res.status == 400 && !routed_method)) {
      res.status = error.status = method != nullptr ? 405 : 404;
      if (method != nullptr) res.set_header("Allow", method);
    }
    error.type = res.status == 404 ? "not_found_error" : "invalid_request_error";
    if (res.status == 404) {
      error.message = "no route " + req.method + " " + req.path;
    } else if (res.status == 405) {
      error.message = req.path + " takes " + method + ", not " + req.method;
    } else if (res.status == 413) {
      error.message = "the request body is larger than the server's limit of " +
                      std::to_string(kMaxBodyBytes >> 20) + " MiB";
    } else {
      error.message = "HTTP error " + std::to_string(res.status);
    }
    send_error(res, error);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    LOG(ERROR) << "handler failed: " << what;
    ApiError error;
    error.status = 500;
    error.type = "server_error";
    error.message = "internal error: " + what;
    send_error(res, error);
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = loop_.healthy();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "{\"status\":\"ok\"}" : "{\"status\":\"engine failed\"}",
                    "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.prometheus_text(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const Json model = {{"id", options_.model_name},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", "kuiper"},
                        {"max_model_len", engine_.max_context()}};
    res.set_content(dump({{"object", "list"}, {"data", Json::array({model})}}), "application/json");
  });

  // The body is read through a content reader, as JSON whatever its Content-Type says:
  // httplib's own read answers a body over 8 KB sent as application/x-www-form-urlencoded
  // (curl -d's default) with a bare 413, where a long prompt is no error.
  auto completion = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& read_body) {
      if (req.is_multipart_form_data()) {  // httplib would want a reader for its parts
        metrics_.rejected("invalid");
        return send_error(res, {415, "the request body must be JSON, not multipart/form-data",
                                "invalid_request_error", "", ""});
      }
      std::string body;
      if (!read_body([&body](const char* data, size_t n) {
            body.append(data, n);
            return true;
          })) {
        return;  // httplib set the status (413 past the payload limit); the error handler answers
      }
      if (draining_) {
        metrics_.rejected("shutting_down");
        return send_error(res, {503, "the server is shutting down", "server_error", "",
                                "shutting_down"});
      }
      auto job = std::make_shared<Job>(active_);
      ApiError error;
      ParseContext context{options_.model_name,
                           std::min(engine_.tokenizer().vocab_size(),
                                    engine_.model().config().vocab_size),
                           vision_ != nullptr};
      const bool parsed = chat ? parse_chat_request(body, context, &job->request, &error)
                               : parse_completion_request(body, context, &job->request, &error);
      auto refuse = [&](const ApiError& e, const char* reason) {
        metrics_.rejected(reason);
        LOG(INFO) << req.path << " refused (" << e.status << "): " << e.message;
        send_error(res, e);
      };
      if (!parsed) return refuse(error, "invalid");
      ApiRequest& request = job->request;

      // Each prompt's tokens (and images): the chat's one, or the completion's prompts.
      struct Prompt {
        std::vector<int32_t> ids;
        std::vector<ProcessedImage> images;
        std::string echo;  // the text an echoing choice starts with
      };
      std::vector<Prompt> prompts;
      if (chat) {
        Prompt& p = prompts.emplace_back();
        ChatOptions options = chat_;
        for (const auto& [key, value] : request.template_kwargs.items()) options.extra[key] = value;
        for (size_t i = 0; i < request.images.size(); ++i) {
          Result<PromptImage> image = vision_->decode(request.images[i], "#" + std::to_string(i + 1));
          if (!image.ok()) {
            return refuse({400, image.status().message(), "invalid_request_error", "messages",
                           "invalid_image"},
                          "invalid");
          }
          p.images.push_back(std::move(image->pixels));
        }
        Result<std::vector<int32_t>> encoded =
            encode_chat(chat_template_, engine_.tokenizer(), request.messages, options);
        if (!encoded.ok()) {
          return refuse({400, encoded.status().message(), "invalid_request_error", "messages", ""},
                        "invalid");
        }
        p.ids = std::move(encoded).value();
        if (vision_ != nullptr) {
          Result<std::vector<int32_t>> expanded = expand_image_pads(
              p.ids, vision_->image_pad_id(), image_tokens(engine_.model().config(), p.images));
          if (!expanded.ok()) {
            return refuse({400, expanded.status().message(), "invalid_request_error", "messages",
                           ""},
                          "invalid");
          }
          p.ids = std::move(expanded).value();
        }
      }
      for (const ApiRequest::Prompt& given : request.prompts) {
        Prompt& p = prompts.emplace_back();
        if (given.is_ids) {
          p.ids = given.ids;
          if (request.echo) p.echo = engine_.tokenizer().decode(p.ids);
        } else {
          Result<std::vector<int32_t>> encoded = engine_.tokenizer().encode(given.text);
          if (!encoded.ok()) {
            return refuse({400, encoded.status().message(), "invalid_request_error", "prompt", ""},
                          "invalid");
          }
          p.ids = std::move(encoded).value();
          if (request.echo) p.echo = given.text;
        }
      }
      const int64_t capacity = loop_.capacity();
      if (static_cast<int64_t>(prompts.size()) * request.n > capacity) {
        return refuse({400,
                       "the request asks for " + std::to_string(prompts.size() * request.n) +
                           " completions (prompts times n); this server takes at most " +
                           std::to_string(capacity) + " at once (--max-batch + --max-queue)",
                       "invalid_request_error", chat ? "n" : "prompt", ""},
                      "invalid");
      }
      for (size_t k = 0; k < prompts.size(); ++k) {
        const std::vector<int32_t>& ids = prompts[k].ids;
        const std::string param = chat ? "messages" : "prompt";
        const std::string which =
            prompts.size() > 1 ? "prompt[" + std::to_string(k) + "]" : "the prompt";
        if (ids.empty()) {
          return refuse({400, which + " has no tokens", "invalid_request_error", param, ""},
                        "invalid");
        }
        if (static_cast<int64_t>(ids.size()) >= engine_.max_context()) {
          return refuse({400,
                         which + " is " + std::to_string(ids.size()) +
                             " tokens; this server's context holds " +
                             std::to_string(engine_.max_context()) +
                             " tokens, the prompt and at least one generated token",
                         "invalid_request_error", param, "context_length_exceeded"},
                        "invalid");
        }
        // As vLLM: a max_tokens the context cannot hold after the prompt is refused, not cut.
        const int64_t room = engine_.max_context() - static_cast<int64_t>(ids.size());
        if (request.max_tokens_given && request.generation.max_tokens > room) {
          return refuse({400,
                         "\"max_tokens\" is too large: " +
                             std::to_string(request.generation.max_tokens) +
                             ". This server's context holds " +
                             std::to_string(engine_.max_context()) + " tokens and " + which +
                             " is " + std::to_string(ids.size()) + " (" +
                             std::to_string(request.generation.max_tokens) + " > " +
                             std::to_string(engine_.max_context()) + " - " +
                             std::to_string(ids.size()) + ")",
                         "invalid_request_error", "max_tokens", "context_length_exceeded"},
                        "invalid");
        }
      }

      // One engine request per prompt and choice (choice p * n + c), seeds seed, seed + 1, ...
      // for each prompt's choices, so that a prompt's choices are those it gets alone.
      job->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
      job->created = static_cast<int64_t>(std::time(nullptr));
      const size_t choices = prompts.size() * static_cast<size_t>(request.n);
      for (const Prompt& p : prompts) {
        job->prompt_tokens += static_cast<int64_t>(p.ids.size());
        for (int64_t c = 0; c < request.n; ++c) {
          auto channel = std::make_shared<Channel>();
          channel->prompt = p.ids;
          channel->images = p.images;
          channel->options = request.generation;
          channel->options.sampling.seed =
              request.generation.sampling.seed + static_cast<uint64_t>(c);
          channel->submitted = Clock::now();
          channel->log_id =
              choices > 1 ? job->id + "/" + std::to_string(job->channels.size()) : job->id;
          if (!loop_.submit(channel)) {
            job->finished.resize(job->channels.size());
            job->cancel(loop_);
            return refuse({429, "the server is busy: more requests are waiting than --max-queue",
                           "server_busy", "", "queue_full"},
                          "queue_full");
          }
          job->channels.push_back(std::move(channel));
          job->echo.push_back(p.echo);
        }
      }
      job->text.resize(job->channels.size());
      job->finished.resize(job->channels.size());
      job->fd = connection_socket(req);

      const std::string object = chat ? "chat.completion" : "text_completion";
      if (!request.stream) {
        while (!job->done()) {
          job->poll(kPoll);
          if (!job->cancelled && peer_closed(job->fd)) {
            LOG(INFO) << job->id << ": the client went away; cancelled";
            job->cancel(loop_);
          }
        }
        Json choices = Json::array();
        int64_t completion_tokens = 0;
        for (size_t i = 0; i < job->finished.size(); ++i) {
          const FinishedRequest& f = *job->finished[i];
          if (!f.generation.ok()) {
            // An add_request refusal (id -1) is the request's fault; anything later the server's.
            const bool client = f.id < 0;
            return send_error(res, {client ? 400 : 500, f.generation.status().message(),
                                    client ? "invalid_request_error" : "server_error", "", ""});
          }
          const Generation& g = *f.generation;
          completion_tokens += g.stats.generated_tokens;
          Json choice = {{"index", i}};
          if (chat) {
            choice["message"] = {{"role", "assistant"}, {"content", g.text}};
            choice["logprobs"] =
                request.logprobs ? chat_logprobs(engine_.tokenizer(), g.logprobs) : Json();
          } else {
            choice["text"] = job->echo[i] + g.text;
            choice["logprobs"] =
                request.logprobs ? completion_logprobs(engine_.tokenizer(), g.logprobs) : Json();
          }
          choice["finish_reason"] = api_finish_reason(g.finish);
          choices.push_back(choice);
        }
        const Json body = {{"id", job->id},
                           {"object", object},
                           {"created", job->created},
                           {"model", options_.model_name},
                           {"choices", choices},
                           {"usage", usage_json(job->prompt_tokens, completion_tokens)}};
        res.set_content(dump(body), "application/json");
        return;
      }

      // Streaming: one SSE event per piece of text per choice, a last one per choice with its
      // finish reason, the usage when asked, then [DONE].
      res.set_header("Cache-Control", "no-cache");
      const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
      const std::string model = options_.model_name;
      EngineLoop* loop = &loop_;
      const Tokenizer* tokenizer = &engine_.tokenizer();
      res.set_chunked_content_provider(
          "text/event-stream",
          [job, chat, chunk_object, model, loop, tokenizer](size_t, httplib::DataSink& sink) {
            auto event = [&](const Json& choice, const Json& usage) {
              Json chunk = {{"id", job->id},
                            {"object", chunk_object},
                            {"created", job->created},
                            {"model", model},
                            {"choices", choice.is_null() ? Json::array() : Json::array({choice})}};
              if (job->request.include_usage) chunk["usage"] = usage;
              const std::string line = "data: " + dump(chunk) + "\n\n";
              return sink.write(line.data(), line.size());
            };
            auto gone = [&] {
              job->cancel(*loop);
              while (!job->done()) job->poll(kPoll);  // the engine's word that they ended
              return false;
            };
            if (!job->role_sent) {
              job->role_sent = true;
              for (size_t i = 0; i < job->channels.size(); ++i) {
                if (!chat && job->echo[i].empty()) continue;
                const Json choice =
                    chat ? Json{{"index", i},
                                {"delta", {{"role", "assistant"}, {"content", ""}}},
                                {"logprobs", nullptr},
                                {"finish_reason", nullptr}}
                         : Json{{"index", i},
                                {"text", job->echo[i]},
                                {"logprobs", nullptr},
                                {"finish_reason", nullptr}};
                if (!event(choice, nullptr)) return gone();
              }
            }
            std::vector<bool> was_done(job->finished.size());
            for (size_t i = 0; i < was_done.size(); ++i) was_done[i] = job->finished[i].has_value();
            const std::vector<std::string> fresh = job->poll(kPoll);
            if (peer_closed(job->fd)) {
              LOG(INFO) << job->id << ": the client went away; cancelled";
              return gone();
            }
            job->logprobs.resize(job->channels.size());
            job->logprobs_sent.resize(job->channels.size());
            // The logprobs of tokens sent so far: a chunk's own, and a finish's remainder.
            auto logprobs_json = [&](size_t i, const std::vector<TokenLogprob>& lps) -> Json {
              if (!job->request.logprobs) return Json();
              job->logprobs_sent[i] += lps.size();
              return chat ? chat_logprobs(*tokenizer, lps) : completion_logprobs(*tokenizer, lps);
            };
            for (size_t i = 0; i < fresh.size(); ++i) {
              if (!fresh[i].empty() || !job->logprobs[i].empty()) {
                Json choice = {{"index", i}, {"finish_reason", nullptr}};
                if (chat) {
                  choice["delta"] = {{"content", fresh[i]}};
                } else {
                  choice["text"] = fresh[i];
                }
                choice["logprobs"] = logprobs_json(i, job->logprobs[i]);
                job->logprobs[i].clear();
                if (!event(choice, nullptr)) return gone();
              }
              if (was_done[i] || !job->finished[i]) continue;
              const FinishedRequest& f = *job->finished[i];
              if (!f.generation.ok()) {
                const ApiError error{f.id < 0 ? 400 : 500, f.generation.status().message(),
                                     f.id < 0 ? "invalid_request_error" : "server_error", "", ""};
                const std::string line = "data: " + dump(error.to_json()) + "\n\n";
                if (!sink.write(line.data(), line.size())) return gone();
                continue;
              }
              const Generation& g = *f.generation;
              Json choice = {{"index", i}, {"finish_reason", api_finish_reason(g.finish)}};
              if (chat) {
                choice["delta"] = Json::object();
              } else {
                choice["text"] = "";
              }
              const auto sent = static_cast<std::ptrdiff_t>(
                  std::min(job->logprobs_sent[i], g.logprobs.size()));
              choice["logprobs"] = logprobs_json(
                  i, std::vector<TokenLogprob>(g.logprobs.begin() + sent, g.logprobs.end()));
              if (!event(choice, nullptr)) return gone();
            }
            if (!job->done()) return true;
            if (job->request.include_usage) {
              int64_t completion_tokens = 0;
              for (const auto& f : job->finished) {
                if (f->generation.ok()) completion_tokens += f->generation->stats.generated_tokens;
              }
              if (!event(nullptr, usage_json(job->prompt_tokens, completion_tokens))) {
                return gone();
              }
            }
            const std::string done = "data: [DONE]\n\n";
            if (!sink.write(done.data(), done.size())) return false;
            sink.done();
            return true;
          },
          [job, loop](bool success) {
            if (!success) {
              job->cancel(*loop);
              while (!job->done()) job->poll(kPoll);
            }
          });
    };
  };
  http.Post("/v1/chat/completions", completion(true));
  http.Post("/v1/completions", completion(false));
}

}  // namespace kuiper::server
