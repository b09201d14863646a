// Flows of the official `openai` npm client against respd's Responses and Conversations APIs.

import OpenAI from "openai";
import { zodTextFormat } from "openai/helpers/zod";
import { z } from "zod";

import {
  API_KEY,
  assert,
  callsTo,
  checkUsage,
  intInRange,
  nonEmptyString,
  recorder,
} from "./common.mjs";

function client(baseURL, rec) {
  return new OpenAI({ baseURL, apiKey: API_KEY, fetch: rec.fetch, maxRetries: 0 });
}

const WEATHER_TOOL = {
  type: "function",
  name: "get_weather",
  description: "Get the current weather in a city.",
  parameters: {
    type: "object",
    properties: {
      city: { type: "string", description: "The city, e.g. Paris" },
      unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    },
    required: ["city", "unit"],
    additionalProperties: false,
  },
  strict: true,
};

async function create({ baseURL, model }) {
  const rec = recorder();
  const openai = client(baseURL, rec);
  const r = await openai.responses.create({
    model,
    input: "Say hello in one short sentence.",
    temperature: 0,
    max_output_tokens: 200,
  });
  assert.equal(r.object, "response");
  assert.equal(r.status, "completed", `status=${r.status} ${JSON.stringify(r.incomplete_details)}`);
  assert.equal(r.model, model);
  nonEmptyString(r.output_text, "output_text");
  const messages = r.output.filter((i) => i.type === "message" && i.role === "assistant");
  assert.equal(messages.length, 1, "one assistant message in output");
  checkUsage(r.usage);
  assert.ok(r.usage.output_tokens <= 200, `output_tokens=${r.usage.output_tokens} > max_output_tokens`);
  assert.equal(callsTo(rec.calls, "/v1/responses").length, 1);
  return `responses.create: status completed, ${r.output_text.length} chars, usage ${r.usage.input_tokens}+${r.usage.output_tokens} tokens`;
}

async function stream({ baseURL, model }) {
  const rec = recorder();
  const openai = client(baseURL, rec);
  const s = openai.responses.stream({
    model,
    input: "What is 2+2?",
    temperature: 0,
    max_output_tokens: 200,
  });
  const types = [];
  const seqs = [];
  let deltas = "";
  let doneText = null;
  for await (const event of s) {
    types.push(event.type);
    seqs.push(event.sequence_number);
    if (event.type === "response.output_text.delta") deltas += event.delta;
    if (event.type === "response.output_text.done") doneText = event.text;
  }
  const final = await s.finalResponse();
  assert.equal(types[0], "response.created", `first event: ${types[0]}`);
  assert.equal(types.at(-1), "response.completed", `last event: ${types.at(-1)}`);
  assert.ok(types.includes("response.in_progress"), "no response.in_progress event");
  for (const t of ["response.output_item.added", "response.content_part.added", "response.output_text.done", "response.content_part.done", "response.output_item.done"]) {
    assert.ok(types.includes(t), `no ${t} event`);
  }
  for (let i = 1; i < seqs.length; i++) {
    assert.ok(seqs[i] > seqs[i - 1], `sequence_number not increasing at event ${i}: ${seqs[i - 1]} -> ${seqs[i]}`);
  }
  const nDeltas = types.filter((t) => t === "response.output_text.delta").length;
  assert.ok(nDeltas >= 2, `only ${nDeltas} text deltas`);
  nonEmptyString(final.output_text, "final output_text");
  assert.equal(deltas, final.output_text, "deltas do not concatenate to the final output_text");
  assert.equal(doneText, final.output_text, "output_text.done text differs from the final output_text");
  assert.equal(final.status, "completed");
  checkUsage(final.usage);
  assert.equal(callsTo(rec.calls, "/v1/responses")[0].body.stream, true);
  return `responses.stream: ${types.length} events (${nDeltas} deltas), created..completed, deltas == finalResponse().output_text`;
}

async function functionTools({ baseURL, model }) {
  const rec = recorder();
  const openai = client(baseURL, rec);
  const tools = [WEATHER_TOOL];
  const r1 = await openai.responses.create({
    model,
    input: "What is the weather like in Paris?",
    tools,
    tool_choice: { type: "function", name: "get_weather" },
    temperature: 0,
    max_output_tokens: 80,
  });
  const calls = r1.output.filter((i) => i.type === "function_call");
  assert.ok(calls.length >= 1, `no function_call item in ${JSON.stringify(r1.output)}`);
  for (const call of calls) {
    assert.equal(call.name, "get_weather");
    nonEmptyString(call.call_id, "call_id");
    const args = JSON.parse(call.arguments);
    assert.deepEqual(Object.keys(args).sort(), ["city", "unit"], `arguments ${call.arguments}`);
    nonEmptyString(args.city, "arguments.city");
    assert.ok(["celsius", "fahrenheit"].includes(args.unit), `arguments.unit=${args.unit}`);
  }
  assert.equal(new Set(calls.map((c) => c.call_id)).size, calls.length, "call_ids are not unique");

  // One output per call, sent on top of the stored response.
  const outputs = calls.map((call) => {
    const args = JSON.parse(call.arguments);
    return {
      type: "function_call_output",
      call_id: call.call_id,
      output: JSON.stringify({ city: args.city, temperature: 21, unit: args.unit, conditions: "sunny" }),
    };
  });
  const r2 = await openai.responses.create({
    model,
    previous_response_id: r1.id,
    input: outputs,
    tools,
    tool_choice: "none",
    temperature: 0,
    max_output_tokens: 200,
  });
  assert.equal(r2.previous_response_id, r1.id);
  assert.equal(r2.output.filter((i) => i.type === "function_call").length, 0, "function_call despite tool_choice none");
  nonEmptyString(r2.output_text, "answer after function_call_output");
  // Continuing from previous_response_id must put the same prompt in front of the model as
  // sending the whole history explicitly.
  const explicit = await openai.responses.inputTokens.count({
    model,
    input: [
      { role: "user", content: "What is the weather like in Paris?" },
      ...calls.map(({ call_id, name, arguments: a }) => ({ type: "function_call", call_id, name, arguments: a })),
      ...outputs,
    ],
    tools,
    tool_choice: "none",
  });
  assert.equal(
    r2.usage.input_tokens,
    explicit.input_tokens,
    "input_tokens via previous_response_id differ from the explicit history's count",
  );
  return `forced get_weather: ${calls.length} call(s), arguments ${calls.map((c) => c.arguments).join(' ')}; function_call_output via previous_response_id answered in text (prompt = explicit history, ${explicit.input_tokens} tokens)`;
}

