// node run.mjs <client> <flow>   runs one flow of one Node.js client against respd
// node run.mjs --list            prints {"<client>": ["<flow>", ...], ...}
//
// Environment: RESPD_BASE_URL (with /v1), RESPD_MODEL. On success the last stdout line is
// {"ok": true, "detail": "..."} and the exit code 0; on failure the error (with its stack)
// and the requests the flow sent go to stderr and the exit code is 1. An unknown client or
// flow exits 2. RESPD_NODE_TRACE=1 prints the requests on success too.

import { allCalls, env, guardGlobalFetch, strayRequests } from "./common.mjs";

// Each client's module is imported only when one of its flows runs.
const CLIENTS = {
  "openai-node": {
    module: "./openai-node.mjs",
    flows: ["create", "stream", "function-tools", "zod-text-format", "conversations"],
  },
  "vercel-ai": {
    module: "./vercel-ai.mjs",
    flows: ["generate-text", "stream-text", "tool-loop", "generate-object"],
  },
  "agents-js": {
    module: "./agents-js.mjs",
    flows: ["two-tools", "handoff", "session", "streamed"],
  },
};

function usage(message) {
  process.stderr.write(`${message}\nusage: node run.mjs <client> <flow> | node run.mjs --list\n`);
  process.stderr.write(`clients and flows: ${JSON.stringify(list())}\n`);
  process.exit(2);
}

function list() {
  return Object.fromEntries(Object.entries(CLIENTS).map(([name, c]) => [name, c.flows]));
}

async function main(argv) {
  if (argv.length === 1 && argv[0] === "--list") {
    process.stdout.write(JSON.stringify(list()) + "\n");
    return 0;
  }
  if (argv.length !== 2) usage(`expected <client> <flow>, got ${JSON.stringify(argv)}`);
  const [clientName, flowName] = argv;
  const client = CLIENTS[clientName];
  if (!client) usage(`unknown client ${JSON.stringify(clientName)}`);
  if (!client.flows.includes(flowName)) usage(`unknown flow ${JSON.stringify(flowName)} of ${clientName}`);

  const config = env();
  guardGlobalFetch(config.baseURL);
  const { flows } = await import(client.module);
  const flow = flows[flowName];
  if (typeof flow !== "function") throw new Error(`${client.module} does not define flow ${flowName}`);
  try {
    const detail = await flow(config);
    if (strayRequests.length) {
      throw new Error(`requests outside respd were attempted: ${strayRequests.join(", ")}`);
    }
    if (process.env.RESPD_NODE_TRACE === "1") dumpCalls(allCalls);
    process.stdout.write(JSON.stringify({ ok: true, detail }) + "\n");
    return 0;
  } catch (err) {
    dumpCalls(allCalls);
    throw err;
  }
}

function dumpCalls(calls) {
  if (!calls?.length) return;
  process.stderr.write("requests sent by the flow:\n");
  for (const c of calls) {
    process.stderr.write(`  ${c.method} ${c.path} -> ${c.status ?? "(no answer)"}\n`);
    if (c.body != null) process.stderr.write(`    body: ${JSON.stringify(c.body)}\n`);
    if (c.error != null) process.stderr.write(`    answer: ${c.error}\n`);
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`${err?.stack ?? err}\n`);
    if (err?.cause) process.stderr.write(`cause: ${err.cause?.stack ?? err.cause}\n`);
    if (strayRequests.length) process.stderr.write(`requests outside respd: ${strayRequests.join(", ")}\n`);
    process.exit(1);
  },
);
