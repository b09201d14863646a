// Talking to this server: JSON requests, file uploads, and server-sent event streams.
// The page is served by the same server, so every request is same-origin: the request
// guard trusts it and no CORS is involved.

const KEY_SLOT = "respd.apiKey";

/** An error answer from the API, carrying the server's own message. */
export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.error ? body.error : {};
    super(detail.message || `HTTP ${status}`);
    this.status = status;
    this.code = detail.code || null;
    this.type = detail.type || null;
  }
}

let askForKey = async () => null;
let asked = false;

/** Install what is called (once) when the server first answers 401; it resolves to a key. */
export function onKeyNeeded(ask) {
  askForKey = ask;
}

export function apiKey() {
  return sessionStorage.getItem(KEY_SLOT);
}

export function setApiKey(key) {
  if (key) {
    sessionStorage.setItem(KEY_SLOT, key);
  } else {
    sessionStorage.removeItem(KEY_SLOT);
  }
}

function headers(extra) {
  const out = { ...extra };
  const key = apiKey();
  if (key) {
    out.Authorization = `Bearer ${key}`;
  }
  return out;
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return new ApiError(response.status, body);
}

/**
 * `fetch` with the key. On the first 401 of the page's life the person is asked for a key
 * and the request is tried again; after that a 401 is an error like any other, so a wrong
 * key shows the server's message instead of asking forever.
 */
export async function request(path, { method = "GET", json, form, signal } = {}) {
  const init = { method, signal, headers: {} };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (form !== undefined) {
    init.body = form;
  }
  const send = () => fetch(path, { ...init, headers: headers(init.headers) });
  let response = await send();
  if (response.status === 401 && !asked) {
    asked = true;
    const key = await askForKey();
    if (key) {
      setApiKey(key);
      response = await send();
    }
  }
  if (!response.ok) {
    throw await errorOf(response);
  }
  return response;
}

export async function getJSON(path, options) {
  return (await request(path, options)).json();
}

export async function postJSON(path, json, options = {}) {
  return (await request(path, { ...options, method: "POST", json })).json();
}

export async function remove(path) {
  return (await request(path, { method: "DELETE" })).json();
}

/** Upload a file for use as model input; resolves to the file object. */
export async function uploadFile(file) {
  const form = new FormData();
  form.append("purpose", "user_data");
  form.append("file", file, file.name);
  return (await request("/v1/files", { method: "POST", form })).json();
}

/**
 * The events of an SSE body, parsed as they arrive: `event:` names the type, `data:` lines
 * (joined by newlines) carry JSON, a blank line ends an event, `:` lines are keep-alives.
 */
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let name = null;
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) {
      break;
    }
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end).replace(/\r$/, "");
      buffer = buffer.slice(end + 1);
      if (line === "") {
        if (data.length) {
          yield { event: name, raw: data.join("\n"), data: parse(data.join("\n")) };
        }
        name = null;
        data = [];
      } else if (line.startsWith(":")) {
        continue;
      } else {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") {
          name = text;
        } else if (field === "data") {
          data.push(text);
        }
      }
    }
  }
}

function parse(text) {
  if (text === "[DONE]") {
    return null;
  }
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
