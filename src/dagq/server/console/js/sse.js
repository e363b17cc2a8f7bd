// Server-sent events read with fetch() and a ReadableStream, not EventSource: the bearer
// token goes in a header (never in a URL). The stream is followed across drops and a
// server's `shutdown`: it reconnects with Last-Event-ID and so misses no event.
import { call } from "./api.js";
import { pause } from "./dom.js";

/**
 * Calls onEvent({event, data, id}) for each event of `path` until an `end` event or
 * until `signal` aborts; onState("live" | "reconnecting" | "ended" | "failed", error).
 */
export function follow(path, onEvent, { signal, lastEventId = null, onState = () => {} } = {}) {
  let last = lastEventId;
  let retryMs = 1000;
  let ended = false;
  (async () => {
    while (!signal?.aborted && !ended) {
      try {
        const headers = { Accept: "text/event-stream", "Cache-Control": "no-cache" };
        if (last) headers["Last-Event-ID"] = last;
        const response = await call("GET", path, { headers, signal });
        onState("live");
        for await (const event of parse(response.body, signal)) {
          if (event.id) last = event.id;
          if (event.retry) retryMs = event.retry;
          if (event.event === "end") ended = true;
          if (event.event !== "shutdown") onEvent(event);
        }
      } catch (error) {
        if (signal?.aborted) return;
        if (error.status && error.status < 500) {
          onState("failed", error);
          return;
        }
      }
      if (ended || signal?.aborted) break;
      onState("reconnecting");
      await pause(retryMs, signal);
    }
    if (ended) onState("ended");
  })();
}

async function* parse(body, signal) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const stop = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", stop, { once: true });
  let buffer = "";
  let event = { event: "message", data: null, id: null, retry: null };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      // A chunk ending in "\r" may be half of "\r\n": keep it for the next chunk.
      const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
      const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
      buffer = lines.pop() + buffer.slice(cut);
      for (const line of lines) {
        if (line === "") {
          if (event.data !== null) yield event;
          event = { event: "message", data: null, id: null, retry: null };
          continue;
        }
        if (line.startsWith(":")) continue; // a keep-alive comment
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") event.data = event.data === null ? value : `${event.data}\n${value}`;
        else if (field === "event") event.event = value;
        else if (field === "id") event.id = value;
        else if (field === "retry" && /^\d+$/.test(value)) event.retry = Number(value);
      }
    }
  } finally {
    signal?.removeEventListener("abort", stop);
  }
}
