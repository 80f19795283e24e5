// courier's web view (GET /ui): reads the admin API and shows it. Plain JavaScript, no
// framework, no build step; served from the binary by src/ui/mod.rs, after dom.js.
//
// Rules this file keeps:
// - Every value from the API is written as text, through h() (dom.js): elements and text
//   nodes, never markup.
// - When courier has an admin_token (the shell says so in <body data-auth>), the page asks
//   for it once, keeps it in sessionStorage (this tab only) and sends it as
//   "Authorization: Bearer" on each call. No cookies. A 401 forgets it and asks again.
// - One refresh every 2 s while the tab is visible, none while it is hidden; a table whose
//   rows did not change is left alone, so a button under the pointer stays where it is.
"use strict";

const TOKEN_KEY = "courier.admin_token";
const REFRESH_MS = 2000;
const AFTER_ACTION_MS = 300;
const RATE_SAMPLES = 16; // /metrics samples kept for the rates: about 30 s
const PAGE = 50; // deliveries shown; "Show more" adds a page, up to the API's 1000
const MAX_PAGE = 1000;
const ENDPOINT_PAGE = 100;
const NOTICE_MS = 5000;

const $ = (id) => document.getElementById(id);

const view = {
  state: "dead", // the deliveries tab: a state, or "" for all
  limit: PAGE,
  prefix: "", // endpoint key filter
  selected: null, // the delivery in the detail panel
  samples: [], // {at, m}: parsed /metrics, oldest first
  shown: new Map(), // table -> JSON of the rows it shows
  timer: 0,
  generation: 0, // a refresh started later wins over an earlier one still running
  noticeUntil: 0, // an action's message stays this long before "updated …" replaces it
};

/** Replaces a table body's rows, unless they would be the same as shown. */
function fillRows(tbodyId, items, row) {
  const json = JSON.stringify(items);
  if (view.shown.get(tbodyId) === json) return;
  view.shown.set(tbodyId, json);
  $(tbodyId).replaceChildren(...items.map(row));
}

// ---------------------------------------------------------------------------------------
// The admin API.

class Unauthorized extends Error {}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Calls the admin API; JSON answers parsed, text answers as text, errors thrown. */
async function api(method, path) {
  const headers = { Accept: "application/json" };
  const bearer = token();
  if (bearer) headers.Authorization = "Bearer " + bearer;
  const res = await fetch(path, { method, headers, cache: "no-store", credentials: "omit", redirect: "error" });
  if (res.status === 401) throw new Unauthorized("courier refused the token");
  const text = await res.text();
  const json = (res.headers.get("content-type") || "").startsWith("application/json");
  if (!res.ok) {
    let message = `HTTP ${res.status}`;
    if (json) {
      const e = JSON.parse(text);
      message = `${e.error}: ${e.message}`;
    }
    throw new ApiError(res.status, message);
  }
  return json ? JSON.parse(text) : text;
}

const enc = encodeURIComponent;

// ---------------------------------------------------------------------------------------
// Token: asked for once per tab.

function locked() {
  return document.body.classList.contains("locked");
}

/** Hides and forgets every value shown, and asks for the token. */
function lock(message) {
  clearTimeout(view.timer);
  view.generation++;
  document.body.classList.add("locked");
  for (const id of ["cards", "delivery-rows", "endpoint-rows"]) $(id).replaceChildren();
  $("detail").replaceChildren(h("p", { class: "muted" }, "Pick a delivery to see its attempts."));
  view.shown.clear();
  view.samples = [];
  $("login").hidden = false;
  $("login-error").textContent = message;
  $("forget").hidden = true;
  status("admin token needed");
  $("token").focus();
}

function unlock() {
  document.body.classList.remove("locked");
  $("login").hidden = true;
  $("forget").hidden = !token();
}

/** A 401: the token is wrong, or courier has one now and the page had none. */
function refused() {
  const had = token() !== null;
  sessionStorage.removeItem(TOKEN_KEY);
  lock(had ? "courier refused that token (401)." : "");
}

// ---------------------------------------------------------------------------------------
// Refreshing.

function status(text, kind) {
  const s = $("status");
  s.textContent = text;
  s.className = "status" + (kind ? " " + kind : "");
}

