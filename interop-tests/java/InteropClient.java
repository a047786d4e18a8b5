// Interop scenarios run with the RabbitMQ Java client (Debian librabbitmq-client-java).
//
// Usage: java -cp amqp-client.jar:slf4j-api.jar:slf4j-nop.jar InteropClient.java \
//            SCENARIO HOST PORT VHOST USER PASSWORD NAME [ARGS...]
//
// Every result is printed to stdout as one line of tab-separated fields, first field the kind
// of record (e.g. "header<TAB>i-int<TAB>Integer:42"); test_java_client.py parses and asserts on
// them. The last line is "done<TAB>SCENARIO". Any unexpected exception exits with status 1 and
// a stack trace on stderr. Nothing here asserts: the Python side does.
import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.LongString;
import com.rabbitmq.client.ReturnListener;
import com.rabbitmq.client.RpcClient;
import com.rabbitmq.client.ShutdownSignalException;

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Date;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

public class InteropClient {
    static final long WAIT_MS = 10_000;
    static PrintStream out;
    static String user;

    public static void main(String[] args) throws Exception {
        out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        if (args.length < 7) {
            System.err.println("usage: InteropClient SCENARIO HOST PORT VHOST USER PASSWORD NAME [ARGS...]");
            System.exit(2);
        }
        String scenario = args[0];
        ConnectionFactory f = new ConnectionFactory();
        f.setHost(args[1]);
        f.setPort(Integer.parseInt(args[2]));
        f.setVirtualHost(args[3]);
        user = args[4];
        f.setUsername(user);
        f.setPassword(args[5]);
        f.setAutomaticRecoveryEnabled(false);
        f.setTopologyRecoveryEnabled(false);
        f.setConnectionTimeout(10_000);
        f.setHandshakeTimeout(10_000);
        String name = args[6];
        String[] rest = Arrays.copyOfRange(args, 7, args.length);
        try (Connection conn = f.newConnection("triomq-interop-java")) {
            switch (scenario) {
                case "headers": headers(conn, name); break;
                case "get": get(conn, name); break;
                case "consume": consume(conn, name, Integer.parseInt(rest[0]), Integer.parseInt(rest[1])); break;
                case "mandatory": mandatory(conn, name); break;
                case "channel-error": channelError(conn, name); break;
                case "direct-reply-to": directReplyTo(conn, name); break;
                default:
                    System.err.println("unknown scenario " + scenario);
                    System.exit(2);
            }
            emit("conn-open-at-end", conn.isOpen());
        }
        emit("done", scenario);
        System.exit(0);
    }

