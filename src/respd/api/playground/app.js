// The playground's controller: the composer, the settings, the history, the panels.

import * as api from "./api.js";
import * as history from "./history.js";
import { Turn, el } from "./render.js";
import { DEMO_TOOLS } from "./tools.js";

const $ = (id) => document.getElementById(id);
const TERMINAL = new Set(["response.completed", "response.incomplete", "response.failed", "response.cancelled"]);
const RAW_LIMIT = 200000;

const state = {
  chat: null, // the history entry being shown; null for a new chat
  attachments: [], // {file, image}
  running: null, // {controller, turn, background}
};

// -- messages to the person -----------------------------------------------------------

function banner(message) {
  const node = $("banner");
  node.textContent = message || "";
  node.hidden = !message;
}

function raw(event, text) {
  const log = $("raw-log");
  log.textContent += `event: ${event}\ndata: ${text}\n\n`;
  if (log.textContent.length > RAW_LIMIT) {
    log.textContent = log.textContent.slice(-RAW_LIMIT / 2);
  }
  log.scrollTop = log.scrollHeight;
}

// -- settings -------------------------------------------------------------------------

async function loadModels() {
  const select = $("model");
  try {
    const list = await api.getJSON("/v1/models");
    const chatModels = list.data.filter((m) => !m.endpoints || m.endpoints.includes("/v1/responses"));
    select.replaceChildren(...chatModels.map((m) => el("option", { value: m.id, text: m.id })));
    banner("");
  } catch (error) {
    banner(error.message);
  }
}

function numberOf(id) {
  const value = $(id).value.trim();
  return value === "" ? undefined : Number(value);
}

/** The request fields the settings panel sets. */
function settings() {
  const body = {
    model: $("model").value || undefined,
    store: $("store").checked,
    truncation: $("truncation").value,
  };
  const instructions = $("instructions").value.trim();
  if (instructions) {
    body.instructions = instructions;
  }
  const temperature = numberOf("temperature");
  if (temperature !== undefined) {
    body.temperature = temperature;
  }
  const cap = numberOf("max-output-tokens");
  if (cap !== undefined) {
    body.max_output_tokens = cap;
  }
  if ($("effort").value) {
    body.reasoning = { effort: $("effort").value };
  }
  const choice = $("tool-choice").value;
  const forced = choice in DEMO_TOOLS;
  if ($("offer-tools").checked || forced) {
    body.tools = Object.values(DEMO_TOOLS).map((t) => t.definition);
    body.tool_choice = forced ? { type: "function", name: choice } : choice;
  }
  const extra = extraFields();
  return { ...body, ...extra, tools: [...(body.tools || []), ...(extra.tools || [])] };
}

/** The settings' free-form JSON (e.g. an MCP server or file search as `tools`). */
function extraFields() {
  const text = $("extra").value.trim();
  if (!text) {
    return {};
  }
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new Error(`Extra request fields are not JSON: ${error.message}`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error("Extra request fields must be a JSON object.");
  }
  return value;
}

// -- history --------------------------------------------------------------------------

function remember(turn, title) {
  if (!turn.id || !turn.response.store) {
    return;
  }
  if (!state.chat) {
    state.chat = { key: turn.id, title, at: Date.now(), responses: [] };
  }
  if (!state.chat.responses.includes(turn.id)) {
    state.chat.responses.push(turn.id);
  }
  history.saveChat(state.chat);
  history.setCurrentChat(state.chat.key);
  drawHistory();
}

function drawHistory() {
  const list = $("history-list");
  list.replaceChildren(
    ...history.chats().map((chat) => {
      const label = chat.title || chat.key;
      const when = new Date(chat.at).toLocaleString();
      return el(
        "li",
        { "aria-current": state.chat && state.chat.key === chat.key ? "true" : null },
        el("button", { type: "button", class: "open", onclick: () => openChat(chat.key), title: when, text: label }),
        el("span", { class: "kind", text: chat.conversation ? "conversation" : `${chat.responses.length} responses` }),
        el("button", { type: "button", class: "delete", "aria-label": `Delete ${label}`, onclick: () => deleteChat(chat.key), text: "Delete" }),
      );
    }),
  );
}

async function openChat(key) {
  const chat = history.chat(key);
  if (!chat) {
    return;
  }
  stop();
  newChat();
  state.chat = chat;
  history.setCurrentChat(key);
  drawHistory();
  try {
    if (chat.conversation) {
      await drawConversation(chat.conversation);
    } else {
      await drawResponses(chat);
    }
  } catch (error) {
    banner(`Could not open ${chat.title || key}: ${error.message}`);
  }
}

