/**
 * One call of @connectrpc/connect-node (Cursor's own stack: connect-es with @bufbuild/protobuf
 * v2) against the mock's Connect server, over HTTP/2 with TLS, gzip both ways.
 *
 * argv[2] is JSON: {call, baseUrl, genDir, mockId, scenario, close, currentFile}. genDir holds the code
 * protoc-gen-es generated from tests/fixtures/proto at test time (never committed). With
 * HTTPS_PROXY set, the HTTP/2 session goes through an HTTP CONNECT tunnel to that proxy
 * (connect-node takes the socket through nodeOptions.createConnection; Node's http2 has no
 * proxy support of its own), TLS verified with the CAs in NODE_EXTRA_CA_CERTS.
 * Prints one JSON line: what the client saw (text, thinking, tool calls, usage, turns, error).
 */

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { compressionGzip, createConnectTransport } from "@connectrpc/connect-node";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import tls from "node:tls";
import { pathToFileURL } from "node:url";

const PROMPT = "What is the weather in Vienna?";
const FOLLOW_UP = "And in Graz tomorrow?";

/** @typedef {{call: string, baseUrl: string, genDir: string, mockId: string, scenario?: string, close?: string, currentFile?: string}} Config */

/** @param {Config} c @param {string} file */
async function gen(c, file) {
  return import(pathToFileURL(path.join(c.genDir, file)).href);
}

/**
 * A TLS socket to `target` through the HTTP proxy's CONNECT tunnel, negotiating h2.
 * @param {string} proxy @param {URL} target @returns {Promise<tls.TLSSocket>}
 */
function tunnel(proxy, target) {
  const proxyUrl = new URL(proxy);
  const authority = `${target.hostname}:${target.port || 443}`;
  return new Promise((resolve, reject) => {
    const request = http.request({ host: proxyUrl.hostname, port: proxyUrl.port, method: "CONNECT", path: authority });
    request.on("connect", (response, socket) => {
      if (response.statusCode !== 200) {
        reject(new Error(`proxy CONNECT answered ${response.statusCode}`));
        return;
      }
      const host = target.hostname.replace(/^\[|\]$/g, "");
      const servername = net.isIP(host) ? undefined : host;
      resolve(tls.connect({ socket, host, servername, ALPNProtocols: ["h2"] }));
    });
    request.on("error", reject);
    request.end();
  });
}

/** @param {Config} c */
async function transport(c) {
  const proxy = process.env.HTTPS_PROXY;
  /** @type {import("node:http2").SecureClientSessionOptions} */
  const nodeOptions = {};
  if (proxy) {
    let socket = await tunnel(proxy, new URL(c.baseUrl));
    nodeOptions.createConnection = () => {
      if (socket === null) throw new Error("one tunnel per call: a second HTTP/2 session was asked for");
      const s = socket;
      socket = null;
      return s;
    };
  }
  return createConnectTransport({
    baseUrl: c.baseUrl,
    httpVersion: "2",
    nodeOptions,
    sendCompression: compressionGzip,
    acceptCompression: [compressionGzip],
  });
}

/** @param {Config} c @param {string} [suffix] */
function headers(c, suffix = "") {
  return { "x-mock-id": c.mockId + suffix, "x-mock": c.scenario ?? "", authorization: "Bearer test-cursor-token" };
}

/** A request stream the caller feeds: push() a message, end() to close the request side. */
function requestStream() {
  const items = [];
  let wake = null;
  let ended = false;
  const notify = () => {
    if (wake) {
      wake();
      wake = null;
    }
  };
  return {
    push(item) {
      items.push(item);
      notify();
    },
    end() {
      ended = true;
      notify();
    },
    async *[Symbol.asyncIterator]() {
      for (;;) {
        if (items.length) yield items.shift();
        else if (ended) return;
        else await new Promise((resolve) => (wake = resolve));
      }
    },
  };
}

/** @param {Config} c */
async function streamChat(c) {
  const { AiService, ConversationMessage_MessageType } = await gen(c, "aiserver/v1/chat_pb.js");
  const client = createClient(AiService, await transport(c));
  const request = {
    conversation: [{ text: PROMPT, type: ConversationMessage_MessageType.HUMAN }],
    modelDetails: { modelName: "gpt-4o-mini" },
    conversationId: "conv-stream-chat",
    currentFile: c.currentFile === undefined ? undefined : { relativeWorkspacePath: "src/app.py", contents: c.currentFile },
  };
  let text = "";
  let filledPrompt = "";
  for await (const response of client.streamChat(request, { headers: headers(c) })) {
    text += response.text;
    filledPrompt += response.filledPrompt;
  }
  return { text, filledPrompt };
}

/** @param {Config} c */
async function windsurf(c) {
  const { ApiServerService } = await gen(c, "exa/api_server_pb/api_server_pb.js");
  const client = createClient(ApiServerService, await transport(c));
  const request = {
    metadata: { ideName: "windsurf", extensionVersion: "1.2.3", apiKey: "sk-ws-01-test-key" },
    messages: [{ role: 1, text: PROMPT }],
    modelName: "MODEL_SWE_1_5",
  };
  let text = "";
  let reasoning = "";
  let finish = 0;
  let usage = null;
  for await (const response of client.getChatMessage(request, { headers: headers(c) })) {
    text += response.text;
    reasoning += response.reasoning;
    finish = response.finish || finish;
    if (response.usage) {
      const u = response.usage;
      usage = {
        prompt: Number(u.promptTokens),
        completion: Number(u.completionTokens),
        cacheWrite: Number(u.cacheWriteTokens),
        cacheRead: Number(u.cacheReadTokens),
        model: u.model,
      };
    }
  }
  return { text, reasoning, finish, usage };
}

