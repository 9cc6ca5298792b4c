// What the official TypeScript SDK client shows when its static bearer token is missing, wrong or right
// (tests/test_auth_challenge.py runs it): a streamable-HTTP client with the token in its request headers, as a client
// configured with one sends it. Prints one JSON object: per case, the tools listed or the error the SDK raised.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const { MCP_TEST_URL, MCP_TEST_TOKEN } = process.env;
const cases = { missing: null, wrong: "not-one-of-the-tokens-0123", right: MCP_TEST_TOKEN };
const shown = {};
for (const [name, token] of Object.entries(cases)) {
  const headers = token === null ? {} : { Authorization: `Bearer ${token}` };
  const client = new Client({ name: "memrl-ts-token-test", version: "1.0.0" });
  try {
    await client.connect(new StreamableHTTPClientTransport(new URL(MCP_TEST_URL), { requestInit: { headers } }));
    shown[name] = { tools: (await client.listTools()).tools.map((tool) => tool.name) };
    await client.close();
  } catch (error) {
    shown[name] = { error: `${error.name}: ${error.message}`, code: error.code ?? null };
  }
}
console.log(JSON.stringify(shown));
