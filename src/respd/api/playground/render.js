// A turn on screen: the person's input, then the response's output items as they stream
// in, then its usage and timings. Items are drawn from stream events while they arrive and
// drawn again from the finished response, which is the record.

import { runDemo } from "./tools.js";

/** `el("div", {class: "x"}, child, "text")`: a DOM element. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) {
      continue;
    }
    if (name.startsWith("on")) {
      node.addEventListener(name.slice(2), value);
    } else if (name === "text") {
      node.textContent = value;
    } else {
      node.setAttribute(name, value === true ? "" : value);
    }
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

const SERVER_TOOL_TYPES = new Set([
  "mcp_call",
  "mcp_list_tools",
  "mcp_approval_request",
  "file_search_call",
  "web_search_call",
]);

let idCounter = 0;
const nextId = (prefix) => `${prefix}-${++idCounter}`;

/** The text parts of a message's or reasoning item's content. */
function textsOf(item) {
  const parts = [...(item.content || []), ...(item.summary || [])];
  return parts.map((p) => p.text ?? p.refusal ?? "").filter((t) => t !== "");
}

/** A user input item (or a plain string) as a short description. */
function describeInput(item) {
  if (typeof item === "string") {
    return [item];
  }
  if (item.type === "function_call_output") {
    return [`↳ output for ${item.call_id}: ${item.output}`];
  }
  if (item.type === "mcp_approval_response") {
    return [`↳ ${item.approve ? "approved" : "denied"} ${item.approval_request_id}`];
  }
  const content = typeof item.content === "string" ? [{ type: "input_text", text: item.content }] : item.content || [];
  return content.map((part) => {
    if (part.type === "input_text") {
      return part.text;
    }
    if (part.type === "input_image") {
      return "[image]";
    }
    if (part.type === "input_file") {
      return `[file ${part.filename || part.file_id || ""}]`;
    }
    return `[${part.type}]`;
  });
}

export class Turn {
  /**
   * `actions`: `{functionOutput(callId, output, turn), approval(requestId, approve, turn)}`,
   * what the cards' buttons do.
   */
  constructor(container, input, actions) {
    this.actions = actions;
    this.items = new Map();
    this.response = null;
    this.started = performance.now();
    this.firstToken = null;
    this.finished = null;
    this.forced = false;
    this.user = el("div", { class: "user" });
    this.output = el("div", { class: "items" });
    this.stats = el("p", { class: "stats" });
    this.error = el("p", { class: "turn-error", role: "alert", hidden: true });
    this.root = el("article", { class: "turn" }, this.user, this.output, this.error, this.stats);
    this.setInput(input);
    container.append(this.root);
  }

  setInput(input) {
    this.user.replaceChildren();
    const items = Array.isArray(input) ? input : [input];
    for (const item of items) {
      for (const line of describeInput(item)) {
        this.user.append(el("p", { text: line }));
      }
    }
    this.user.hidden = this.user.childElementCount === 0;
  }

  get id() {
    return this.response ? this.response.id : null;
  }

  /** One stream event (`data` is its parsed JSON). */
  handle(type, data) {
    if (type.endsWith(".delta")) {
      this.firstToken ??= performance.now(); // text, arguments or a server tool's call
    }
    switch (type) {
      case "response.created":
      case "response.queued":
      case "response.in_progress":
        this.response = data.response;
        this.showStatus();
        break;
      case "response.output_item.added":
      case "response.output_item.done":
        this.drawItem(data.output_index, data.item);
        break;
      case "response.output_text.delta":
      case "response.refusal.delta":
      case "response.reasoning_text.delta":
      case "response.reasoning_summary_text.delta":
        this.appendText(data.output_index, type, data.content_index ?? data.summary_index ?? 0, data.delta);
        break;
      case "response.function_call_arguments.delta":
        this.appendArguments(data.output_index, data.delta);
        break;
      case "response.completed":
      case "response.incomplete":
      case "response.failed":
      case "response.cancelled":
        this.finish(data.response);
        break;
      case "error":
        this.showError(data.message || (data.error && data.error.message) || "The stream failed.");
        break;
      default:
        break;
    }
  }

  /** Draw a finished (or stored) response whole. */
  finish(response) {
    this.response = response;
    this.finished ??= performance.now();
    this.output.replaceChildren();
    this.items.clear();
    (response.output || []).forEach((item, index) => this.drawItem(index, item));
    if (response.status === "failed" && response.error) {
      this.showError(response.error.message || "The response failed.");
    }
    this.showStatus();
  }

  showError(message) {
    this.error.textContent = message;
    this.error.hidden = false;
  }

