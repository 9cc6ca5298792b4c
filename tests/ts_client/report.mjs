// One flow of memrl-mcp through the official TypeScript SDK over stdio (tests/test_typescript_client.py runs it):
// store a lesson, recall it, then report without a reward and with the trajectory instead of an experience. The
// server asks this client's user (elicitation: the handler below accepts, "succeeded") and its model (sampling: the
// handler below writes the experience). Prints one JSON object: what the server asked and answered.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CreateMessageRequestSchema, ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const { MCP_TEST_SERVER, ...env } = process.env;
const [command, ...args] = JSON.parse(MCP_TEST_SERVER);
const task = "Rotate the logs of the web server every night";
const asked = { user: [], model: [] };

const client = new Client({ name: "memrl-ts-test", version: "1.0.0" }, { capabilities: { elicitation: {}, sampling: {} } });
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.user.push(request.params);
  return { action: "accept", content: { succeeded: true, note: "checked from TypeScript" } };
});
client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
  asked.model.push({ systemPrompt: request.params.systemPrompt, text: request.params.messages[0].content.text });
  return { role: "assistant", model: "ts-model", content: { type: "text", text: "1. Write the rule. 2. Rotate." } };
});

await client.connect(new StdioClientTransport({ command, args, env, stderr: "inherit" }));
const call = async (name, args) => {
  const result = await client.callTool({ name, arguments: args });
  if (result.isError) throw new Error(`${name}: ${result.content[0].text}`);
  return result.structuredContent;
};
const stored = await call("store_experience", { task, experience: "logrotate: daily, rotate 7, compress" });
const recall = await call("recall_experience", { task });
const report = await call("report_outcome", { recall_id: recall.recall_id, trajectory: "$ logrotate -f\nok" });
const tools = (await client.listTools()).tools.map((tool) => tool.name);
console.log(JSON.stringify({ tools, stored, recall, report, asked }));
await client.close();
