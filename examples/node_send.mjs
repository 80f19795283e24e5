#!/usr/bin/env node
// Sends one JSON webhook through courier by each of its three zero-code forms, with
// Node's built-in fetch and http modules only (Node >= 18):
//   1. URL prefix:    POST $COURIER/$TARGET
//   2. HTTP proxy:    POST $TARGET sent to courier as a proxy (absolute-form request line)
//   3. header:        POST $COURIER/ with `Courier-Target: $TARGET`
//
//   COURIER=http://127.0.0.1:8787 TARGET=https://receiver.example/hooks node examples/node_send.mjs
//
// Set COURIER_INGRESS_TOKEN if courier has an ingress token. To deliver to the example
// receiver on 127.0.0.1:9000 (the default TARGET), courier must allow loopback targets:
// `[egress] allow = ["127.0.0.1/32"]`. Exits 1 unless all three were accepted (202).
import http from "node:http";

const COURIER = (process.env.COURIER ?? "http://127.0.0.1:8787").replace(/\/+$/, "");
const TARGET = process.env.TARGET ?? "http://127.0.0.1:9000/hooks";
const TOKEN = process.env.COURIER_INGRESS_TOKEN;

const body = (form) => JSON.stringify({ type: "example.sent", form, data: { hello: "world" } });

function headers(extra = {}) {
  const h = { "content-type": "application/json", ...extra };
  if (TOKEN) h["courier-token"] = TOKEN;
  return h;
}

function show(form, status, deliveryId, answer) {
  console.log(`${form.padEnd(15)} ${status} delivery_id=${deliveryId ?? "-"} ${answer.trim()}`);
  return status;
}

async function viaFetch(form, url, extra) {
  const r = await fetch(url, { method: "POST", headers: headers(extra), body: body(form) });
  return show(form, r.status, r.headers.get("courier-delivery-id"), await r.text());
}

// fetch always sends origin-form and ignores HTTP_PROXY, so the proxy form uses
// node:http, which writes `path` into the request line as given: an absolute URL
// there is exactly what a proxy receives. This also works for https:// targets, which
// proxy-aware clients would otherwise tunnel with CONNECT (courier refuses: 405).
function viaProxy(form) {
  const courier = new URL(COURIER);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: courier.hostname,
        port: courier.port || 80,
        method: "POST",
        path: TARGET,
        headers: headers({ host: new URL(TARGET).host }),
      },
      (res) => {
        let answer = "";
        res.setEncoding("utf8");
        res.on("data", (chunk) => (answer += chunk));
        res.on("end", () => resolve(show(form, res.statusCode, res.headers["courier-delivery-id"], answer)));
      },
    );
    req.on("error", reject);
    req.end(body(form));
  });
}

const statuses = [
  await viaFetch("url-prefix", `${COURIER}/${TARGET}`),
  await viaProxy("proxy"),
  await viaFetch("courier-target", `${COURIER}/`, { "courier-target": TARGET }),
];
process.exitCode = statuses.every((s) => s === 202) ? 0 : 1;
