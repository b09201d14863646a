// Demo function tools the page runs itself, offered to the model as `tools`. Their results
// are put in the call's card for the person to send (or edit first).

export const DEMO_TOOLS = {
  get_time: {
    definition: {
      type: "function",
      name: "get_time",
      description: "The current date and time in an IANA time zone.",
      parameters: {
        type: "object",
        properties: { timezone: { type: "string", description: "e.g. Europe/Paris" } },
        required: ["timezone"],
        additionalProperties: false,
      },
      strict: true,
    },
    run({ timezone }) {
      try {
        return new Date().toLocaleString("en-GB", { timeZone: timezone, timeZoneName: "short" });
      } catch {
        return new Date().toISOString();
      }
    },
  },
  roll_dice: {
    definition: {
      type: "function",
      name: "roll_dice",
      description: "Roll dice with the given number of sides and return each result.",
      parameters: {
        type: "object",
        properties: {
          count: { type: "integer", description: "How many dice" },
          sides: { type: "integer", description: "Sides of each die" },
        },
        required: ["count", "sides"],
        additionalProperties: false,
      },
      strict: true,
    },
    run({ count, sides }) {
      const n = Math.min(Math.max(Number(count) || 1, 1), 20);
      const s = Math.min(Math.max(Number(sides) || 6, 2), 1000);
      const rolls = Array.from({ length: n }, () => 1 + Math.floor(Math.random() * s));
      return JSON.stringify({ rolls, total: rolls.reduce((a, b) => a + b, 0) });
    },
  },
};

/** The demo tool's answer to a call, or null when the page has no such tool. */
export function runDemo(name, argumentsText) {
  const tool = DEMO_TOOLS[name];
  if (!tool) {
    return null;
  }
  let args = {};
  try {
    args = JSON.parse(argumentsText || "{}");
  } catch {
    args = {};
  }
  return tool.run(args);
}
