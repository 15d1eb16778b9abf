// A Node.js client of Ordo with KafkaJS and no codec plugin: it submits requests to
// <ns>.requests, reads their outcomes from <ns>.results and the tuples of an output stream
// from <ns>.stream.<name>, then makes one live read of the state (<ns>.reads, answered on
// <ns>.read-answers), and prints what it read as one JSON line.
//
//   node client.js BOOTSTRAP NAMESPACE STREAM REQUESTS_JSON READ_JSON
//
// REQUESTS_JSON is a list of steps, each a list of requests ({"id", "proc", "args"}); a
// step is sent once every outcome of the step before it has arrived. READ_JSON is a read
// without its id ({"table", "keys"} or {"table", "scan"}), made once the outcomes and the
// stream's first tuple have arrived, at least as of the newest batch an outcome names.
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const [bootstrap, namespace, stream, stepsJson, readJson] = process.argv.slice(2);
  const steps = JSON.parse(stepsJson);
  const read = JSON.parse(readJson);
  const kafka = new Kafka({ clientId: "ordo-node-check", brokers: bootstrap.split(","), logLevel: logLevel.ERROR });
  const producer = kafka.producer();
  const results = kafka.consumer({ groupId: `${namespace}.node-results`, readUncommitted: false });
  const tuples = kafka.consumer({ groupId: `${namespace}.node-stream`, readUncommitted: false });
  const answers = kafka.consumer({ groupId: `${namespace}.node-reads`, readUncommitted: false });
  await producer.connect();
  await results.connect();
  await tuples.connect();
  await answers.connect();
  await results.subscribe({ topic: `${namespace}.results`, fromBeginning: true });

  // A consumer that cannot decode what it fetched crashes: say so at once.
  for (const consumer of [results, tuples, answers]) {
    consumer.on(consumer.events.CRASH, ({ payload }) => {
      console.error(`node client: ${payload.error.name}: ${payload.error.message}`);
      process.exit(1);
    });
  }
  const outcomes = {};
  const streamed = [];
  let arrived = () => {};
  await results.run({
    eachMessage: async ({ message }) => {
      const outcome = JSON.parse(message.value.toString());
      outcomes[outcome.id] = outcome;
      arrived();
    },
  });
  const until = (done, seconds) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out after ${seconds} s`)), seconds * 1000);
    const check = () => { if (done()) { clearTimeout(timer); resolve(); } };
    arrived = check;
    check();
  });

  for (const step of steps) {
    await producer.send({
      topic: `${namespace}.requests`,
      messages: step.map((request) => ({ key: request.id, value: JSON.stringify(request) })),
    });
    await until(() => step.every((request) => request.id in outcomes), 120);
  }
  // The engine makes an output stream's topic when it first writes to it.
  const admin = kafka.admin();
  await admin.connect();
  const topic = `${namespace}.stream.${stream}`;
  for (let waited = 0; !(await admin.listTopics()).includes(topic); waited += 0.2) {
    if (waited > 60) throw new Error(`topic ${topic} does not exist after 60 s`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  await tuples.subscribe({ topic, fromBeginning: true });
  await tuples.run({
    eachMessage: async ({ message }) => {
      streamed.push(JSON.parse(message.value.toString()));
      arrived();
    },
  });
  await until(() => streamed.length > 0, 60);

  // A live read: every partition the read spans ("parts") answers for the keys it owns,
  // keyed by the read's id, with the batch its values are exactly those of. Its answers
  // are read from where <ns>.read-answers ended before the read was sent.
  const answersTopic = `${namespace}.read-answers`;
  const answersEnd = (await admin.fetchTopicOffsets(answersTopic)).find((p) => p.partition === 0).offset;
  await admin.disconnect();
  const received = [];
  await answers.subscribe({ topic: answersTopic });
  await answers.run({
    eachMessage: async ({ message }) => {
      received.push({ key: message.key ? message.key.toString() : "", answer: JSON.parse(message.value.toString()) });
      arrived();
    },
  });
  answers.seek({ topic: answersTopic, partition: 0, offset: answersEnd });
  const batches = Object.values(outcomes).map((outcome) => outcome.batch || 0);
  const readRequests = [];
  const readAnswers = [];
  const latest = {}; // partition -> its latest answer
  let asked = null; // the partitions asked again, null: every part
  const ask = async (extra) => {
    const request = { id: `${namespace}.node-read-${readRequests.length + 1}`, ...read, ...extra };
    readRequests.push(request);
    asked = extra.partitions || null;
    await producer.send({ topic: `${namespace}.reads`, messages: [{ key: request.id, value: JSON.stringify(request) }] });
    return request.id;
  };
  let current = await ask({ at_least: Math.max(0, ...batches) });
  let parts = null;
  let refused = null;
  // Whether every part has answered the read as last asked, or one answered with an error.
  const answered = () => {
    while (received.length > 0) {
      const { key, answer } = received.shift();
      if (key !== current || answer.id !== current) continue; // another read's, or an earlier ask's
      readAnswers.push(answer);
      if ("error" in answer) refused = refused || answer;
      parts = parts || answer.parts;
      latest[answer.partition] = answer;
    }
    const done = (p) => p in latest && (asked === null || !asked.includes(p) || latest[p].id === current);
    return refused !== null || (parts !== null && parts.every(done));
  };
  // The parts of a read that name different batches are asked again, with at_least the
  // newest of them: the parts behind answer at exactly that batch.
  for (let attempt = 1; ; attempt += 1) {
    await until(answered, 60);
    if (refused) throw new Error(`read ${refused.id}: partition ${refused.partition} answered: ${refused.error}`);
    const newest = Math.max(...parts.map((p) => latest[p].batch));
    const behind = parts.filter((p) => latest[p].batch < newest);
    if (behind.length === 0) break;
    if (attempt === 20) throw new Error(`the parts of the read did not meet at one batch in ${attempt} attempts`);
    current = await ask({ at_least: newest, partitions: behind });
  }
  const found = new Map();
  for (const p of parts) {
    for (const [key, value] of latest[p].values || latest[p].rows) found.set(JSON.stringify(key), value);
  }
  const keys = read.keys || [...found.keys()].map((key) => JSON.parse(key));
  const state = { batch: latest[parts[0]].batch, values: keys.map((key) => [key, found.get(JSON.stringify(key))]) };
  console.log(JSON.stringify({ outcomes, streamed, read: state, read_requests: readRequests, read_answers: readAnswers }));
  await Promise.all([producer.disconnect(), results.disconnect(), tuples.disconnect(), answers.disconnect()]);
}

main().catch((error) => {
  console.error(`node client: ${error.name}: ${error.message}`);
  process.exit(1);
});
