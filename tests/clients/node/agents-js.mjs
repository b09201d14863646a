// Flows of the OpenAI Agents SDK for JavaScript (`@openai/agents`) against respd, through an
// `OpenAI` client pointed at respd and the Responses model. Tracing is off, and run.mjs
// refuses (and fails the flow on) any request that is not for respd.

import {
  Agent,
  OpenAIResponsesModel,
  run,
  setDefaultOpenAIClient,
  setOpenAIAPI,
  setTracingDisabled,
  tool,
} from "@openai/agents";
import OpenAI from "openai";
import { z } from "zod";

import { API_KEY, assert, callsTo, nonEmptyString, recorder } from "./common.mjs";

function setup(baseURL, model) {
  const rec = recorder();
  const client = new OpenAI({ baseURL, apiKey: API_KEY, fetch: rec.fetch, maxRetries: 0 });
  setTracingDisabled(true);
  setDefaultOpenAIClient(client);
  setOpenAIAPI("responses");
  return { rec, model: new OpenAIResponsesModel(client, model) };
}

const SETTINGS = { temperature: 0, maxTokens: 200 };

/** The bodies of the POST /v1/responses calls; nothing else was requested. */
function responsesBodies(rec) {
  const elsewhere = rec.calls.filter((c) => !(c.method === "POST" && c.path === "/v1/responses"));
  assert.deepEqual(elsewhere.map((c) => `${c.method} ${c.path}`), [], "requests besides POST /v1/responses");
  return callsTo(rec.calls, "/v1/responses").map((c) => c.body);
}

async function twoTools({ baseURL, model: modelId }) {
  const { rec, model } = setup(baseURL, modelId);
  const ran = [];
  const getWeather = tool({
    name: "get_weather",
    description: "Get the current weather in a city.",
    parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => {
      ran.push(`get_weather(${city})`);
      return `It is sunny and 21 degrees celsius in ${city}.`;
    },
  });
  const getTime = tool({
    name: "get_time",
    description: "Get the current local time in a city.",
    parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => {
      ran.push(`get_time(${city})`);
      return `It is 14:05 in ${city}.`;
    },
  });
  const agent = new Agent({
    name: "Assistant",
    instructions: "You answer questions about cities. Use the tools, then answer briefly.",
    model,
    tools: [getWeather, getTime],
    modelSettings: { ...SETTINGS, toolChoice: "required" },
    resetToolChoice: true,
  });
  const result = await run(agent, "What is the weather in Paris?", { maxTurns: 4 });
  const bodies = responsesBodies(rec);
  assert.ok(ran.length >= 1, "no tool ran");
  const outputs = result.newItems.filter((i) => i.type === "tool_call_output_item");
  assert.equal(outputs.length, ran.length, "tool_call_output items differ from the tools that ran");
  nonEmptyString(result.finalOutput, "finalOutput");
  assert.ok(bodies.length >= 2, `only ${bodies.length} model call(s)`);
  assert.deepEqual(bodies[0].tools.map((t) => t.name).sort(), ["get_time", "get_weather"]);
  assert.equal(bodies[0].tool_choice, "required");
  assert.notEqual(bodies.at(-1).tool_choice, "required", "tool choice was not reset after the tools ran");
  const sent = bodies[1].input.filter((i) => i.type === "function_call_output");
  assert.ok(sent.length >= 1, "the tool output was not sent back to respd");
  return `two-tools: ran ${ran.join(", ")}; ${bodies.length} model calls, tool_choice required then reset; final output ${result.finalOutput.length} chars`;
}

