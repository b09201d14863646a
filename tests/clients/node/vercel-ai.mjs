// Flows of the Vercel AI SDK (`ai` + `@ai-sdk/openai`) against respd. The provider's default
// model class, `openai(modelId)`, speaks the Responses API; every flow checks it did.

import { createOpenAI } from "@ai-sdk/openai";
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

import { API_KEY, assert, callsTo, intInRange, nonEmptyString, recorder } from "./common.mjs";

function provider(baseURL, rec) {
  return createOpenAI({ baseURL, apiKey: API_KEY, fetch: rec.fetch });
}

/** All model calls went to POST /v1/responses (and nowhere else); returns their bodies. */
function responsesBodies(rec, expected) {
  const elsewhere = rec.calls.filter((c) => !(c.method === "POST" && c.path === "/v1/responses"));
  assert.deepEqual(elsewhere.map((c) => `${c.method} ${c.path}`), [], "requests besides POST /v1/responses");
  const calls = callsTo(rec.calls, "/v1/responses");
  if (expected != null) assert.equal(calls.length, expected, `POST /v1/responses calls: ${calls.length}`);
  return calls.map((c) => c.body);
}

async function generateTextFlow({ baseURL, model }) {
  const rec = recorder();
  const openai = provider(baseURL, rec);
  const result = await generateText({
    model: openai(model),
    prompt: "Say hello in one short sentence.",
    temperature: 0,
    maxOutputTokens: 200,
    maxRetries: 0,
  });
  const [body] = responsesBodies(rec, 1);
  assert.equal(body.model, model);
  assert.equal(body.temperature, 0);
  assert.equal(body.max_output_tokens, 200);
  nonEmptyString(result.text, "text");
  assert.equal(result.finishReason, "stop");
  assert.ok(result.usage.inputTokens > 0, `usage.inputTokens=${result.usage.inputTokens}`);
  assert.ok(result.usage.outputTokens > 0, `usage.outputTokens=${result.usage.outputTokens}`);
  nonEmptyString(result.response.id, "response.id");
  return `generateText via POST /v1/responses: finishReason stop, ${result.text.length} chars, ${result.usage.inputTokens}+${result.usage.outputTokens} tokens`;
}

async function streamTextFlow({ baseURL, model }) {
  const rec = recorder();
  const openai = provider(baseURL, rec);
  const errors = [];
  const result = streamText({
    model: openai(model),
    prompt: "Name three colors.",
    temperature: 0,
    maxOutputTokens: 200,
    maxRetries: 0,
    onError: ({ error }) => errors.push(error),
  });
  const chunks = [];
  for await (const chunk of result.textStream) chunks.push(chunk);
  const text = await result.text;
  if (errors.length) throw errors[0];
  const [body] = responsesBodies(rec, 1);
  assert.equal(body.stream, true, "the request was not streamed");
  assert.ok(chunks.length >= 2, `only ${chunks.length} text chunks`);
  nonEmptyString(text, "text");
  assert.equal(chunks.join(""), text, "textStream chunks do not concatenate to the final text");
  const usage = await result.usage;
  assert.ok(usage.inputTokens > 0 && usage.outputTokens > 0, `usage=${JSON.stringify(usage)}`);
  // The tiny model's greedy answer usually ends by itself; which way it goes depends on
  // what the KV cache held (a reused prefix differs from a fresh one in the last bits) and
  // on the CPU's kernels. When it runs into the budget, or loops and respd's repetition stop
  // cuts it, the response is incomplete, and the SDK must say so: the stored response, read
  // outside the SDK, tells which.
  const finish = await result.finishReason;
  const { id } = await result.response;
  const stored = await (
    await fetch(`${baseURL}/responses/${id}`, {
      method: "GET",
      headers: { Authorization: `Bearer ${API_KEY}` },
    })
  ).json();
  assert.ok(["completed", "incomplete"].includes(stored.status), `status=${stored.status}`);
  assert.equal(finish, stored.status === "incomplete" ? "length" : "stop");
  if (usage.outputTokens >= 200) assert.equal(finish, "length");
  return `streamText via POST /v1/responses (stream): ${chunks.length} chunks == final text, finishReason ${finish}`;
}