/** Bidi: the chat, then the tool result on the same request stream once the tool call came. @param {Config} c */
async function unified(c) {
  const { ChatService, ConversationMessage_MessageType } = await gen(c, "aiserver/v1/chat_pb.js");
  const client = createClient(ChatService, await transport(c));
  const requests = requestStream();
  requests.push({
    request: {
      case: "streamUnifiedChatRequest",
      value: {
        conversation: [{ text: PROMPT, type: ConversationMessage_MessageType.HUMAN }],
        modelDetails: { modelName: "claude-4-sonnet-thinking" },
        conversationId: "conv-unified",
      },
    },
  });
  let text = "";
  let thinking = "";
  let signature = "";
  const toolCalls = [];
  for await (const response of client.streamUnifiedChatWithTools(requests, { headers: headers(c) })) {
    if (response.response.case === "clientSideToolV2Call") {
      const call = response.response.value;
      toolCalls.push({ id: call.toolCallId, name: call.name, arguments: call.rawArgs });
      requests.push({
        request: { case: "clientSideToolV2Result", value: { toolCallId: call.toolCallId, result: "sunny, 21 °C" } },
      });
      requests.end();
    } else if (response.response.case === "streamUnifiedChatResponse") {
      const chat = response.response.value;
      text += chat.text;
      thinking += chat.thinking?.text ?? "";
      signature += chat.thinking?.signature ?? "";
    }
  }
  requests.end();
  return { text, thinking, signature, toolCalls };
}

/**
 * Bidi, Cursor's Agent API: two turns on one stream that the server never ends; the client
 * sends a heartbeat after each turn_ended; after the second it closes: its request side
 * (close "half": the server then ends the stream) or the whole stream (close "abort":
 * RST_STREAM, no END_STREAM ever).
 * @param {Config} c
 */
async function agent(c) {
  const { AgentService } = await gen(c, "agent/v1/agent_pb.js");
  const client = createClient(AgentService, await transport(c));
  const requests = requestStream();
  const userMessage = (text) => ({ userMessageAction: { userMessage: { text } } });
  requests.push({
    message: {
      case: "runRequest",
      value: { action: userMessage(PROMPT), modelDetails: { modelName: "gpt-5" }, conversationId: "conv-agent" },
    },
  });
  const abort = new AbortController();
  const turns = [];
  let turn = { text: "", thinking: "", heartbeats: 0, usage: null };
  try {
    const responses = client.run(requests, { headers: headers(c), signal: abort.signal });
    for await (const response of responses) {
      if (response.message.case !== "interactionUpdate") continue;
      const update = response.message.value.message;
      if (update.case === "textDelta") turn.text += update.value.text;
      else if (update.case === "thinkingDelta") turn.thinking += update.value.text;
      else if (update.case === "heartbeat") turn.heartbeats += 1;
      else if (update.case === "turnEnded") {
        const u = update.value;
        turn.usage = { input: Number(u.inputTokens), output: Number(u.outputTokens) };
        turns.push(turn);
        turn = { text: "", thinking: "", heartbeats: 0, usage: null };
        requests.push({ message: { case: "execClientControlMessage", value: { heartbeat: {} } } }); // keep-alive
        if (turns.length === 1) requests.push({ message: { case: "conversationAction", value: userMessage(FOLLOW_UP) } });
        else if (c.close === "abort") abort.abort();
        else requests.end();
      }
    }
  } catch (e) {
    if (c.close === "abort" && turns.length === 2 && ConnectError.from(e).code === Code.Canceled) {
      return { turns, closed: "aborted" };
    }
    return { turns, error: describe(e) }; // (a content filter's block: the turns before it, then the error)
  }
  return { turns, closed: "ended" };
}

/** The echo service (no dialect knows it): unary and server stream (x-mock-id MOCKID-say, -talk). @param {Config} c */
async function echo(c) {
  const { EchoService } = await gen(c, "echo/v1/echo_pb.js");
  const client = createClient(EchoService, await transport(c));
  const say = (await client.say({ sentence: "hello there" }, { headers: headers(c, "-say") })).sentence;
  const talk = [];
  for await (const response of client.talk({ sentence: "one two three" }, { headers: headers(c, "-talk") })) {
    talk.push(response.sentence);
  }
  return { say, talk };
}

/** The echo service's bidi Chat, full duplex: the second message waits for the first echo. @param {Config} c */
async function echoChat(c) {
  const { EchoService } = await gen(c, "echo/v1/echo_pb.js");
  const client = createClient(EchoService, await transport(c));
  const requests = requestStream();
  const chat = [];
  requests.push({ sentence: "first" });
  for await (const response of client.chat(requests, { headers: headers(c) })) {
    chat.push(response.sentence);
    if (chat.length === 1) requests.push({ sentence: "second" });
    else requests.end();
  }
  return { chat };
}

const CALLS = { "stream-chat": streamChat, windsurf, unified, agent, echo, "echo-chat": echoChat };

/** A failed call as the client reports it: its Connect code, message and detail types. */
function describe(e) {
  const error = ConnectError.from(e);
  const details = error.details.map((d) => ("desc" in d ? d.desc.typeName : d.type));
  return { code: Code[error.code], message: error.rawMessage, details };
}

const config = /** @type {Config} */ (JSON.parse(process.argv[2]));
try {
  console.log(JSON.stringify(await CALLS[config.call](config)));
} catch (e) {
  console.log(JSON.stringify({ error: describe(e) }));
}
