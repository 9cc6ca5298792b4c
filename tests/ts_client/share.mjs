// One session of memrl-mcp among several on one store, through the official TypeScript SDK over stdio
// (tests/test_local.py runs it beside Python sessions): store this session's lesson, recall it and report without a
// reward (the server asks this client's user: the handler below answers "succeeded"), then list the memories until
// the other sessions' lessons are there too. Prints one JSON object: what it found and what it was asked.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const { MCP_TEST_SERVER, MCP_TEST_TASK, MCP_TEST_EXPECT, ...env } = process.env;
const [command, ...args] = JSON.parse(MCP_TEST_SERVER);
const asked = [];

const client = new Client({ name: "memrl-ts-share", version: "1.0.0" }, { capabilities: { elicitation: {} } });
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params.message);
  return { action: "accept", content: { succeeded: true } };
});

await client.connect(new StdioClientTransport({ command, args, env, stderr: "inherit" }));
const call = async (name, args) => {
  const result = await client.callTool({ name, arguments: args });
  if (result.isError) throw new Error(`${name}: ${result.content[0].text}`);
  return result.structuredContent;
};
await call("store_experience", { task: MCP_TEST_TASK, experience: "what this session learned" });
const recall = await call("recall_experience", { task: MCP_TEST_TASK });
const report = await call("report_outcome", { recall_id: recall.recall_id, experience: "it worked" });
const expected = JSON.parse(MCP_TEST_EXPECT);
let tasks = [];
for (let tries = 0; tries < 600 && !expected.every((task) => tasks.includes(task)); tries++) {
  if (tries > 0) await new Promise((done) => setTimeout(done, 100));
  tasks = (await call("list_memories", { limit: 100 })).memories.map((memory) => memory.task);
}
console.log(JSON.stringify({ tasks, asked, report }));
await client.close();