function schedule(ms) {
  clearTimeout(view.timer);
  if (!document.hidden && !locked()) view.timer = setTimeout(refresh, ms);
}

/** Reads everything shown (one round of calls, in parallel) and draws it. */
async function refresh() {
  clearTimeout(view.timer);
  const generation = ++view.generation;
  const deliveries = new URLSearchParams({ limit: String(view.limit) });
  if (view.state) deliveries.set("state", view.state);
  const endpoints = new URLSearchParams({ limit: String(ENDPOINT_PAGE) });
  if (view.prefix) endpoints.set("prefix", view.prefix);
  // A delivery that is gone (deleted, or past retention) is shown as such, not as a failure.
  const detail = view.selected
    ? api("GET", `/deliveries/${enc(view.selected)}`).catch((e) => (e instanceof ApiError ? e : Promise.reject(e)))
    : null;
  try {
    const results = await Promise.all([
      api("GET", "/metrics"),
      api("GET", `/deliveries?${deliveries}`),
      api("GET", `/endpoints?${endpoints}`),
      detail,
    ]);
    if (generation !== view.generation) return;
    unlock();
    drawQueue(parseMetrics(results[0]));
    drawDeliveries(results[1]);
    drawEndpoints(results[2]);
    drawDetail(results[3]);
    if (Date.now() >= view.noticeUntil) status(`updated ${clock(new Date().toISOString())}`);
  } catch (e) {
    if (generation !== view.generation) return;
    if (e instanceof Unauthorized) return refused();
    status(e instanceof ApiError ? `admin API: ${e.message}` : `cannot reach courier (${e.message})`, "error");
  }
  schedule(REFRESH_MS);
}

/** Runs one change (a button's), says how it went, and refreshes soon after. */
async function act(button, work, done) {
  button.disabled = true;
  try {
    status(done(await work()), "ok");
  } catch (e) {
    if (e instanceof Unauthorized) return refused();
    status(e.message, "error");
  } finally {
    button.disabled = false;
  }
  view.noticeUntil = Date.now() + NOTICE_MS;
  schedule(AFTER_ACTION_MS);
}

// ---------------------------------------------------------------------------------------
// The panels.

// [label, metric, format, note]: the queue now.
const GAUGES = [
  ["Pending", "courier_pending", count, "waiting to be sent"],
  ["In flight", "courier_in_flight", count, "attempts now"],
  ["Oldest pending", "courier_oldest_pending_seconds", duration, "since accepted"],
  ["Dead letters", "courier_dead_letters", count, "stored"],
  ["Paused", "courier_endpoints_paused", count, "endpoints"],
  ["Open breakers", "courier_host_circuit_open", count, "hosts"],
];

// Gauges that mean something needs a look when they are above 0.
const ALARMS = new Set(["courier_dead_letters", "courier_endpoints_paused", "courier_host_circuit_open"]);

// [label, counter]: per second over the last ~30 s, and the total since start.
const RATES = [
  ["Accepted", "courier_accepted_total"],
  ["Delivered", "courier_delivered_total"],
  ["Attempts", "courier_attempts_total"],
  ["Retried", 'courier_attempts_total{outcome="retry"}'],
  ["Dead-lettered", "courier_dead_letters_total"],
  ["Refused at ingress", "courier_ingress_rejected_total"],
];

/** Per second over the samples kept, or "–" before there are two (or after a restart). */
function rate(name) {
  const first = view.samples[0];
  const last = view.samples[view.samples.length - 1];
  if (view.samples.length < 2) return "–";
  const per = ((last.m[name] || 0) - (first.m[name] || 0)) / ((last.at - first.at) / 1000);
  if (!(per >= 0)) return "–";
  if (per === 0) return "0/s";
  return `${per < 10 ? per.toFixed(1) : Math.round(per).toLocaleString()}/s`;
}