async function toolLoop({ baseURL, model }) {
  const rec = recorder();
  const openai = provider(baseURL, rec);
  const executed = [];
  const getWeather = tool({
    description: "Get the current weather in a city.",
    inputSchema: z.object({ city: z.string().describe("The city, e.g. Paris") }),
    execute: async ({ city }) => {
      executed.push(city);
      return { city, temperature: 21, unit: "celsius", conditions: "sunny" };
    },
  });
  const result = await generateText({
    model: openai(model),
    tools: { get_weather: getWeather },
    prompt: "What is the weather like in Paris?",
    stopWhen: stepCountIs(3),
    // The first step must call the tool; later steps must answer in text.
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
    temperature: 0,
    maxOutputTokens: 80,
    maxRetries: 0,
  });
  const bodies = responsesBodies(rec);
  assert.ok(executed.length >= 1, "the tool never executed");
  assert.ok(result.steps.length >= 2, `only ${result.steps.length} step(s)`);
  const [first] = result.steps;
  assert.equal(first.finishReason, "tool-calls");
  assert.equal(first.toolCalls.length, executed.length, "tool calls and executions differ");
  for (const call of first.toolCalls) {
    assert.equal(call.toolName, "get_weather");
    nonEmptyString(call.input.city, "tool input city");
  }
  assert.deepEqual(
    first.toolResults.map((r) => r.output.city),
    executed,
    "tool results are not the executed outputs",
  );
  const last = result.steps.at(-1);
  assert.equal(last.toolCalls.length, 0, "the last step called a tool");
  assert.equal(last.finishReason, "stop");
  nonEmptyString(last.text, "last step text");
  assert.equal(result.text, last.text);
  // The tool's output really went back to respd in the follow-up request.
  assert.equal(bodies.length, result.steps.length);
  assert.equal(bodies[0].tool_choice, "required");
  assert.equal(bodies[1].tool_choice, "none");
  const callIds = first.toolCalls.map((c) => c.toolCallId).sort();
  const sentOutputs = (bodies[1].input ?? []).filter((i) => i.type === "function_call_output");
  assert.deepEqual(sentOutputs.map((o) => o.call_id).sort(), callIds, "function_call_output items sent back");
  return `tool-loop: ${result.steps.length} steps, get_weather executed ${executed.length}x (${executed.join(", ")}), then a text answer`;
}

const Recipe = z.object({
  name: z.string().max(40),
  servings: z.number().int().min(1).max(8),
  difficulty: z.enum(["easy", "medium", "hard"]),
  time: z.object({ prep_minutes: z.number().int().min(0).max(120), vegetarian: z.boolean() }),
  note: z.string().max(30).nullable(),
});

async function generateObjectFlow({ baseURL, model }) {
  const rec = recorder();
  const openai = provider(baseURL, rec);
  const result = await generateObject({
    model: openai(model),
    schema: Recipe,
    schemaName: "recipe",
    prompt: "Give a simple pancake recipe summary as JSON.",
    temperature: 0,
    maxOutputTokens: 150,
    maxRetries: 0,
  });
  const [body] = responsesBodies(rec, 1);
  assert.equal(body.text?.format?.type, "json_schema", `text.format=${JSON.stringify(body.text?.format)}`);
  const o = result.object;
  assert.ok(Recipe.safeParse(o).success, `object does not match the schema: ${JSON.stringify(o)}`);
  assert.equal(typeof o.name, "string");
  assert.ok(o.name.length <= 40, `name longer than 40: ${o.name.length}`);
  intInRange(o.servings, 1, 8, "servings");
  assert.ok(["easy", "medium", "hard"].includes(o.difficulty), `difficulty=${o.difficulty}`);
  intInRange(o.time.prep_minutes, 0, 120, "time.prep_minutes");
  assert.equal(typeof o.time.vegetarian, "boolean");
  assert.ok(o.note === null || typeof o.note === "string", `note=${JSON.stringify(o.note)}`);
  assert.equal(result.finishReason, "stop");
  return `generateObject (json_schema via /v1/responses): ${JSON.stringify(o)}`;
}

export const flows = {
  "generate-text": generateTextFlow,
  "stream-text": streamTextFlow,
  "tool-loop": toolLoop,
  "generate-object": generateObjectFlow,
};
