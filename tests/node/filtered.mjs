/**
 * What a Node client sees when a content filter stops its answer: one call, written as
 * the client's docs show it, reporting the outcome its own helpers give.
 *
 * argv[2] is JSON: {client, baseURL, headers}. baseURL is the mock upstream (reached
 * through the proxy the environment names); headers carry the mock's scenario and id.
 * Prints one JSON line: {outcome, text} as the client reports them, or {error, message}
 * when the client threw (a thrown TypeError is what the proxy must never cause).
 */

import { createAnthropic } from "@ai-sdk/anthropic";
import { createGoogleGenerativeAI } from "@ai-sdk/google";
import { createOpenAI } from "@ai-sdk/openai";
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import { generateText, streamText } from "ai";
import OpenAI from "openai";

const PROMPT = "What is the plan called?";

/** @typedef {{client: string, baseURL: string, headers: Record<string, string>}} Config */
/** @typedef {{outcome: unknown, text: string}} Seen */

/** @param {Config} c */
function openai(c) {
  return new OpenAI({ baseURL: `${c.baseURL}/v1`, apiKey: "sk-test", maxRetries: 0, defaultHeaders: c.headers });
}

/** @param {Config} c */
function anthropic(c) {
  return new Anthropic({ baseURL: c.baseURL, apiKey: "sk-ant-test", maxRetries: 0, defaultHeaders: c.headers });
}

/** @param {Config} c */
function genai(c) {
  return new GoogleGenAI({ apiKey: "test-key", httpOptions: { baseUrl: c.baseURL, headers: c.headers } });
}

/** The Vercel AI SDK's model for ``provider`` (openai: the Responses API, its default). */
/** @param {Config} c @param {string} provider */
function vercelModel(c, provider) {
  const options = { apiKey: "test-key", headers: c.headers };
  if (provider === "openai") return createOpenAI({ ...options, baseURL: `${c.baseURL}/v1` })("gpt-5");
  if (provider === "openai-chat") return createOpenAI({ ...options, baseURL: `${c.baseURL}/v1` }).chat("gpt-4o");
  if (provider === "anthropic") return createAnthropic({ ...options, baseURL: `${c.baseURL}/v1` })("claude-sonnet-4");
  return createGoogleGenerativeAI({ ...options, baseURL: `${c.baseURL}/v1beta` })("gemini-2.5-flash");
}

const messages = [{ role: "user", content: PROMPT }];

/** @type {Record<string, (c: Config) => Promise<Seen>>} */
const CLIENTS = {
  "openai-chat-stream": async (c) => {
    const done = await openai(c).chat.completions.stream({ model: "gpt-4o", messages }).finalChatCompletion();
    return { outcome: done.choices[0].finish_reason, text: done.choices[0].message.content ?? "" };
  },
  "openai-chat": async (c) => {
    const done = await openai(c).chat.completions.create({ model: "gpt-4o", messages });
    return { outcome: done.choices[0].finish_reason, text: done.choices[0].message.content ?? "" };
  },
  "openai-responses-stream": async (c) => {
    const done = await openai(c).responses.stream({ model: "gpt-5", input: PROMPT }).finalResponse();
    return { outcome: [done.status, done.incomplete_details?.reason], text: done.output_text };
  },
  "openai-responses": async (c) => {
    const done = await openai(c).responses.create({ model: "gpt-5", input: PROMPT });
    return { outcome: [done.status, done.incomplete_details?.reason], text: done.output_text };
  },
  "anthropic-stream": async (c) => {
    const stream = anthropic(c).messages.stream({ model: "claude-sonnet-4", max_tokens: 256, messages });
    const done = await stream.finalMessage();
    return { outcome: done.stop_reason, text: done.content.map((b) => (b.type === "text" ? b.text : "")).join("") };
  },
  anthropic: async (c) => {
    const done = await anthropic(c).messages.create({ model: "claude-sonnet-4", max_tokens: 256, messages });
    return { outcome: done.stop_reason, text: done.content.map((b) => (b.type === "text" ? b.text : "")).join("") };
  },
  "genai-stream": async (c) => {
    const stream = await genai(c).models.generateContentStream({ model: "gemini-2.5-flash", contents: PROMPT });
    let text = "";
    let outcome;
    for await (const chunk of stream) {
      text += chunk.text ?? "";
      outcome = chunk.candidates?.[0]?.finishReason ?? outcome;
    }
    return { outcome, text };
  },
  genai: async (c) => {
    const done = await genai(c).models.generateContent({ model: "gemini-2.5-flash", contents: PROMPT });
    return { outcome: done.candidates?.[0]?.finishReason, text: done.text ?? "" };
  },
};
for (const provider of ["openai", "openai-chat", "anthropic", "google"]) {
  CLIENTS[`vercel-${provider}-stream`] = async (c) => {
    const result = streamText({ model: vercelModel(c, provider), prompt: PROMPT, maxRetries: 0 });
    return { outcome: await result.finishReason, text: await result.text };
  };
  CLIENTS[`vercel-${provider}`] = async (c) => {
    const result = await generateText({ model: vercelModel(c, provider), prompt: PROMPT, maxRetries: 0 });
    return { outcome: result.finishReason, text: result.text };
  };
}

/** @type {Config} */
const config = JSON.parse(process.argv[2]);
let seen;
try {
  seen = await CLIENTS[config.client](config);
} catch (error) {
  seen = { error: error?.constructor?.name ?? typeof error, message: String(error?.message ?? error) };
}
console.log(JSON.stringify(seen));
