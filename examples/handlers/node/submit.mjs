// Submit resize tasks to gantry and wait until each has ended, in Node
// with nats.js v3. Usage: node submit.mjs [COUNT] [ID-PREFIX] [STEPS] [STEP_MS]
// Prints one JSON line per task as it ends; exits 0 if all SUCCEEDED.
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";

const [count = "3", prefix = `resize-${Date.now()}`, steps = "3", stepMs = "100"] = process.argv.slice(2);
const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
const js = jetstream(nc);

// Every task ends with exactly one TASK_FINISHED event: listen first.
const finished = nc.subscribe("gantry.audit.task.finished");
await nc.flush();

const waiting = new Set();
for (let i = 1; i <= Number(count); i++) {
  const id = `${prefix}-${i}`;
  const task = { id, payload: { steps: Number(steps), step_ms: Number(stepMs) }, timeout: "10m" };
  // The JetStream publish returns once the task is stored; the message id
  // makes a second publish of the same task a duplicate the stream drops.
  await js.publish("gantry.tasks.default.resize", JSON.stringify(task), { msgID: id });
  waiting.add(id);
}

let failed = 0;
for await (const m of finished) {
  const ev = m.json();
  if (!waiting.delete(ev.task_id)) continue;
  console.log(JSON.stringify({ id: ev.task_id, state: ev.payload.state, attempts: ev.payload.attempts }));
  if (ev.payload.state !== "SUCCEEDED") failed++;
  if (waiting.size === 0) break;
}
await nc.drain();
process.exit(failed ? 1 : 0);
