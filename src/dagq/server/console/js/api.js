// Requests to the /v1 API: the bearer token on every one, RFC 9457 problems as errors.
import { askToken, token } from "./token.js";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

async function problemOf(response) {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    return { title: response.statusText, detail: text.slice(0, 300) || `HTTP ${response.status}` };
  }
}

/**
 * Sends a request; a string body goes as YAML (or `type`), an object as JSON. On a 401
 * the user is asked for a token once, and the request is sent again with it.
 */
export async function call(method, path, { body, type, headers = {}, signal } = {}) {
  for (let asked = false; ; asked = true) {
    const sent = new Headers(headers);
    const bearer = token();
    if (bearer) sent.set("Authorization", `Bearer ${bearer}`);
    let payload;
    if (body !== undefined) {
      const raw = typeof body === "string";
      payload = raw ? body : JSON.stringify(body);
      sent.set("Content-Type", raw ? (type ?? "application/yaml") : "application/json");
    }
    const response = await fetch(path, { method, headers: sent, body: payload, signal });
    if (response.status === 401 && !asked) {
      const problem = await problemOf(response);
      if (await askToken(problem.detail ?? "401")) continue;
      throw new ApiError(401, problem);
    }
    if (!response.ok) throw new ApiError(response.status, await problemOf(response));
    return response;
  }
}

export async function get(path, options) {
  return (await call("GET", path, options)).json();
}

export async function post(path, body, options) {
  const response = await call("POST", path, { ...options, body });
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

/** A query string from an object, leaving out empty values; arrays repeat the key. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    for (const v of Array.isArray(value) ? value : [value]) {
      if (v != null && v !== "") q.append(key, v);
    }
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}

export const enc = encodeURIComponent;

/** The path of a task of a run (task names may hold '/', kept as is). */
export function taskPath(id, name) {
  return `/v1/workflows/${enc(id)}/tasks/${name.split("/").map(enc).join("/")}`;
}
