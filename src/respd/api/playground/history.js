// What this browser remembers between visits. The server lists no stored responses, so
// the page keeps the ids it created (in localStorage) and fetches each by id.

const HISTORY = "respd.history";
const CURRENT = "respd.current";
const PENDING = "respd.pending";

function read(slot, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(slot));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

function write(slot, value) {
  if (value === null || value === undefined) {
    localStorage.removeItem(slot);
  } else {
    localStorage.setItem(slot, JSON.stringify(value));
  }
}

/** Chats, newest first: `{key, title, at, responses: [ids], conversation?}`. */
export function chats() {
  return read(HISTORY, []);
}

export function chat(key) {
  return chats().find((c) => c.key === key) || null;
}

export function saveChat(entry) {
  const rest = chats().filter((c) => c.key !== entry.key);
  write(HISTORY, [entry, ...rest].slice(0, 100));
}

export function forgetChat(key) {
  write(
    HISTORY,
    chats().filter((c) => c.key !== key),
  );
  if (currentChat() === key) {
    setCurrentChat(null);
  }
}

export function currentChat() {
  return read(CURRENT, null);
}

export function setCurrentChat(key) {
  write(CURRENT, key);
}

/** A background response still being followed: `{id, chat, after}` (last sequence seen). */
export function pending() {
  return read(PENDING, null);
}

export function setPending(value) {
  write(PENDING, value);
}
