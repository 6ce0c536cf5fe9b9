// Transparent capture (tests/e2e/test_transparent_proxy.py): the official Node SDKs with
// their default base URLs and no proxy settings, as a tool on the workstation runs them.
// The test routes the providers' hosts to the mock upstream and redirects this process's
// connections to the proxy; NODE_EXTRA_CA_CERTS is the only trust it is given.
//
// argv[2] is JSON: {"ids": {"openai": ..., "anthropic": ..., "gemini": ...}} (x-mock-id of
// each request). Prints one JSON line: the text and model each SDK returned.
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import OpenAI from "openai";

const { ids } = JSON.parse(process.argv[2]);
const PROMPT = "Weather in Vienna?";

async function openaiChat() {
  const client = new OpenAI({ apiKey: "sk-test", maxRetries: 0, defaultHeaders: { "x-mock-id": ids.openai } });
  const stream = await client.chat.completions.create({
    model: "gpt-4o", stream: true, messages: [{ role: "user", content: PROMPT }],
  });
  let text = "", model = null;
  for await (const chunk of stream) {
    model ??= chunk.model;
    text += chunk.choices[0]?.delta?.content ?? "";
  }
  return { text, model };
}

async function anthropicMessages() {
  const client = new Anthropic({ apiKey: "sk-ant-test", maxRetries: 0, defaultHeaders: { "x-mock-id": ids.anthropic } });
  const stream = client.messages.stream({
    model: "claude-sonnet-4-5", max_tokens: 256, messages: [{ role: "user", content: PROMPT }],
  });
  const message = await stream.finalMessage();
  return { text: message.content.filter((b) => b.type === "text").map((b) => b.text).join(""), model: message.model };
}

async function geminiStream() {
  const client = new GoogleGenAI({ apiKey: "gemini-test", httpOptions: { headers: { "x-mock-id": ids.gemini } } });
  const stream = await client.models.generateContentStream({ model: "gemini-2.5-flash", contents: PROMPT });
  let text = "", model = null;
  for await (const chunk of stream) {
    model ??= chunk.modelVersion ?? null;
    text += chunk.text ?? "";
  }
  return { text, model };
}

const result = { openai: await openaiChat(), anthropic: await anthropicMessages(), gemini: await geminiStream() };
console.log(JSON.stringify(result));
