// The official OpenAI client (npm "openai", pinned in package.json) against a running
// kuiper-server: a chat completion, a streamed one and a completion.
//   node client_test.mjs http://127.0.0.1:PORT/v1 MODEL [API_KEY]
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, model, apiKey = "none"] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node client_test.mjs BASE_URL MODEL [API_KEY]");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const models = await client.models.list();
assert.equal(models.data[0].id, model);

const chat = await client.chat.completions.create({
  model,
  messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "Hello!" }],
  max_tokens: 8,
  temperature: 0,
});
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(typeof chat.choices[0].message.content, "string");
assert.ok(["stop", "length"].includes(chat.choices[0].finish_reason));
assert.ok(chat.usage.prompt_tokens > 0 && chat.usage.completion_tokens <= 8);

const stream = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Hello!" }],
  max_tokens: 8,
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
});
let text = "";
let usage = null;
let finish = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    text += choice.delta?.content ?? "";
    finish = choice.finish_reason ?? finish;
  }
}
const again = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Hello!" }],
  max_tokens: 8,
  temperature: 0,
});
assert.equal(text, again.choices[0].message.content);
assert.ok(finish === "stop" || finish === "length");
assert.deepEqual(usage, again.usage);

const completion = await client.completions.create({
  model,
  prompt: "The capital of France is",
  max_tokens: 5,
  temperature: 0,
});
assert.equal(completion.object, "text_completion");
assert.equal(typeof completion.choices[0].text, "string");
assert.ok(completion.usage.completion_tokens <= 5);

// Several prompts in one request, echoed: choice i is prompt i's, starting with its text.
const prompts = ["The capital of France is", "Once upon a time"];
const batch = await client.completions.create({
  model,
  prompt: prompts,
  max_tokens: 3,
  temperature: 0,
  echo: true,
});
assert.equal(batch.choices.length, 2);
for (const [i, p] of prompts.entries()) {
  assert.equal(batch.choices[i].index, i);
  assert.ok(batch.choices[i].text.startsWith(p), batch.choices[i].text);
}
// Greedy: the first prompt's 3 tokens begin its 5 above.
assert.ok(completion.choices[0].text.startsWith(batch.choices[0].text.slice(prompts[0].length)));

let refused = null;
try {
  await client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "hi" }] });
} catch (e) {
  refused = e;
}
assert.ok(refused instanceof OpenAI.NotFoundError, "an unknown model is a 404");

console.log("openai client: chat, streamed chat, completions (one and several prompts) and a refusal all as expected");