    static void emit(Object... fields) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < fields.length; i++) {
            if (i > 0) sb.append('\t');
            sb.append(String.valueOf(fields[i]).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n"));
        }
        out.println(sb);
    }

    /** Type-tagged rendering of a decoded field value, recursing into tables and arrays. */
    static String describe(Object v) {
        if (v == null) return "null";
        if (v instanceof LongString) return "LongString:" + v;
        if (v instanceof byte[]) return "bytes:" + hex((byte[]) v);
        if (v instanceof Date) return "Date:" + ((Date) v).getTime();
        if (v instanceof BigDecimal) return "BigDecimal:" + ((BigDecimal) v).toPlainString();
        if (v instanceof Map) {
            StringBuilder sb = new StringBuilder("Map{");
            boolean first = true;
            for (Map.Entry<?, ?> e : new TreeMap<>((Map<?, ?>) v).entrySet()) {
                if (!first) sb.append(',');
                first = false;
                sb.append(e.getKey()).append('=').append(describe(e.getValue()));
            }
            return sb.append('}').toString();
        }
        if (v instanceof List) {
            StringBuilder sb = new StringBuilder("List[");
            boolean first = true;
            for (Object o : (List<?>) v) {
                if (!first) sb.append(',');
                first = false;
                sb.append(describe(o));
            }
            return sb.append(']').toString();
        }
        return v.getClass().getSimpleName() + ":" + v;
    }

    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) sb.append(String.format("%02x", x & 0xff));
        return sb.toString();
    }

    static String text(byte[] body) {
        return new String(body, StandardCharsets.UTF_8);
    }

    static GetResponse getWait(Channel ch, String queue, boolean autoAck) throws Exception {
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (true) {
            GetResponse r = ch.basicGet(queue, autoAck);
            if (r != null) return r;
            if (System.currentTimeMillis() > deadline) throw new IllegalStateException("no message in " + queue);
            Thread.sleep(20);
        }
    }

    static void emitProps(AMQP.BasicProperties p) {
        emit("prop", "contentType", p.getContentType());
        emit("prop", "contentEncoding", p.getContentEncoding());
        emit("prop", "deliveryMode", p.getDeliveryMode());
        emit("prop", "priority", p.getPriority());
        emit("prop", "correlationId", p.getCorrelationId());
        emit("prop", "replyTo", p.getReplyTo());
        emit("prop", "expiration", p.getExpiration());
        emit("prop", "messageId", p.getMessageId());
        emit("prop", "timestamp", p.getTimestamp() == null ? null : p.getTimestamp().getTime());
        emit("prop", "type", p.getType());
        emit("prop", "userId", p.getUserId());
        emit("prop", "appId", p.getAppId());
    }

    // ------------------------------------------------------------------ scenarios

    /** confirmSelect + publish with headers of every field type, waitForConfirmsOrDie, read back. */
    static void headers(Connection conn, String queue) throws Exception {
        Channel ch = conn.createChannel();
        AMQP.Queue.DeclareOk ok = ch.queueDeclare(queue, false, false, false, null);
        emit("declare-ok", ok.getQueue(), ok.getMessageCount(), ok.getConsumerCount());
        ch.confirmSelect();

        Map<String, Object> deep = new LinkedHashMap<>();
        deep.put("k", true);
        Map<String, Object> table = new LinkedHashMap<>();
        table.put("inner", "x");
        table.put("n", 1);
        table.put("deep", deep);
        Map<String, Object> inArray = new LinkedHashMap<>();
        inArray.put("m", "v");
        List<Object> array = new ArrayList<>(Arrays.asList("a", 2, 3L, false, inArray, Arrays.asList(7, "z")));

        Map<String, Object> h = new LinkedHashMap<>();
        h.put("s-string", "hello \u00fcn\u00efcode \u2713");
        h.put("s-empty", "");
        h.put("i-int", 42);
        h.put("i-neg", -7);
        h.put("l-long", 1L << 40);
        h.put("l-neg", Long.MIN_VALUE);
        h.put("t-true", true);
        h.put("t-false", false);
        h.put("F-table", table);
        h.put("F-empty", new LinkedHashMap<String, Object>());
        h.put("A-array", array);
        h.put("A-empty", new ArrayList<Object>());
        h.put("T-time", new Date(1700000000000L));
        h.put("D-decimal", new BigDecimal("12.345"));
        h.put("b-byte", (byte) -5);
        h.put("s-short", (short) 1234);
        h.put("f-float", 2.5f);
        h.put("d-double", 3.25d);
        h.put("x-bytes", new byte[] {0, 1, 2, (byte) 255});
        h.put("V-null", null);

        AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
            .contentType("application/octet-stream")
            .contentEncoding("identity")
            .headers(h)
            .deliveryMode(2)
            .priority(5)
            .correlationId("corr-" + queue)
            .replyTo("reply-" + queue)
            .expiration("600000")
            .messageId("msg-1")
            .timestamp(new Date(1600000000000L))
            .type("typed.headers")
            .userId(user)
            .appId("triomq-interop-java")
            .build();
        emit("seqno-before", ch.getNextPublishSeqNo());
        // one copy is read back here, one is left for the Python side to check on the wire
        ch.basicPublish("", queue, props, "typed-headers".getBytes(StandardCharsets.UTF_8));
        ch.basicPublish("", queue, props, "typed-headers".getBytes(StandardCharsets.UTF_8));
        ch.waitForConfirmsOrDie(WAIT_MS);
        emit("confirmed", true, ch.getNextPublishSeqNo());

        GetResponse r = getWait(ch, queue, false);
        emit("get", text(r.getBody()), r.getMessageCount(), r.getEnvelope().isRedeliver(),
             r.getEnvelope().getExchange(), r.getEnvelope().getRoutingKey());
        emitProps(r.getProps());
        for (Map.Entry<String, Object> e : new TreeMap<>(r.getProps().getHeaders()).entrySet()) {
            emit("header", e.getKey(), describe(e.getValue()));
        }
        ch.basicAck(r.getEnvelope().getDeliveryTag(), false);
        AMQP.Queue.DeclareOk after = ch.queueDeclarePassive(queue);
        emit("left", after.getMessageCount());
        ch.close();
    }

    /** basicGet: empty queue, empty bodies, reject+requeue, autoAck, message counts. */
    static void get(Connection conn, String queue) throws Exception {
        Channel ch = conn.createChannel();
        ch.queueDeclare(queue, false, true, false, null);
        emit("get-empty", ch.basicGet(queue, true) == null);
        ch.confirmSelect();
        ch.basicPublish("", queue, null, new byte[0]);
        ch.basicPublish("", queue, new AMQP.BasicProperties.Builder().contentType("text/plain").build(), new byte[0]);
        ch.basicPublish("", queue, null, "three".getBytes(StandardCharsets.UTF_8));
        ch.waitForConfirmsOrDie(WAIT_MS);

        GetResponse r = getWait(ch, queue, false);
        emit("get", "1", r.getBody().length, text(r.getBody()), r.getMessageCount(), r.getEnvelope().isRedeliver());
        ch.basicReject(r.getEnvelope().getDeliveryTag(), true);
        r = getWait(ch, queue, false);
        emit("get", "1-again", r.getBody().length, text(r.getBody()), r.getMessageCount(), r.getEnvelope().isRedeliver());
        ch.basicAck(r.getEnvelope().getDeliveryTag(), false);
        r = getWait(ch, queue, true);
        emit("get", "2", r.getBody().length, r.getProps().getContentType(), r.getMessageCount(), r.getEnvelope().isRedeliver());
        r = getWait(ch, queue, true);
        emit("get", "3", r.getBody().length, text(r.getBody()), r.getMessageCount(), r.getEnvelope().isRedeliver());
        emit("get-empty-after", ch.basicGet(queue, true) == null);
        emit("left", ch.queueDeclarePassive(queue).getMessageCount());
        ch.close();
    }

    /** basicQos(prefetch) + basicConsume: never more than prefetch unacked, multiple and single acks. */
    static void consume(Connection conn, String queue, int n, int prefetch) throws Exception {
        Channel pub = conn.createChannel();
        pub.queueDeclare(queue, false, true, false, null);
        pub.confirmSelect();
        for (int i = 0; i < n; i++) {
            byte[] body = (i == 2) ? new byte[0] : ("c" + i).getBytes(StandardCharsets.UTF_8);
            pub.basicPublish("", queue, null, body);
        }
        pub.waitForConfirmsOrDie(WAIT_MS);

        Channel ch = conn.createChannel();
        ch.basicQos(prefetch);
        AtomicInteger delivered = new AtomicInteger();
        BlockingQueue<Object[]> inbox = new LinkedBlockingQueue<>();
        CountDownLatch cancelOk = new CountDownLatch(1);
        AtomicReference<String> consumeOkTag = new AtomicReference<>();
        CountDownLatch consumeOk = new CountDownLatch(1);
        String tag = ch.basicConsume(queue, false, new DefaultConsumer(ch) {
            @Override
            public void handleConsumeOk(String consumerTag) {
                consumeOkTag.set(consumerTag);
                consumeOk.countDown();
            }

            @Override
            public void handleCancelOk(String consumerTag) {
                cancelOk.countDown();
            }

            @Override
            public void handleDelivery(String consumerTag, Envelope env, AMQP.BasicProperties p, byte[] body) {
                delivered.incrementAndGet();
                inbox.add(new Object[] {env.getDeliveryTag(), text(body), body.length, env.isRedeliver(), consumerTag});
            }
        });
        // handleConsumeOk runs on the consumer dispatch thread, maybe after basicConsume returned
        consumeOk.await(WAIT_MS, TimeUnit.MILLISECONDS);
        emit("consumer-tag", tag.equals(consumeOkTag.get()), tag.isEmpty());

        // 1. without acks the broker stops at prefetch
        List<Object[]> firstBatch = new ArrayList<>();
        for (int i = 0; i < Math.min(prefetch, n); i++) {
            Object[] d = inbox.poll(WAIT_MS, TimeUnit.MILLISECONDS);
            if (d == null) throw new IllegalStateException("only " + i + " deliveries before any ack");
            firstBatch.add(d);
        }
        Thread.sleep(400);
        emit("stalled-at", delivered.get());
        int maxUnacked = delivered.get();
        int acked = 0;
        List<Object[]> all = new ArrayList<>(firstBatch);
        // 2. one multiple=true ack for the whole first batch
        ch.basicAck((Long) firstBatch.get(firstBatch.size() - 1)[0], true);
        acked += firstBatch.size();
        // 3. single acks for the rest, checking the in-flight count at every delivery
        while (all.size() < n) {
            Object[] d = inbox.poll(WAIT_MS, TimeUnit.MILLISECONDS);
            if (d == null) throw new IllegalStateException("only " + all.size() + " of " + n + " delivered");
            maxUnacked = Math.max(maxUnacked, delivered.get() - acked);
            all.add(d);
            Thread.sleep(5);
            maxUnacked = Math.max(maxUnacked, delivered.get() - acked);
            ch.basicAck((Long) d[0], false);
            acked++;
        }
        Thread.sleep(200);
        emit("max-unacked", maxUnacked);
        emit("delivered-total", delivered.get());
        for (Object[] d : all) {
            emit("delivery", d[0], d[1], d[2], d[3], tag.equals(d[4]));
        }
        ch.basicCancel(tag);
        emit("cancel-ok", cancelOk.await(WAIT_MS, TimeUnit.MILLISECONDS));
        AMQP.Queue.DeclareOk ok = pub.queueDeclarePassive(queue);
        emit("left", ok.getMessageCount(), ok.getConsumerCount());
        ch.close();
        pub.close();
    }

    /** mandatory publishes to unroutable keys come back as basic.return 312 NO_ROUTE before their ack. */
    static void mandatory(Connection conn, String queue) throws Exception {
        Channel ch = conn.createChannel();
        ch.queueDeclare(queue, false, true, false, null);
        List<String> events = new ArrayList<>();
        CountDownLatch returns = new CountDownLatch(2);
        ch.addReturnListener(new ReturnListener() {
            @Override
            public void handleReturn(int code, String replyText, String exchange, String routingKey,
                                     AMQP.BasicProperties p, byte[] body) {
                synchronized (events) {
                    events.add("return");
                }
                emit("return", code, replyText, exchange, routingKey, text(body), p.getCorrelationId(),
                     p.getHeaders() == null ? null : describe(p.getHeaders()));
                returns.countDown();
            }
        });
        ch.addConfirmListener(new ConfirmListener() {
            @Override
            public void handleAck(long seq, boolean multiple) {
                synchronized (events) {
                    events.add("ack:" + seq + ":" + multiple);
                }
            }

            @Override
            public void handleNack(long seq, boolean multiple) {
                synchronized (events) {
                    events.add("nack:" + seq + ":" + multiple);
                }
            }
        });
        ch.confirmSelect();
        Map<String, Object> h = new LinkedHashMap<>();
        h.put("n", 1);
        ch.basicPublish("", queue + "-nowhere", true,
            new AMQP.BasicProperties.Builder().correlationId("r1").headers(h).build(),
            "lost-1".getBytes(StandardCharsets.UTF_8));
        ch.basicPublish("amq.direct", queue + "-unbound", true, null, new byte[0]);
        ch.basicPublish("", queue, true, null, "kept".getBytes(StandardCharsets.UTF_8));
        ch.waitForConfirmsOrDie(WAIT_MS);
        emit("returns-complete", returns.await(WAIT_MS, TimeUnit.MILLISECONDS));
        Thread.sleep(200);
        synchronized (events) {
            emit("events", String.join(",", events));
        }
        GetResponse r = getWait(ch, queue, true);
        emit("routed", text(r.getBody()), r.getMessageCount());
        ch.close();
    }

    // Direct reply-to two ways: the client's RpcClient (one reply consumer for the channel's
    // life) and Spring AMQP's RabbitTemplate pattern (a passive declare of the pseudo-queue
    // at start-up, then per call: consume no-ack, publish, wait, cancel).
    static void directReplyTo(Connection conn, String queue) throws Exception {
        final String replyTo = "amq.rabbitmq.reply-to";
        Channel server = conn.createChannel();
        server.queueDeclare(queue, false, false, true, null);
        server.basicConsume(queue, true, new DefaultConsumer(server) {
            @Override
            public void handleDelivery(String tag, Envelope env, AMQP.BasicProperties props, byte[] body)
                    throws IOException {
                emit("server-reply-to", props.getReplyTo());
                AMQP.BasicProperties rp = new AMQP.BasicProperties.Builder()
                        .correlationId(props.getCorrelationId()).build();
                String answer = new String(body, StandardCharsets.UTF_8).toUpperCase();
                server.basicPublish("", props.getReplyTo(), rp, answer.getBytes(StandardCharsets.UTF_8));
            }
        });
        Channel ch = conn.createChannel();
        AMQP.Queue.DeclareOk ok = ch.queueDeclarePassive(replyTo);
        emit("declare-ok", ok.getQueue(), ok.getMessageCount(), ok.getConsumerCount());
        RpcClient client = new RpcClient(ch, "", queue, replyTo, (int) WAIT_MS);
        for (int i = 0; i < 3; i++) {
            byte[] reply = client.primitiveCall(("rpc-" + i).getBytes(StandardCharsets.UTF_8));
            emit("rpc-reply", new String(reply, StandardCharsets.UTF_8));
        }
        client.close();
        Channel spring = conn.createChannel();
        for (int i = 0; i < 2; i++) {
            BlockingQueue<String[]> replies = new LinkedBlockingQueue<>();
            String ctag = spring.basicConsume(replyTo, true, new DefaultConsumer(spring) {
                @Override
                public void handleDelivery(String tag, Envelope env, AMQP.BasicProperties props, byte[] body) {
                    replies.add(new String[] {props.getCorrelationId(), new String(body, StandardCharsets.UTF_8)});
                }
            });
            String cid = "spring-" + i;
            spring.basicPublish("", queue, new AMQP.BasicProperties.Builder().replyTo(replyTo)
                    .correlationId(cid).build(), cid.getBytes(StandardCharsets.UTF_8));
            String[] reply = replies.poll(WAIT_MS, TimeUnit.MILLISECONDS);
            emit("spring-reply", reply == null ? "timeout" : reply[0], reply == null ? "" : reply[1]);
            spring.basicCancel(ctag);
        }
        spring.close();
        ch.close();
        server.close();
    }

    static void emitClose(String label, ShutdownSignalException sse, Channel ch, Connection conn) {
        Object reason = sse.getReason();
        if (reason instanceof AMQP.Channel.Close) {
            AMQP.Channel.Close c = (AMQP.Channel.Close) reason;
            emit(label, "channel", sse.isHardError(), c.getReplyCode(), c.getReplyText(), c.getClassId(), c.getMethodId());
        } else if (reason instanceof AMQP.Connection.Close) {
            AMQP.Connection.Close c = (AMQP.Connection.Close) reason;
            emit(label, "connection", sse.isHardError(), c.getReplyCode(), c.getReplyText(), c.getClassId(), c.getMethodId());
        } else {
            emit(label, "other", sse.isHardError(), String.valueOf(reason));
        }
        emit(label + "-state", ch.isOpen(), conn.isOpen());
    }

    /** Channel errors close only their channel; the connection keeps working with new channels. */
    static void channelError(Connection conn, String queue) throws Exception {
        // 1. passive declare of a missing queue -> 404 NOT_FOUND
        Channel ch1 = conn.createChannel();
        try {
            ch1.queueDeclarePassive(queue + "-missing");
            emit("error1", "none");
        } catch (IOException e) {
            emitClose("error1", (ShutdownSignalException) e.getCause(), ch1, conn);
        }

        // 2. redeclare an exchange with another type -> 406 PRECONDITION_FAILED
        Channel ch2 = conn.createChannel();
        String ex = queue + "-ex";
        ch2.exchangeDeclare(ex, "direct", false, false, null);
        try {
            ch2.exchangeDeclare(ex, "fanout", false, false, null);
            emit("error2", "none");
        } catch (IOException e) {
            emitClose("error2", (ShutdownSignalException) e.getCause(), ch2, conn);
        }

        // 3. ack of an unknown delivery tag (asynchronous) -> 406 PRECONDITION_FAILED
        Channel ch3 = conn.createChannel();
        CountDownLatch closed = new CountDownLatch(1);
        AtomicReference<ShutdownSignalException> why = new AtomicReference<>();
        ch3.addShutdownListener(sse -> {
            why.set(sse);
            closed.countDown();
        });
        ch3.basicAck(999, false);
        if (closed.await(WAIT_MS, TimeUnit.MILLISECONDS)) {
            emitClose("error3", why.get(), ch3, conn);
        } else {
            emit("error3", "none");
        }

        // 4. a new channel on the same connection works
        Channel ch4 = conn.createChannel();
        emit("new-channel", ch4.getChannelNumber() > 0, ch4.isOpen());
        ch4.queueDeclare(queue, false, true, false, null);
        ch4.confirmSelect();
        ch4.basicPublish("", queue, null, "after-errors".getBytes(StandardCharsets.UTF_8));
        ch4.waitForConfirmsOrDie(WAIT_MS);
        GetResponse r = getWait(ch4, queue, true);
        emit("recovered", text(r.getBody()));
        ch4.exchangeDelete(ex);
        ch4.close();
    }
}
