// The official Node 5.x client (rocketmq-client-nodejs) against `rmqstore serve`'s gRPC endpoint:
// a Producer sends N messages with tags and keys, a SimpleConsumer receives and acks them all.
// Prints one JSON line: {"sent": [ids], "received": [ids], "bodies": [...], "views": [what the client reports
// of each message: corrupted, tag, keys, properties]}. Used by tests/proxy/test_grpc_node.py.
const path = require('path');
const { Producer, SimpleConsumer } = require(path.join(process.env.RMQ_NODE_MODULES, 'rocketmq-client-nodejs'));
const [endpoints, topic, group, n] = [process.argv[2], process.argv[3], process.argv[4], Number(process.argv[5])];
(async () => {
  const producer = new Producer({ endpoints, topics: [topic], requestTimeout: 10000 });
  await producer.startup();
  const sent = [];
  for (let i = 0; i < n; i++) {
    const r = await producer.send({ topic, tag: 'N', keys: ['nk' + i], body: Buffer.from('node ' + i),
                                    properties: new Map([['idx', String(i)]]) });
    sent.push(r.messageId);
  }
  const consumer = new SimpleConsumer({ endpoints, consumerGroup: group, requestTimeout: 10000,
                                        subscriptions: new Map([[topic, 'N']]), awaitDuration: 3000 });
  await consumer.startup();
  const received = [], bodies = [], views = [];
  const end = Date.now() + 60000;
  while (received.length < n && Date.now() < end) {
    for (const m of await consumer.receive(16, 30000)) {
      received.push(m.messageId);
      bodies.push(m.body.toString());
      // what the client itself says of the message: its body digest check, tag, keys, properties
      views.push({ id: m.messageId, corrupted: Boolean(m.corrupted), tag: m.tag, keys: m.keys,
                   properties: Object.fromEntries(m.properties) });
      await consumer.ack(m);
    }
  }
  console.log(JSON.stringify({ sent, received, bodies, views }));
  await consumer.shutdown().catch(() => {});
  await producer.shutdown().catch(() => {});
  process.exit(0);
})().catch(e => { console.error('FAIL', e); process.exit(1); });
