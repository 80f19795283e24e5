// courier's web view: building elements and formatting values. Loaded before app.js
// (both are classic scripts sharing one global scope); pure helpers, no state, no calls.
//
// app.js writes values only through h() and textContent: h() makes elements and text nodes,
// so a value from the API is always text, never markup. Targets, endpoint keys and error
// texts come from apps and receivers; no string is ever parsed as HTML (a unit test in
// src/ui/tests.rs checks both files).
"use strict";

/** An element with attributes (on* keys become listeners) and children (strings become text). */
function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A state as a coloured label; the class keeps only [a-z_] of what the API said. */
function badge(state) {
  const text = String(state ?? "unknown");
  return h("span", { class: "badge s-" + text.replace(/[^a-z_]/g, "") }, text.replace("_", " "));
}

/** An HTTP status, coloured by its class (2xx, 4xx, ...). */
function statusCode(status) {
  return h("span", { class: `code c${String(status)[0]}` }, status);
}

function count(n) {
  return Number.isFinite(n) ? Math.round(n).toLocaleString() : "–";
}

/** Seconds as "45s", "3m 20s", "2h 5m", "3d 4h". */
function duration(secs) {
  if (!Number.isFinite(secs)) return "–";
  let left = Math.max(0, Math.round(secs));
  if (left < 60) return `${left}s`;
  const parts = [];
  for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]]) {
    if (left >= size || parts.length) parts.push(`${Math.floor(left / size)}${unit}`);
    left %= size;
    if (parts.length === 2) break;
  }
  return parts.join(" ");
}

/** An RFC 3339 time as local wall-clock time (the date too when it is not today). */
function clock(iso) {
  if (!iso) return "–";
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return String(iso);
  const time = at.toLocaleTimeString([], { hour12: false });
  return at.toDateString() === new Date().toDateString() ? time : `${at.toLocaleDateString()} ${time}`;
}

/** "12:03:04 (5s ago)" / "(in 2m 10s)". */
function clockAndRelative(iso) {
  if (!iso) return "–";
  const secs = (Date.parse(iso) - Date.now()) / 1000;
  if (!Number.isFinite(secs)) return String(iso);
  const rel = secs >= 0 ? `in ${duration(secs)}` : `${duration(-secs)} ago`;
  return `${clock(iso)} (${rel})`;
}

/** Prometheus text -> {name: sum of its series, "name{labels}": one series}. */
function parseMetrics(text) {
  const m = {};
  for (const line of text.split("\n")) {
    const match = /^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})? (\S+)$/.exec(line);
    if (!match) continue;
    const value = Number(match[3]);
    m[match[1]] = (m[match[1]] || 0) + value;
    if (match[2]) m[match[1] + match[2]] = value;
  }
  return m;
}