  showStatus() {
    const r = this.response;
    if (!r) {
      return;
    }
    const parts = [r.status];
    if (r.status === "incomplete" && r.incomplete_details) {
      parts[0] = `incomplete (${r.incomplete_details.reason})`;
    }
    const usage = r.usage;
    if (usage) {
      const cached = (usage.input_tokens_details || {}).cached_tokens ?? 0;
      parts.push(`input ${usage.input_tokens} tokens (${cached} cached)`, `output ${usage.output_tokens} tokens`);
      if (this.firstToken !== null) {
        parts.push(`first token ${Math.round(this.firstToken - this.started)} ms`);
        const seconds = ((this.finished ?? performance.now()) - this.firstToken) / 1000;
        if (seconds > 0 && usage.output_tokens > 1) {
          parts.push(`${((usage.output_tokens - 1) / seconds).toFixed(1)} tokens/s`);
        }
      }
    }
    this.stats.textContent = parts.join(" · ");
    this.root.dataset.status = r.status;
    this.root.dataset.responseId = r.id;
  }

  drawItem(index, item) {
    const drawn = this.draw(item);
    drawn.dataset.type = item.type;
    const old = this.items.get(index);
    if (old) {
      old.node.replaceWith(drawn);
    } else {
      this.output.append(drawn);
    }
    this.items.set(index, { node: drawn, item });
  }

  draw(item) {
    if (item.type === "message") {
      const body = el("div", { class: "text" });
      textsOf(item).forEach((t, i) => body.append(el("span", { "data-part": i, text: t })));
      return el("div", { class: "item message" }, body);
    }
    if (item.type === "reasoning") {
      const body = el("div", { class: "text" });
      textsOf(item).forEach((t, i) => body.append(el("span", { "data-part": i, text: t })));
      return el("details", { class: "item reasoning" }, el("summary", { text: "Reasoning" }), body);
    }
    if (item.type === "function_call") {
      return this.functionCard(item);
    }
    return this.serverToolCard(item);
  }

  /** The growing text of a message or reasoning item (drawn if a resumed stream missed it). */
  appendText(index, type, part, delta) {
    const reasoning = type.startsWith("response.reasoning");
    let entry = this.items.get(index);
    if (!entry) {
      this.drawItem(index, reasoning ? { type: "reasoning", summary: [] } : { type: "message", content: [] });
      entry = this.items.get(index);
    }
    const body = entry.node.querySelector(".text");
    if (!body) {
      return;
    }
    let span = body.querySelector(`[data-part="${part}"]`);
    if (!span) {
      span = el("span", { "data-part": part });
      body.append(span);
    }
    span.textContent += delta;
  }

  appendArguments(index, delta) {
    const entry = this.items.get(index);
    const args = entry && entry.node.querySelector(".arguments");
    if (args) {
      args.textContent += delta;
    }
  }

  functionCard(item) {
    const done = item.status !== "in_progress";
    const card = el(
      "section",
      { class: "item card function-call", "aria-label": `Function call ${item.name}` },
      el("h3", {}, el("span", { class: "badge", text: "function_call" }), ` ${item.name}`),
      el("pre", { class: "arguments", text: item.arguments || "" }),
    );
    if (!done || !this.actions.functionOutput) {
      return card;
    }
    const fieldId = nextId("output");
    const demo = runDemo(item.name, item.arguments);
    const field = el("textarea", { id: fieldId, class: "call-output", rows: 2 });
    field.value = demo ?? "";
    const send = el("button", { type: "submit", text: "Send output" });
    const form = el(
      "form",
      {
        class: "call-form",
        onsubmit: (event) => {
          event.preventDefault();
          send.disabled = true;
          field.readOnly = true;
          this.actions.functionOutput(item.call_id, field.value, this);
        },
      },
      el("label", {
        for: fieldId,
        text: demo === null ? `Output of ${item.name} (you answer it)` : `Output of ${item.name} (run by this page; edit if you like)`,
      }),
      field,
      send,
    );
    card.append(form);
    return card;
  }

  serverToolCard(item) {
    const label = item.name || item.server_label || (item.action && item.action.query) || "";
    const kind = SERVER_TOOL_TYPES.has(item.type) ? "server-tool" : "other";
    const card = el(
      "section",
      { class: `item card ${kind}`, "aria-label": `${item.type} ${label}` },
      el("h3", {}, el("span", { class: "badge", text: item.type }), ` ${label}`),
      item.status ? el("p", { class: "status", text: `status: ${item.status}` }) : null,
      item.arguments ? el("pre", { class: "arguments", text: item.arguments }) : null,
      item.output ? el("pre", { class: "tool-output", text: `→ ${item.output}` }) : null,
      item.error
        ? el("p", { class: "turn-error", text: typeof item.error === "string" ? item.error : JSON.stringify(item.error) })
        : null,
      el("details", {}, el("summary", { text: "Item" }), el("pre", { text: JSON.stringify(item, null, 2) })),
    );
    if (item.type === "mcp_approval_request" && this.actions.approval) {
      const answer = (approve) => () => {
        card.querySelectorAll("button").forEach((b) => (b.disabled = true));
        this.actions.approval(item.id, approve, this);
      };
      card.append(
        el(
          "div",
          { class: "buttons" },
          el("button", { type: "button", onclick: answer(true), text: "Approve" }),
          el("button", { type: "button", onclick: answer(false), text: "Deny" }),
        ),
      );
    }
    return card;
  }
}
