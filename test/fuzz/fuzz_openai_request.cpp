// A request body of kuiper-server's /v1/chat/completions or /v1/completions: read into one
// checked ApiRequest or refused with an ApiError (the server's 4xx), never a crash. The first
// byte picks the endpoint (bit 0: chat) and whether the model takes images (bit 1).
#include "test/fuzz/fuzz_input.h"
#include "tools/server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using kuiper::server::ApiError;
  using kuiper::server::ApiRequest;
  kuiper::server::ParseContext context;
  context.model = "qwen3";
  context.vocab = 1000;
  context.vision = (data[0] & 2) != 0;
  const std::string body = kuiper::fuzz::as_text(data + 1, size - 1);
  ApiRequest request;
  ApiError error;
  const bool chat = (data[0] & 1) != 0;
  const bool ok = chat ? kuiper::server::parse_chat_request(body, context, &request, &error)
                       : kuiper::server::parse_completion_request(body, context, &request, &error);
  // What the server writes back: the error object, or (accepted) what the template reads.
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  if (!ok) (void)error.to_json().dump(-1, ' ', false, kReplace);
  if (ok && chat) (void)request.messages.dump(-1, ' ', false, kReplace);
  return 0;
}
