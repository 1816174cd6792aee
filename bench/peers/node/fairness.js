// BullMQ for Node under the fairness measurement (driven by bench/fairness.py).
//
//   node fairness.js add URL QUEUE HEAVY LIGHT PER   one key's HEAVY jobs (ids heavy-<i>), then
//                                                   LIGHT keys' PER jobs each (tenant-<k>-<j>),
//                                                   by Queue.addBulk (the heavy key's in chunks
//                                                   of 10,000); prints ADDED and exits
//   node fairness.js worker URL QUEUE CONCURRENCY MS  one Worker; each job waits MS ms
//                                                   (setTimeout); prints READY <Date.now()>
//                                                   once connected; SIGTERM closes it
//
// A plain queue (free BullMQ has no groups: BullMQ Pro has them), library defaults: completed
// jobs are kept, so the completed set's scores (finishedOn, ms) say when each job finished.
'use strict';
const { Queue, Worker } = require('bullmq');

const CHUNK = 10000;
const [mode, url, name, ...rest] = process.argv.slice(2);
const parsed = new URL(url);
const connection = {
  host: parsed.hostname,
  port: Number(parsed.port || 6379),
  db: Number((parsed.pathname || '/0').slice(1) || 0),
  maxRetriesPerRequest: null, // what BullMQ asks of a Worker's connection
};

async function add(heavy, light, per) {
  const queue = new Queue(name, { connection });
  await queue.waitUntilReady();
  for (let start = 0; start < heavy; start += CHUNK) {
    const end = Math.min(heavy, start + CHUNK);
    const jobs = [];
    for (let i = start; i < end; i += 1) {
      jobs.push({ name: 'work', data: { i }, opts: { jobId: `heavy-${i}` } });
    }
    await queue.addBulk(jobs);
  }
  for (let k = 0; k < light; k += 1) {
    const jobs = [];
    for (let j = 0; j < per; j += 1) {
      jobs.push({ name: 'work', data: { i: j }, opts: { jobId: `tenant-${k}-${j}` } });
    }
    await queue.addBulk(jobs);
  }
  console.log('ADDED');
  await queue.close();
}

async function work(concurrency, ms) {
  const processor = async (job) => {
    await new Promise((resolve) => setTimeout(resolve, ms));
    return job.data.i;
  };
  const worker = new Worker(name, processor, { connection, concurrency });
  await worker.waitUntilReady();
  let closing = false;
  const close = async () => {
    if (closing) return;
    closing = true;
    await worker.close();
    process.exit(0);
  };
  process.on('SIGTERM', close);
  process.on('SIGINT', close);
  console.log(`READY ${Date.now()}`);
}

const numbers = rest.map(Number);
(mode === 'add' ? add(...numbers) : work(...numbers)).catch((err) => {
  console.error(err);
  process.exit(1);
});
