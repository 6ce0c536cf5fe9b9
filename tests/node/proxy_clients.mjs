/**
 * One call of one Node client, written as its docs show it, with nothing about proxies:
 * how it reaches the API (the proxy or directly) is up to the environment the test
 * gives it (HTTPS_PROXY, NODE_OPTIONS=--import=the preload, NODE_USE_ENV_PROXY).
 *
 * argv[2] is JSON: {client, baseURL, mockId}. baseURL is the mock upstream (there is no
 * internet here); mockId goes in the x-mock-id header that finds the audit row.
 * Prints one JSON line: {text} (the answer text as the client's own helper returns it).
 */

import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import { createOpenAI } from "@ai-sdk/openai";
import { streamText } from "ai";
import https from "node:https";
import OpenAI from "openai";

const PROMPT = "What is the weather in Vienna?";

/** @typedef {{client: string, baseURL: string, mockId: string}} Config */

/** @param {Config} c @returns {OpenAI} */
function openai(c) {
  return new OpenAI({ baseURL: `${c.baseURL}/v1`, apiKey: "sk-test", defaultHeaders: { "x-mock-id": c.mockId } });
}

/** @param {Config} c @returns {Promise<string>} */
async function openaiChat(c) {
  const messages = [{ role: "user", content: PROMPT }];
  const stream = openai(c).chat.completions.stream({ model: "gpt-4o-mini", messages });
  return (await stream.finalChatCompletion()).choices[0].message.content ?? "";
}

/** @param {Config} c @returns {Promise<string>} */
async function openaiResponses(c) {
  return (await openai(c).responses.stream({ model: "gpt-4o-mini", input: PROMPT }).finalResponse()).output_text;
}

/** @param {Config} c @returns {Promise<string>} */
async function anthropic(c) {
  const client = new Anthropic({ baseURL: c.baseURL, apiKey: "sk-ant-test", defaultHeaders: { "x-mock-id": c.mockId } });
  const messages = [{ role: "user", content: PROMPT }];
  const stream = client.messages.stream({ model: "claude-sonnet-4-5", max_tokens: 256, messages });
  return stream.finalText();
}

/** @param {Config} c @returns {Promise<string>} */
async function genai(c) {
  const httpOptions = { baseUrl: c.baseURL, headers: { "x-mock-id": c.mockId } };
  const client = new GoogleGenAI({ apiKey: "test-key", httpOptions });
  const stream = await client.models.generateContentStream({ model: "gemini-2.5-flash", contents: PROMPT });
  let text = "";
  for await (const chunk of stream) {
    text += chunk.text ?? "";
  }
  return text;
}

/**
 * The Vercel AI SDK's streamText with its OpenAI provider (the Responses API by default).
 * @param {Config} c @returns {Promise<string>}
 */
async function vercelOpenai(c) {
  const provider = createOpenAI({ baseURL: `${c.baseURL}/v1`, apiKey: "sk-test", headers: { "x-mock-id": c.mockId } });
  const result = streamText({ model: provider("gpt-4o-mini"), prompt: PROMPT });
  return await result.text;
}

/**
 * Node's own https.request, which got and node-fetch 2 are built on: not fetch(), so
 * not the preload's business (a Chat Completions call, not streamed).
 * @param {Config} c @returns {Promise<string>}
 */
function nodeHttps(c) {
  const body = JSON.stringify({ model: "gpt-4o-mini", messages: [{ role: "user", content: PROMPT }] });
  const headers = { "content-type": "application/json", authorization: "Bearer sk-test", "x-mock-id": c.mockId };
  return new Promise((resolve, reject) => {
    const request = https.request(`${c.baseURL}/v1/chat/completions`, { method: "POST", headers }, (response) => {
      let data = "";
      response.setEncoding("utf8");
      response.on("data", (piece) => (data += piece));
      response.on("end", () => resolve(JSON.parse(data).choices[0].message.content));
    });
    request.on("error", reject);
    request.end(body);
  });
}

/** @type {Record<string, (c: Config) => Promise<string>>} */
const CLIENTS = {
  "openai-chat": openaiChat,
  "openai-responses": openaiResponses,
  anthropic,
  genai,
  "vercel-openai": vercelOpenai,
  "node-https": nodeHttps,
};

/** @type {Config} */
const config = JSON.parse(process.argv[2]);
console.log(JSON.stringify({ text: await CLIENTS[config.client](config) }));
