// BullMQ for Node under the EchoMQ benchmark (driven by bench/peers/bullmq_node_peer.py).
//
//   node peer.js worker URL QUEUE[,QUEUE] CONCURRENCY   one Worker per queue; SIGTERM closes them
//   node peer.js driver URL QUEUE[,QUEUE]               adds jobs when told, on stdin, one JSON
//                                                      line per command:
//     {"op": "bulk", "queue": "w1", "n": 20000, "name": "noop"}     Queue.addBulk
//     {"op": "flow", "parent": "w2", "child": "w2", "n": 10000, "id": "..."}   FlowProducer.add
//
// Both print BENCH-READY once connected (Node's start-up and the connections stay outside the
// timed window: the harness opens it just before it sends a command). Processors: "noop"
// returns null, "child" returns 2 * i, "io" waits 50 ms (setTimeout), "cost" waits 2 ms (W8),
// "parent" reads getChildrenValues() and returns {count, sum} - BullMQ's own fan-in.
'use strict';
const { Queue, Worker, FlowProducer } = require('bullmq');
const readline = require('readline');

const READY = 'BENCH-READY';
const IO_WAIT_MS = 50;
// W8: Node's timers run at whole milliseconds (2.01 is 2), and fire no earlier than asked
const COST_CALL_MS = 2;
const COST_ITEM_MS = 0.01;
const [mode, url, queueList, concurrency] = process.argv.slice(2);
const parsed = new URL(url);
const connection = {
  host: parsed.hostname,
  port: Number(parsed.port || 6379),
  db: Number((parsed.pathname || '/0').slice(1) || 0),
  maxRetriesPerRequest: null, // what BullMQ asks of a Worker's connection
};
const queues = queueList.split(',');

async function processor(job) {
  switch (job.name) {
    case 'noop':
      return null;
    case 'io':
      await new Promise((resolve) => setTimeout(resolve, IO_WAIT_MS));
      return null;
    case 'cost': // W8 (bench/w8_batch.py): a call's cost, 2 ms + 10 us per item, per job here
      await new Promise((resolve) => setTimeout(resolve, COST_CALL_MS + COST_ITEM_MS));
      return null;
    case 'parent': {
      const values = await job.getChildrenValues();
      let count = 0;
      let sum = 0;
      for (const value of Object.values(values)) {
        count += 1;
        sum += value;
      }
      return { count, sum };
    }
    default:
      return job.data.i * 2;
  }
}

async function worker() {
  const workers = queues.map(
    (name) => new Worker(name, processor, { connection, concurrency: Number(concurrency) }),
  );
  await Promise.all(workers.map((w) => w.waitUntilReady()));
  let closing = false;
  const close = async () => {
    if (closing) return;
    closing = true;
    await Promise.all(workers.map((w) => w.close()));
    process.exit(0);
  };
  process.on('SIGTERM', close);
  process.on('SIGINT', close);
  console.log(READY);
}

async function driver() {
  const byName = new Map(queues.map((name) => [name, new Queue(name, { connection })]));
  const producer = new FlowProducer({ connection });
  await Promise.all([...byName.values()].map((q) => q.waitUntilReady()));
  await producer.waitUntilReady();
  const lines = readline.createInterface({ input: process.stdin });
  console.log(READY);
  for await (const line of lines) {
    const cmd = JSON.parse(line);
    if (cmd.op === 'bulk') {
      const jobs = Array.from({ length: cmd.n }, (_, i) => ({ name: cmd.name, data: { i } }));
      await byName.get(cmd.queue).addBulk(jobs);
    } else if (cmd.op === 'flow') {
      const children = Array.from({ length: cmd.n }, (_, i) => ({
        name: 'child',
        queueName: cmd.child,
        data: { i },
      }));
      await producer.add({
        name: 'parent',
        queueName: cmd.parent,
        data: {},
        opts: { jobId: cmd.id },
        children,
      });
    }
    console.log(`ADDED ${cmd.op}`);
  }
  await producer.close();
  await Promise.all([...byName.values()].map((q) => q.close()));
}

(mode === 'worker' ? worker() : driver()).catch((err) => {
  console.error(err);
  process.exit(1);
});
