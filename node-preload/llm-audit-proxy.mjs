/**
 * llm-audit's Node preload: sends the built-in fetch() through HTTPS_PROXY / HTTP_PROXY.
 *
 * Node's fetch() ignores the proxy variables unless Node itself honours
 * NODE_USE_ENV_PROXY=1 (22.21+, 24+) and it is set; on Node 20 a tool that uses
 * fetch (the openai, @anthropic-ai/sdk, @google/genai and Vercel AI SDKs do) would
 * reach the API directly and never be audited. Loaded first with
 * NODE_OPTIONS=--import=/path/to/llm-audit-proxy.mjs, this installs undici's
 * EnvHttpProxyAgent as the global dispatcher: Node's bundled undici looks its global
 * dispatcher up under a shared global symbol, so the copy installed beside this file
 * governs the built-in fetch() too. EnvHttpProxyAgent reads https_proxy / HTTPS_PROXY,
 * http_proxy / HTTP_PROXY and no_proxy / NO_PROXY (lower case first), as curl does.
 *
 * It never stops the tool it is loaded into: every Node process on the workstation
 * loads it, so when it cannot do its work it says so in one line on stderr and lets
 * the tool run (its fetch() then goes direct, as without the preload).
 * node:http / node:https (got, node-fetch 2, https.request) are not its business: on
 * Node 22.21+ and 24.5+ NODE_USE_ENV_PROXY=1 covers them; see docs/node-clients.md.
 */

import { fileURLToPath } from "node:url";

const PROXY_VARIABLES = ["https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"];
// The symbol under which every undici (Node's bundled one, and npm's since 5.x) keeps
// the global dispatcher that fetch() uses.
const GLOBAL_DISPATCHER = Symbol.for("undici.globalDispatcher.1");

/** @returns {boolean} whether a proxy variable is set (if not, undici is not even loaded) */
function proxyConfigured() {
  return PROXY_VARIABLES.some((name) => Boolean(process.env[name]));
}

/**
 * A dispatcher that is already there was chosen before us: by Node itself when it
 * honours NODE_USE_ENV_PROXY=1 / --use-env-proxy (its own EnvHttpProxyAgent; from 22.21
 * and 24.5 the same switch also proxies node:http), or by an earlier preload. It is
 * left alone.
 * @returns {boolean}
 */
function dispatcherChosen() {
  return globalThis[GLOBAL_DISPATCHER] !== undefined;
}

/**
 * One line on stderr: the tool must not be stopped, nor its bypass go unsaid.
 * @param {string} why @param {unknown} error
 */
function warn(why, error) {
  const text = (error instanceof Error ? `${error.name}: ${error.message}` : String(error)).split("\n", 1)[0];
  process.stderr.write(`llm-audit node preload: fetch() is NOT sent through the proxy: ${why} (${text})\n`);
}

async function install() {
  if (!proxyConfigured() || dispatcherChosen()) return;
  let undici;
  try {
    undici = await import("undici");
  } catch (error) {
    const here = fileURLToPath(import.meta.url);
    warn(`undici could not be loaded from beside ${here} (scripts/node-preload installs it)`, error);
    return;
  }
  try {
    undici.setGlobalDispatcher(new undici.EnvHttpProxyAgent());
  } catch (error) {
    warn("the proxy variables were refused", error);
  }
}

await install();
