// A Node.js client of Ordo with KafkaJS and no codec plugin: it submits requests to
// <ns>.requests, reads their outcomes from <ns>.results and the tuples of an output stream
// from <ns>.stream.<name>, and prints what it read as one JSON line.
//
//   node client.js BOOTSTRAP NAMESPACE STREAM REQUESTS_JSON
//
// REQUESTS_JSON is a list of steps, each a list of requests ({"id", "proc", "args"}); a
// step is sent once every outcome of the step before it has arrived.
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const [bootstrap, namespace, stream, stepsJson] = process.argv.slice(2);
  const steps = JSON.parse(stepsJson);
  const kafka = new Kafka({ clientId: "ordo-node-check", brokers: bootstrap.split(","), logLevel: logLevel.ERROR });
  const producer = kafka.producer();
  const results = kafka.consumer({ groupId: `${namespace}.node-results`, readUncommitted: false });
  const tuples = kafka.consumer({ groupId: `${namespace}.node-stream`, readUncommitted: false });
  await producer.connect();
  await results.connect();
  await tuples.connect();
  await results.subscribe({ topic: `${namespace}.results`, fromBeginning: true });

  // A consumer that cannot decode what it fetched crashes: say so at once.
  for (const consumer of [results, tuples]) {
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
  await admin.disconnect();
  await tuples.subscribe({ topic, fromBeginning: true });
  await tuples.run({
    eachMessage: async ({ message }) => {
      streamed.push(JSON.parse(message.value.toString()));
      arrived();
    },
  });
  await until(() => streamed.length > 0, 60);
  console.log(JSON.stringify({ outcomes, streamed }));
  await Promise.all([producer.disconnect(), results.disconnect(), tuples.disconnect()]);
}

main().catch((error) => {
  console.error(`node client: ${error.name}: ${error.message}`);
  process.exit(1);
});