async function handoffFlow({ baseURL, model: modelId }) {
  const { rec, model } = setup(baseURL, modelId);
  const weather = new Agent({
    name: "weather_agent",
    handoffDescription: "Answers questions about the weather.",
    instructions: "You answer questions about the weather in one short sentence.",
    model,
    modelSettings: SETTINGS,
  });
  const triage = new Agent({
    name: "triage_agent",
    instructions: "Hand the user over to the agent that can help.",
    model,
    handoffs: [weather],
    modelSettings: { ...SETTINGS, toolChoice: "required" },
  });
  const result = await run(triage, "Will it rain in London today?", { maxTurns: 4 });
  const bodies = responsesBodies(rec);
  assert.equal(result.lastAgent, weather, `lastAgent=${result.lastAgent?.name}`);
  nonEmptyString(result.finalOutput, "finalOutput");
  const handoffs = result.newItems.filter((i) => i.type === "handoff_output_item");
  assert.equal(handoffs.length, 1, "no handoff_output item");
  assert.equal(bodies.length, 2, `model calls: ${bodies.length}`);
  assert.deepEqual(bodies[0].tools.map((t) => t.name), ["transfer_to_weather_agent"]);
  assert.equal(bodies[0].tool_choice, "required");
  assert.ok(!bodies[1].tools?.length, "the weather agent was offered tools");
  return `handoff: triage_agent -> ${result.lastAgent.name} via transfer_to_weather_agent; final output ${result.finalOutput.length} chars`;
}

/** A plain agent without tools, for the flows about runs rather than tools. */
function assistant(model) {
  return new Agent({
    name: "Assistant",
    instructions: "You are a helpful assistant. Answer briefly.",
    model,
    modelSettings: SETTINGS,
  });
}

async function session({ baseURL, model: modelId }) {
  const { rec, model } = setup(baseURL, modelId);
  const agent = assistant(model);
  const first = "My name is Ada and I live in a small town by the sea. Say hi to me.";
  const second = "What is my name?";
  const r1 = await run(agent, first);
  nonEmptyString(r1.lastResponseId, "first lastResponseId");
  nonEmptyString(r1.finalOutput, "first finalOutput");
  const r2 = await run(agent, second, { previousResponseId: r1.lastResponseId });
  nonEmptyString(r2.finalOutput, "second finalOutput");
  assert.ok(r2.rawResponses.length >= 1, "second run has no raw responses");
  nonEmptyString(r2.lastResponseId, "second lastResponseId");
  assert.notEqual(r2.lastResponseId, r1.lastResponseId);

  const bodies = responsesBodies(rec);
  assert.equal(bodies.length, 2, `model calls: ${bodies.length}`);
  assert.equal(bodies[0].previous_response_id, undefined);
  assert.equal(bodies[1].previous_response_id, r1.lastResponseId, "previous_response_id was not sent");
  const sentText = JSON.stringify(bodies[1].input);
  assert.ok(!sentText.includes("Ada"), "the second request resent the first turn");
  // respd put the first turn back in front of the model: the shorter second prompt costs more.
  const in1 = r1.rawResponses[0].usage.inputTokens;
  const in2 = r2.rawResponses[0].usage.inputTokens;
  assert.ok(in2 > in1, `second input_tokens ${in2} <= first ${in1}: the previous response was not continued`);
  return `session: second run sent previous_response_id=${r1.lastResponseId.slice(0, 12)}…, input tokens ${in1} -> ${in2}`;
}

async function streamed({ baseURL, model: modelId }) {
  const { rec, model } = setup(baseURL, modelId);
  const agent = assistant(model);
  const result = await run(agent, "Name three colors.", { stream: true });
  const deltas = [];
  const kinds = new Set();
  for await (const event of result) {
    kinds.add(event.type === "run_item_stream_event" ? `item:${event.name}` : event.type);
    if (event.type === "raw_model_stream_event" && event.data.type === "output_text_delta") {
      deltas.push(event.data.delta);
    }
  }
  await result.completed;
  assert.equal(result.error ?? null, null, `stream error: ${result.error}`);
  const [body] = responsesBodies(rec);
  assert.equal(body.stream, true, "the request was not streamed");
  assert.ok(deltas.length >= 2, `only ${deltas.length} text deltas`);
  nonEmptyString(result.finalOutput, "finalOutput");
  assert.equal(deltas.join(""), result.finalOutput, "text deltas do not concatenate to finalOutput");
  assert.ok(kinds.has("item:message_output_created"), `events: ${[...kinds]}`);
  return `streamed: ${deltas.length} text deltas == finalOutput; events ${[...kinds].join(", ")}`;
}

export const flows = {
  "two-tools": twoTools,
  handoff: handoffFlow,
  session,
  streamed,
};