async function drawResponses(chat) {
  const waiting = history.pending();
  for (const id of chat.responses) {
    let response, inputs;
    try {
      [response, inputs] = await Promise.all([
        api.getJSON(`/v1/responses/${id}`),
        api.getJSON(`/v1/responses/${id}/input_items?order=asc&limit=100`),
      ]);
    } catch (error) {
      // Deleted or expired on the server: say so in its place and draw the rest.
      new Turn($("transcript"), [], actions).showError(`${id}: ${error.message}`);
      continue;
    }
    const turn = new Turn($("transcript"), inputs.data, actions);
    const live = response.status === "queued" || response.status === "in_progress";
    if (live && waiting && waiting.id === id) {
      turn.response = response;
      turn.showStatus();
      resume(turn, waiting.after);
    } else {
      if (waiting && waiting.id === id) {
        history.setPending(null); // it ended while no page followed it
      }
      turn.finish(response);
    }
  }
}

/** Whether a conversation item came from the model (else it opens a new turn). */
function isOutput(item) {
  if (item.type === "message") {
    return item.role === "assistant";
  }
  return item.type !== "function_call_output" && item.type !== "mcp_approval_response";
}

async function drawConversation(id) {
  const page = await api.getJSON(`/v1/conversations/${id}/items?order=asc&limit=100`);
  let turn = null;
  let index = 0;
  for (const item of page.data) {
    if (!isOutput(item) || !turn) {
      turn = new Turn($("transcript"), [item], actions);
      index = 0;
      if (!isOutput(item)) {
        continue;
      }
    }
    turn.drawItem(index, item);
    index += 1;
  }
}

async function deleteChat(key) {
  const chat = history.chat(key);
  if (!chat) {
    return;
  }
  const gone = (promise) => promise.catch((error) => (error.status === 404 ? null : Promise.reject(error)));
  try {
    if (chat.conversation) {
      await gone(api.remove(`/v1/conversations/${chat.conversation}`));
    }
    for (const id of chat.responses) {
      await gone(api.remove(`/v1/responses/${id}`));
    }
  } catch (error) {
    banner(`Could not delete ${chat.title || key}: ${error.message}`);
    return;
  }
  history.forgetChat(key);
  if (state.chat && state.chat.key === key) {
    newChat();
  }
  drawHistory();
}

function newChat() {
  stop();
  state.chat = null;
  history.setCurrentChat(null);
  $("transcript").replaceChildren();
  banner("");
  drawHistory();
}

// -- sending --------------------------------------------------------------------------

const actions = {
  functionOutput(callId, output, turn) {
    send([{ type: "function_call_output", call_id: callId, output }], { after: turn, answer: "output" });
  },
  approval(requestId, approve, turn) {
    send([{ type: "mcp_approval_response", approval_request_id: requestId, approve }], {
      after: turn,
      answer: "approval",
    });
  },
};

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/** The composer's text and attachments as one user message (files uploaded first). */
async function composed(text) {
  const content = [];
  if (text) {
    content.push({ type: "input_text", text });
  }
  for (const { file, image } of state.attachments) {
    if (image) {
      content.push({ type: "input_image", image_url: await readDataUrl(file), detail: "auto" });
    } else {
      const uploaded = await api.uploadFile(file);
      content.push({ type: "input_file", file_id: uploaded.id, filename: file.name });
    }
  }
  return [{ type: "message", role: "user", content }];
}

/**
 * Send `input` as the next turn of the chat. `after`: the turn whose function call or
 * approval request this input answers.
 */
async function send(input, { after = null, answer = null } = {}) {
  if (state.running) {
    return;
  }
  let body;
  try {
    body = { ...settings(), input, stream: true };
  } catch (error) {
    banner(error.message);
    return;
  }
  if (!body.tools.length) {
    delete body.tools;
  }
  const background = $("background").checked;
  if (background) {
    body.background = true;
    body.store = true;
  }
  if (answer && body.tool_choice && body.tool_choice !== "auto" && body.tool_choice !== "none") {
    // A forced call is asked for once: forcing it again on its output would loop, and an
    // approved call runs before the model is asked anything.
    if (answer === "output") {
      body.tool_choice = "none";
    } else {
      delete body.tool_choice;
    }
  }
  const title = titleOf(input);
  try {
    if (!state.chat && $("use-conversation").checked) {
      const conversation = await api.postJSON("/v1/conversations", {});
      state.chat = { key: conversation.id, title, at: Date.now(), responses: [], conversation: conversation.id };
      history.saveChat(state.chat);
      history.setCurrentChat(state.chat.key);
      drawHistory();
    }
  } catch (error) {
    banner(error.message);
    return;
  }
  if (state.chat && state.chat.conversation) {
    body.conversation = state.chat.conversation;
  } else if (after && after.id) {
    body.previous_response_id = after.id;
  } else if (state.chat && state.chat.responses.length) {
    body.previous_response_id = state.chat.responses.at(-1);
  }
  const turn = new Turn($("transcript"), input, actions);
  await follow(turn, (signal) => api.request("/v1/responses", { method: "POST", json: body, signal }), {
    background,
    title,
  });
}

function titleOf(input) {
  const message = input.find((i) => i.type === "message");
  const text = message && message.content.find((p) => p.type === "input_text");
  return text ? text.text.slice(0, 60) : (state.chat && state.chat.title) || "chat";
}