const Review = z.object({
  title: z.string().max(40),
  rating: z.number().int().min(1).max(10),
  mood: z.enum(["happy", "sad", "neutral"]),
  author: z.object({
    name: z.string().max(30),
    age: z.number().int().min(18).max(99),
  }),
  nickname: z.string().max(20).nullable(),
});

async function zodTextFormatFlow({ baseURL, model }) {
  const rec = recorder();
  const openai = client(baseURL, rec);
  const r = await openai.responses.parse({
    model,
    input: "Write a short review of a movie you liked, as JSON.",
    text: { format: zodTextFormat(Review, "review") },
    temperature: 0,
    max_output_tokens: 150,
  });
  const sent = callsTo(rec.calls, "/v1/responses")[0].body.text.format;
  assert.equal(sent.type, "json_schema");
  assert.equal(sent.strict, true);
  assert.equal(r.status, "completed", `status=${r.status} ${JSON.stringify(r.incomplete_details)}`);
  const p = r.output_parsed;
  assert.ok(p && typeof p === "object", `output_parsed=${JSON.stringify(p)}`);
  // responses.parse already ran the zod schema; check the bounds once more by hand.
  assert.equal(typeof p.title, "string");
  assert.ok(p.title.length <= 40, `title longer than 40: ${p.title.length}`);
  intInRange(p.rating, 1, 10, "rating");
  assert.ok(["happy", "sad", "neutral"].includes(p.mood), `mood=${p.mood}`);
  assert.equal(typeof p.author, "object");
  assert.equal(typeof p.author.name, "string");
  intInRange(p.author.age, 18, 99, "author.age");
  assert.ok(p.nickname === null || typeof p.nickname === "string", `nickname=${JSON.stringify(p.nickname)}`);
  assert.deepEqual(JSON.parse(r.output_text), p, "output_parsed differs from output_text");
  return `responses.parse + zodTextFormat: ${JSON.stringify(p)}`;
}

function messageText(item) {
  return (item.content ?? []).map((c) => c.text ?? "").join("");
}

async function conversations({ baseURL, model }) {
  const rec = recorder();
  const openai = client(baseURL, rec);
  const conv = await openai.conversations.create({ metadata: { suite: "node-clients" } });
  nonEmptyString(conv.id, "conversation id");
  assert.equal(conv.object, "conversation");
  const first = "My name is Ada and I live in a small town by the sea. Say hi to me.";
  const second = "What is my name?";
  const opts = { model, conversation: conv.id, temperature: 0, max_output_tokens: 40 };
  const r1 = await openai.responses.create({ ...opts, input: first });
  const r2 = await openai.responses.create({ ...opts, input: second });
  for (const r of [r1, r2]) {
    nonEmptyString(r.output_text, "output_text");
    assert.equal(r.conversation?.id, conv.id, `response.conversation=${JSON.stringify(r.conversation)}`);
  }
  // The second prompt is shorter than the first: only the first turn in context makes it longer.
  assert.ok(
    r2.usage.input_tokens > r1.usage.input_tokens,
    `second turn input_tokens ${r2.usage.input_tokens} <= first ${r1.usage.input_tokens}: conversation not in context`,
  );

  const items = [];
  for await (const item of openai.conversations.items.list(conv.id, { order: "asc" })) items.push(item);
  const msgs = items.filter((i) => i.type === "message");
  const summary = msgs.map((m) => `${m.role}:${messageText(m).slice(0, 30)}`);
  assert.equal(msgs.length, 4, `expected 4 messages, got ${JSON.stringify(summary)}`);
  assert.deepEqual(msgs.map((m) => m.role), ["user", "assistant", "user", "assistant"], JSON.stringify(summary));
  assert.equal(messageText(msgs[0]), first);
  assert.equal(messageText(msgs[2]), second);
  const out1 = r1.output.find((i) => i.type === "message");
  const out2 = r2.output.find((i) => i.type === "message");
  assert.equal(msgs[1].id, out1.id, "first assistant item is not the first response's message");
  assert.equal(messageText(msgs[1]), r1.output_text);
  assert.equal(msgs[3].id, out2.id, "second assistant item is not the second response's message");
  assert.equal(messageText(msgs[3]), r2.output_text);
  return `conversation ${conv.id}: two responses, items.list (asc) = user, assistant, user, assistant with matching ids`;
}

export const flows = {
  create,
  stream,
  "function-tools": functionTools,
  "zod-text-format": zodTextFormatFlow,
  conversations,
};