function drawQueue(m) {
  const now = performance.now();
  // Counters start over when courier restarts: so do the rates.
  const previous = view.samples[view.samples.length - 1];
  const accepted = (sample) => sample.courier_accepted_total || 0;
  if (previous && accepted(m) < accepted(previous.m)) view.samples = [];
  view.samples.push({ at: now, m });
  if (view.samples.length > RATE_SAMPLES) view.samples.shift();
  const card = (label, value, note, kind) =>
    h(
      "div",
      { class: kind ? `card ${kind}` : "card" },
      h("div", { class: "label" }, label),
      h("div", { class: "value" }, value),
      h("div", { class: "note" }, note),
    );
  const gauges = GAUGES.map(([label, name, format, note]) => {
    const value = m[name] || 0;
    return card(label, format(value), note, value > 0 && ALARMS.has(name) ? "alarm" : null);
  });
  const rates = RATES.map(([label, name]) => card(label, rate(name), `${count(m[name] || 0)} since start`, "rate"));
  $("cards").replaceChildren(h("div", { class: "row" }, gauges), h("div", { class: "row" }, rates));
}

/** "410 permanent_status" / "503" / "–", and the error text under it. */
function lastResult(d) {
  const head = [d.last_status ?? (d.last_error ? "error" : "–"), d.dead_reason].filter(Boolean).join(" ");
  const error = d.last_error ? h("div", { class: "error-text cut", title: d.last_error }, d.last_error) : null;
  return [h("div", {}, head), error];
}

function when(d) {
  if (d.finished_at) return clock(d.finished_at);
  if (d.state === "pending" && d.next_attempt_at) return `next ${clock(d.next_attempt_at)}`;
  return clock(d.accepted_at);
}

function replay(id, button) {
  act(
    button,
    () => api("POST", `/deliveries/${enc(id)}/retry`),
    () => {
      view.selected = id; // follow it in the detail panel until it is delivered
      return `replayed ${id}`;
    },
  );
}

function replayButton(id) {
  return h("button", { type: "button", class: "replay", onclick: (e) => replay(id, e.currentTarget) }, "Replay");
}

function drawDeliveries(page) {
  const items = page.items;
  fillRows("delivery-rows", items, (d) =>
    h(
      "tr",
      { "data-id": d.id, class: d.id === view.selected ? "selected" : null },
      h(
        "td",
        {},
        h("button", { type: "button", class: "link mono", title: "show its attempts", onclick: () => select(d.id) }, d.id),
        h("div", { class: "mono muted cut", title: d.endpoint }, d.endpoint),
      ),
      h("td", {}, badge(d.state), h("div", { class: "muted small" }, d.attempts === 1 ? "1 attempt" : `${d.attempts} attempts`)),
      h("td", {}, lastResult(d)),
      h("td", { class: "nowrap" }, when(d)),
      h("td", { class: "actions" }, d.state === "dead" ? replayButton(d.id) : null),
    ),
  );
  // The selected row's mark follows the selection even when the rows did not change.
  for (const tr of $("delivery-rows").children) {
    tr.classList.toggle("selected", tr.dataset.id === view.selected);
  }
  $("deliveries-empty").hidden = items.length > 0;
  $("more").hidden = !page.next_cursor || view.limit >= MAX_PAGE;
}

function drawEndpoints(page) {
  fillRows("endpoint-rows", page.items, (e) => {
    const verb = e.state === "paused" ? "resume" : "pause";
    const change = (event) =>
      act(event.currentTarget, () => api("POST", `/endpoints/${enc(e.key)}/${verb}`), () => `${verb}d ${e.key}`);
    const button = h("button", { type: "button", class: verb, onclick: change }, verb === "pause" ? "Pause" : "Resume");
    return h(
      "tr",
      { "data-key": e.key },
      h("td", { class: "mono wrap" }, e.key, e.ordering ? h("span", { class: "tag" }, e.ordering) : null),
      h("td", {}, badge(e.state), e.line_blocked ? h("span", { class: "tag" }, "blocked") : null),
      h("td", { class: "num" }, e.pending),
      h("td", { class: "num" }, e.in_flight),
      h("td", { class: "num" }, e.permanent_failure_streak),
      h("td", { class: "actions" }, button),
    );
  });
  $("endpoints-empty").hidden = page.items.length > 0 || view.prefix !== "";
  $("endpoints-more").hidden = !page.next_cursor;
}

function select(id) {
  view.selected = id;
  $("detail").replaceChildren(h("p", { class: "muted" }, `loading ${id}…`));
  refresh();
}

