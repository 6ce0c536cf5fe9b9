// The official SignalR client (@microsoft/signalr, JSON or MessagePack) against a hub, for
// tests/wsclients.py's signalr_node. argv[2] is JSON:
//   {url, text, protocol: "json"|"messagepack", method: "stream"|"invoke"|"chat",
//    proxy?, ca?, insecure?, cancelAfter?, skipNegotiation?, timeoutMs?}
// Prints one JSON line: {text, items, result, updates, errors, events, timed_out}.
//
// Proxy and CA: the client takes a WebSocket constructor (option `WebSocket`) and, in Node,
// calls it as new WebSocket(url, protocols, {headers}); the class below is the `ws` package's,
// adding https-proxy-agent's agent (HTTP CONNECT) and the CA. Only with skipNegotiation (the
// default here): the negotiate POST goes through the client's own fetch, which has no proxy.
import fs from "node:fs";
import * as signalR from "@microsoft/signalr";
import { MessagePackHubProtocol } from "@microsoft/signalr-protocol-msgpack";
import { HttpsProxyAgent } from "https-proxy-agent";
import WS from "ws";

const config = JSON.parse(process.argv[2]);
const seen = { text: "", items: [], result: null, updates: [], errors: [], events: [], timed_out: false };

const tls = {};
if (config.ca) tls.ca = fs.readFileSync(config.ca);
if (config.insecure) tls.rejectUnauthorized = false;
const agent = config.proxy ? new HttpsProxyAgent(config.proxy, tls) : undefined;

class ConfiguredWebSocket extends WS {
  constructor(url, protocols, options = {}) {
    super(url, protocols, { ...options, ...tls, ...(agent ? { agent } : {}) });
  }
}

const connection = new signalR.HubConnectionBuilder()
  .withUrl(config.url, {
    transport: signalR.HttpTransportType.WebSockets,
    skipNegotiation: config.skipNegotiation !== false,
    WebSocket: ConfiguredWebSocket,
    headers: { "x-mock-id": new URL(config.url).searchParams.get("mock_id") ?? "" },
  })
  .withHubProtocol(config.protocol === "messagepack" ? new MessagePackHubProtocol() : new signalR.JsonHubProtocol())
  .configureLogging(signalR.LogLevel.None)
  .build();

connection.onclose((error) => {
  seen.events.push("close");
  if (error) seen.errors.push(String(error.message ?? error));
});

function report() {
  process.stdout.write(JSON.stringify(seen) + "\n");
  process.exit(0);
}
// Past timeoutMs, what it saw so far (a proxy that swallowed the call must not hang the test).
setTimeout(() => {
  seen.timed_out = true;
  report();
}, config.timeoutMs ?? 20000).unref();

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function stream(target, argument) {
  return new Promise((resolve) => {
    const subscription = connection.stream(target, argument).subscribe({
      next: (item) => {
        seen.items.push(item);
        if (typeof item === "string") seen.text += item;
        if (config.cancelAfter && seen.items.length === config.cancelAfter) {
          seen.events.push("cancel");
          subscription.dispose(); // sends CancelInvocation
          sleep(300).then(resolve);
        }
      },
      complete: () => {
        seen.events.push("complete");
        resolve();
      },
      error: (error) => {
        seen.events.push("error");
        seen.errors.push(String(error.message ?? error));
        resolve();
      },
    });
  });
}

try {
  if (config.method === "chat") {
    connection.on("update", (update) => {
      for (const message of update.messages ?? []) {
        if (message.author === "bot") seen.text = message.text; // cumulative snapshots
      }
      seen.updates.push(update);
    });
  }
  await connection.start();
  seen.events.push("connected");
  if (config.method === "invoke") {
    seen.result = await connection.invoke("Ask", config.text);
    seen.text = seen.result;
  } else if (config.method === "chat") {
    const message = { author: "user", inputMethod: "Keyboard", text: config.text, messageType: "Chat" };
    await stream("chat", { source: "cib", isStartOfSession: true, conversationId: "c1", message });
    const last = seen.items.at(-1);
    if (last && typeof last === "object") seen.result = last.result ?? null;
  } else {
    await stream("Generate", config.text);
  }
} catch (error) {
  seen.errors.push(String(error.message ?? error));
}
await connection.stop().catch(() => {});
report();
