// Shared plumbing for the Node.js client flows: the environment, a recording `fetch` that
// every client is given, a guard that keeps all traffic on respd, and small assertions.

import assert from "node:assert/strict";

export { assert };

export const API_KEY = "sk-test";

/** RESPD_BASE_URL (with /v1) and RESPD_MODEL, both required. */
export function env() {
  const baseURL = process.env.RESPD_BASE_URL;
  const model = process.env.RESPD_MODEL;
  if (!baseURL) throw new Error("RESPD_BASE_URL is not set (e.g. http://127.0.0.1:8311/v1)");
  if (!model) throw new Error("RESPD_MODEL is not set (e.g. smollm2-135m-instruct)");
  return { baseURL: baseURL.replace(/\/+$/, ""), model };
}

function requestParts(input, init) {
  const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
  const given = typeof input === "object" ? input.method : undefined; // a Request carries its own
  const method = (init?.method ?? given ?? "GET").toUpperCase();
  return { url, method };
}

function decodeBody(body) {
  if (body == null) return null;
  const text =
    typeof body === "string"
      ? body
      : body instanceof Uint8Array || body instanceof ArrayBuffer
        ? new TextDecoder().decode(body)
        : null;
  if (text == null) return `<${body?.constructor?.name ?? typeof body} body>`;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/**
 * Every request the process makes goes through globalThis.fetch; only respd's origin is
 * allowed. Anything else (api.openai.com for tracing, a default client) is refused and
 * remembered, so a flow fails even when the library swallowed the refusal.
 */
export const strayRequests = [];

export function guardGlobalFetch(baseURL) {
  const origin = new URL(baseURL).origin;
  const realFetch = globalThis.fetch;
  globalThis.fetch = async (input, init) => {
    const { url, method } = requestParts(input, init);
    if (new URL(url).origin !== origin) {
      strayRequests.push(`${method} ${url}`);
      throw new Error(`refused a request outside respd (${origin}): ${method} ${url}`);
    }
    return realFetch(input, init);
  };
}

/**
 * A fetch for a client's `fetch` option: records each call (method, url, JSON body, status,
 * and the answer's text when it is an error) in `calls`, and forwards it unchanged.
 */
/** Every call any recorder saw, in order: run.mjs prints them when a flow fails. */
export const allCalls = [];

/** A URL's path from `/v1` on: the base URL may sit under a prefix (a proxy's, say). */
function apiPath(url) {
  const prefix = new URL(env().baseURL).pathname.replace(/\/v1$/, "");
  const path = new URL(url).pathname;
  return prefix && path.startsWith(prefix) ? path.slice(prefix.length) : path;
}

export function recorder() {
  const calls = [];
  const fetchFn = async (input, init) => {
    const { url, method } = requestParts(input, init);
    const call = { method, url, path: apiPath(url), body: decodeBody(init?.body) };
    calls.push(call);
    allCalls.push(call);
    const res = await globalThis.fetch(input, init);
    call.status = res.status;
    if (!res.ok) call.error = await res.clone().text();
    return res;
  };
  return { calls, fetch: fetchFn };
}

/** The calls to one path (e.g. "/v1/responses"), POSTs only unless told otherwise. */
export function callsTo(calls, path, method = "POST") {
  return calls.filter((c) => c.method === method && c.path === path);
}

export function nonEmptyString(value, what) {
  assert.equal(typeof value, "string", `${what} is not a string: ${JSON.stringify(value)}`);
  assert.ok(value.trim().length > 0, `${what} is empty`);
}

export function intInRange(value, lo, hi, what) {
  assert.ok(Number.isInteger(value), `${what} is not an integer: ${JSON.stringify(value)}`);
  assert.ok(value >= lo && value <= hi, `${what}=${value} is outside [${lo}, ${hi}]`);
}

/** The usage block of a Responses API object: token counts present and consistent. */
export function checkUsage(usage, what = "usage") {
  assert.ok(usage, `${what} is missing`);
  assert.ok(usage.input_tokens > 0, `${what}.input_tokens=${usage.input_tokens}`);
  assert.ok(usage.output_tokens > 0, `${what}.output_tokens=${usage.output_tokens}`);
  assert.equal(usage.total_tokens, usage.input_tokens + usage.output_tokens, `${what}.total_tokens`);
}