function drawDetail(d) {
  if (!view.selected) return;
  if (d instanceof ApiError) {
    const gone = `${view.selected}: not found (deleted, or removed after its retention).`;
    const text = d.status === 404 ? gone : d.message;
    $("detail").replaceChildren(h("p", { class: "muted" }, text));
    return;
  }
  const history = d.history || [];
  const row = (label, ...value) => [h("dt", {}, label), h("dd", { "data-field": label }, ...value)];
  const fields = h(
    "dl",
    { class: "fields" },
    row("state", badge(d.state), d.dead_reason ? ` ${d.dead_reason}` : ""),
    row("id", h("span", { class: "mono" }, d.id)),
    row("event_id", h("span", { class: "mono" }, d.event_id)),
    row("target", h("span", { class: "mono wrap" }, d.target)),
    d.endpoint !== d.target ? row("endpoint", h("span", { class: "mono wrap" }, d.endpoint)) : null,
    d.route ? row("route", d.route) : null,
    // A replay starts the count again; the history keeps every attempt.
    row("attempts", `${d.attempts} of ${d.max_attempts}`, history.length > d.attempts ? " since the replay" : ""),
    row("accepted", clockAndRelative(d.accepted_at)),
    d.next_attempt_at ? row("next attempt", clockAndRelative(d.next_attempt_at)) : null,
    d.finished_at
      ? row("finished", clockAndRelative(d.finished_at))
      : row("gives up", clockAndRelative(d.give_up_at)),
    d.last_error ? row("last error", h("span", { class: "error-text wrap" }, d.last_error)) : null,
    d.trace_id ? row("trace_id", h("span", { class: "mono" }, d.trace_id)) : null,
    d.ordering ? row("ordering", `${d.ordering}, position ${d.line_position ?? "–"}`) : null,
  );
  const actions = h("div", { class: "actions" }, d.state === "dead" ? replayButton(d.id) : null);
  const attempts = history.length
    ? h(
        "table",
        { class: "grid history" },
        h("colgroup", {}, ["w-n", "w-at", "w-code", "w-took", null].map((width) => h("col", { class: width }))),
        h("thead", {}, h("tr", {}, ["#", "At", "Status", "Took", "Error"].map((title) => h("th", {}, title)))),
        h(
          "tbody",
          {},
          history.map((a, i) =>
            h(
              "tr",
              {},
              h("td", { class: "num" }, i + 1),
              h("td", { class: "nowrap", title: a.at }, clock(a.at)),
              h("td", {}, a.status === null ? badge("network") : statusCode(a.status)),
              h("td", { class: "num" }, `${a.duration_ms} ms`),
              h("td", { class: "error-text wrap" }, a.error || ""),
            ),
          ),
        ),
      )
    : h("p", { class: "muted" }, "No attempt yet.");
  $("detail").replaceChildren(fields, actions, h("h3", {}, "Attempts"), attempts);
}

// ---------------------------------------------------------------------------------------
// Wiring.

function start() {
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("token").value = "";
    $("login-error").textContent = "";
    status("checking the token…");
    refresh();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    lock("");
  });
  for (const tab of $("tabs").children) {
    tab.addEventListener("click", () => {
      view.state = tab.dataset.state;
      view.limit = PAGE;
      markTab();
      refresh();
    });
  }
  $("more").addEventListener("click", () => {
    view.limit = Math.min(MAX_PAGE, view.limit + PAGE);
    refresh();
  });
  $("replay-all").addEventListener("click", (e) => {
    if (!confirm("Replay every dead delivery?")) return;
    const replayAll = () => api("POST", "/deliveries/retry?state=dead");
    act(e.currentTarget, replayAll, (r) => `replayed ${r.requeued} dead deliveries`);
  });
  let typing = 0;
  $("endpoint-prefix").addEventListener("input", (e) => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      view.prefix = e.target.value;
      refresh();
    }, 250);
  });
  $("open-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("open-id").value.trim();
    if (id) select(id);
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && !locked()) refresh();
  });
  markTab();
  $("host").textContent = location.host;
  if (document.body.dataset.auth === "token" && !token()) lock("");
  else refresh();
}

function markTab() {
  for (const tab of $("tabs").children) {
    tab.setAttribute("aria-selected", String(tab.dataset.state === view.state));
  }
}

start();
