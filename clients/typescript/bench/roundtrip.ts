// Round trips through the TypeScript client against the same calls made with bare node:http in
// the same run (bench/ts_client.py starts the server and runs this with node 22): the ratio is
// what the client itself costs. Prints one JSON object of millisecond samples.
import * as http from "node:http";

import { Scheduler } from "../src/index.ts";

const [socketPath, runsText] = process.argv.slice(2);
const runs = Number(runsText ?? "50");

const agent = new http.Agent({ keepAlive: true });
function bare(method: string, path: string, body?: unknown): Promise<unknown> {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        socketPath,
        agent,
        method,
        path: `/v1${path}`,
        headers: payload ? { "Content-Type": "application/json", "Content-Length": payload.length } : {},
      },
      (response) => {
        const chunks: Buffer[] = [];
        response.on("data", (c: Buffer) => chunks.push(c));
        response.on("end", () => resolve(JSON.parse(Buffer.concat(chunks).toString())));
      },
    );
    request.on("error", reject);
    request.end(payload);
  });
}

async function sample(fn: () => Promise<unknown>): Promise<number[]> {
  for (let i = 0; i < 3; i++) await fn(); // warm: connections, the REPL
  const out: number[] = [];
  for (let i = 0; i < runs; i++) {
    const started = performance.now();
    await fn();
    out.push(performance.now() - started);
  }
  return out;
}

const sbx = new Scheduler({ socketPath });
const session = await sbx.session({ language: "python" });
const code = { code: "print(1)" };
const results: Record<string, number[]> = {};
// Interleaved in pairs so that the machine's noise falls on both sides alike.
for (let round = 0; round < 2; round++) {
  for (const [name, fn] of [
    ["health_bare", () => bare("GET", "/health")],
    ["health_client", () => sbx.health()],
    ["exec_bare", () => bare("POST", `/sessions/${session.sessionId}/exec`, code)],
    ["exec_client", () => session.exec("print(1)")],
    ["exec_client_streamed", () => session.exec("print(1)", { onStdout: () => {} })],
  ] as const) {
    results[name] = [...(results[name] ?? []), ...(await sample(fn))];
  }
}
await session.close();
sbx.close();
agent.destroy();
console.log(JSON.stringify(results));
