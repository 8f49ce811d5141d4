// A gantry handler for the task type "resize", in Node with nats.js v3
// (@nats-io/transport-node). gantry's workers send each task of a type
// with no built-in handler as a request on gantry.handlers.<type>; the
// reply's headers say how it went. Run: NATS_URL=nats://127.0.0.1:4222 node handler.mjs
import { connect, headers } from "@nats-io/transport-node";

const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
// A queue group: several copies of this handler share the tasks.
const sub = nc.subscribe("gantry.handlers.resize", { queue: "resize" });
await nc.flush();
console.log("ready");

for await (const msg of sub) {
  // Not awaited: the tasks run side by side.
  handle(msg).catch((err) => console.error("handle:", err));
}

async function handle(msg) {
  // {id, type, queue, attempt, payload, resource, checkpoint, deadline}
  const req = msg.json();
  const { steps = 3, step_ms: stepMs = 100, fail } = req.payload ?? {};

  // Progress heartbeats on the reply subject, the first one at once: once
  // one came, the worker gives the attempt up when they stop for its
  // window (a dead handler is noticed in seconds, not at the task's
  // timeout). A body is output lines, shown by `gantry task logs`.
  const progress = (line = "") => {
    const h = headers();
    h.set("Gantry-Progress", "1");
    msg.respond(line, { headers: h });
  };
  progress();
  const window = goDuration(msg.headers?.get("Gantry-Heartbeat-Window")) ?? 5000;
  const beat = setInterval(progress, window / 3);
  console.log(`start ${req.id} attempt ${req.attempt}`);
  try {
    for (let i = 1; i <= steps; i++) {
      await new Promise((resolve) => setTimeout(resolve, stepMs));
      progress(`step ${i}/${steps}`);
    }
    if (fail) {
      // A failure: Gantry-Error, classed permanent (no retry), delay (retry
      // after Gantry-Retry-After, not an attempt) or retry (the default).
      const h = headers();
      h.set("Gantry-Error", `cannot resize: ${fail}`);
      h.set("Gantry-Error-Class", "permanent");
      msg.respond("", { headers: h });
      return;
    }
    // Success: no Gantry-Error; the body is kept as the task's output.
    msg.respond(JSON.stringify({ resized: req.id, steps }));
    console.log(`done ${req.id}`);
  } finally {
    clearInterval(beat);
  }
}

// goDuration reads a Go duration ("5s", "1m30s", "300ms") as milliseconds.
function goDuration(s) {
  const unit = { h: 3600e3, m: 60e3, s: 1e3, ms: 1, us: 1e-3, "µs": 1e-3, ns: 1e-6 };
  const parts = [...(s ?? "").matchAll(/([\d.]+)(h|ms|m|s|us|µs|ns)/g)];
  return parts.length ? parts.reduce((ms, [, n, u]) => ms + Number(n) * unit[u], 0) : undefined;
}
