// The peer a user would hand-roll on the SDK recipe: one socket per token, JSON.parse per
// frame, a Map of chat id -> status. Usage: node consumer.mjs URL EXPECTED TOKEN [TOKEN ...]
// Prints "ready" once every socket is open and "done N" when EXPECTED frames were applied,
// then waits to be ended (SIGTERM) so that its CPU time can be read.
import WebSocket from "ws";

const [url, expectedText, ...tokens] = process.argv.slice(2);
const expected = Number(expectedText);
const status = new Map();
let count = 0;
let open = 0;
for (const token of tokens) {
  // No permessage-deflate: the aiohttp consumers do not offer it either (and coderd's
  // websocket accept does not compress by default), so all three read the same bytes.
  const ws = new WebSocket(url.replace(/^http/, "ws") + "/api/v2/chats/watch", {
    headers: { "Coder-Session-Token": token },
    perMessageDeflate: false,
  });
  ws.on("open", () => {
    open += 1;
    if (open === tokens.length) console.log("ready");
  });
  ws.on("message", (data) => {
    const event = JSON.parse(data);
    if (event.chat) status.set(event.chat.id, event.chat.status);
    count += 1;
    if (count === expected) {
      console.log("done", count, status.size);
      // Stay alive until the harness has read our CPU time and ends us.
      setInterval(() => {}, 1000);
    }
  });
  ws.on("error", (err) => {
    console.error(err.message);
    process.exit(1);
  });
}