/** Continue a background response's stream after the last event this browser saw. */
function resume(turn, after) {
  const path = `/v1/responses/${turn.id}?stream=true&starting_after=${after}`;
  turn.root.dataset.resumed = "true";
  follow(turn, (signal) => api.request(path, { signal }), { background: true, title: null });
}

/** Read a response's event stream into `turn`, remembering what a reload needs. */
async function follow(turn, open, { background, title }) {
  const controller = new AbortController();
  state.running = { controller, turn, background };
  busy(true);
  try {
    const response = await open(controller.signal);
    for await (const event of api.events(response)) {
      raw(event.event || "message", event.raw);
      const data = event.data || {};
      const type = data.type || event.event;
      turn.handle(type, data);
      if (type === "response.created" && title !== null) {
        remember(turn, title);
      }
      if (background && turn.id && data.sequence_number !== undefined && !TERMINAL.has(type)) {
        history.setPending({ id: turn.id, chat: state.chat && state.chat.key, after: data.sequence_number });
      }
      if (TERMINAL.has(type) && background) {
        history.setPending(null);
      }
    }
    if (!turn.response || !TERMINAL.has(`response.${turn.response.status}`)) {
      turn.showError("The stream ended before the response finished.");
    }
  } catch (error) {
    if (error.name === "AbortError") {
      turn.showError("Stopped: this page no longer follows the response.");
    } else {
      turn.showError(error.message);
      if (error.status === 401) {
        banner(error.message);
      }
    }
  } finally {
    if (state.running && state.running.controller === controller) {
      state.running = null;
    }
    busy(false);
  }
}

function stop() {
  const running = state.running;
  if (!running) {
    return;
  }
  running.controller.abort();
  state.running = null;
  busy(false);
}

async function stopPressed() {
  const running = state.running;
  stop();
  if (running && running.background && running.turn.id) {
    try {
      running.turn.finish(await api.postJSON(`/v1/responses/${running.turn.id}/cancel`, {}));
      history.setPending(null);
    } catch (error) {
      banner(error.message);
    }
  }
}

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

// -- the composer ---------------------------------------------------------------------

function attach(files) {
  for (const file of files) {
    state.attachments.push({ file, image: file.type.startsWith("image/") });
  }
  drawAttachments();
}

function drawAttachments() {
  $("attachments").replaceChildren(
    ...state.attachments.map((a, i) =>
      el(
        "li",
        {},
        `${a.image ? "image" : "file"}: ${a.file.name}`,
        el("button", {
          type: "button",
          "aria-label": `Remove ${a.file.name}`,
          text: "×",
          onclick: () => {
            state.attachments.splice(i, 1);
            drawAttachments();
          },
        }),
      ),
    ),
  );
}

async function submitted(event) {
  event.preventDefault();
  const text = $("input").value.trim();
  if ((!text && !state.attachments.length) || state.running) {
    return;
  }
  let input;
  try {
    input = await composed(text);
  } catch (error) {
    banner(error.message);
    return;
  }
  $("input").value = "";
  state.attachments = [];
  drawAttachments();
  banner("");
  await send(input);
}

function togglePanel(button, panel) {
  const open = !document.body.classList.contains(`show-${panel}`);
  document.body.classList.toggle(`show-${panel}`, open);
  button.setAttribute("aria-expanded", String(open));
  if (panel === "raw" && open) {
    $("raw-log").scrollTop = $("raw-log").scrollHeight; // it could not scroll while hidden
  }
}

function askKey() {
  const dialog = $("key-dialog");
  $("key-input").value = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" ? $("key-input").value.trim() || null : null),
      { once: true },
    );
  });
}

function wire() {
  $("composer").addEventListener("submit", submitted);
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("file-input").addEventListener("change", (event) => {
    attach(event.target.files);
    event.target.value = "";
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (event) => {
    event.preventDefault();
    composer.classList.add("dropping");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dropping"));
  composer.addEventListener("drop", (event) => {
    event.preventDefault();
    composer.classList.remove("dropping");
    attach(event.dataTransfer.files);
  });
  $("stop").addEventListener("click", stopPressed);
  $("new-chat").addEventListener("click", newChat);
  $("clear-raw").addEventListener("click", () => ($("raw-log").textContent = ""));
  for (const panel of ["history", "settings", "raw"]) {
    const button = $(`toggle-${panel}`);
    button.addEventListener("click", () => togglePanel(button, panel));
  }
  $("set-key").addEventListener("click", async () => {
    const key = await askKey();
    if (key) {
      api.setApiKey(key);
      await loadModels();
    }
  });
  api.onKeyNeeded(askKey);
}

async function start() {
  wire();
  if (window.matchMedia("(min-width: 900px)").matches) {
    togglePanel($("toggle-history"), "history");
    togglePanel($("toggle-settings"), "settings");
  }
  drawHistory();
  await loadModels();
  const waiting = history.pending();
  const key = (waiting && waiting.chat) || history.currentChat();
  if (key) {
    await openChat(key);
  }
  $("input").focus();
}

start();
