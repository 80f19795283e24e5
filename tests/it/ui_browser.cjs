// The browser half of tests/it/ui.rs: drives Debian's chromium through playwright-core and
// prints what it saw as one JSON object on stdout. It asserts nothing itself (the Rust test
// does); it only waits, each wait with a deadline, for what a user would wait for.
//
// Input: one JSON argument {admin, token, wrong_token, replay_id, screenshot}.
// Needs: COURIER_TEST_CHROMIUM (the browser) and playwright-core on NODE_PATH
// (scripts/verifiers.sh installs both).
"use strict";

const { chromium } = require("playwright-core");

const input = JSON.parse(process.argv[2]);
const STEP_MS = 15000;
// A hung browser must not hang the suite: the whole run has a deadline too.
setTimeout(() => {
  console.error("ui_browser: no result within 90 s");
  process.exit(3);
}, 90000).unref();

/** A fresh tab (its own sessionStorage) that records console output, page errors and API answers. */
async function tab(browser) {
  const context = await browser.newContext({
    viewport: { width: 1360, height: 860 },
    locale: "en-GB",
    timezoneId: "UTC",
  });
  const page = await context.newPage();
  page.setDefaultTimeout(STEP_MS);
  const seen = { console: [], page_errors: [], api: [] };
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") seen.console.push(`${m.type()}: ${m.text()}`);
  });
  page.on("pageerror", (e) => seen.page_errors.push(String(e)));
  page.on("response", (r) => {
    const url = new URL(r.url());
    if (url.protocol === "http:" && !url.pathname.startsWith("/ui")) seen.api.push({ path: url.pathname, status: r.status() });
  });
  return { context, page, seen };
}

async function locked(browser) {
  const { context, page, seen } = await tab(browser);
  await page.goto(`${input.admin}/ui`);
  await page.locator("#login").waitFor({ state: "visible" });
  const before = { data_text: await page.locator("#data").textContent(), api: [...seen.api] };
  // The page makes no call without a token; one made anyway from the page is refused.
  const probe = await page.evaluate(async () => (await fetch("/deliveries?state=dead")).status);
  // A wrong token: the page's calls are refused and it asks again, showing nothing.
  await page.fill("#token", input.wrong_token);
  await page.click("#login-form button[type=submit]");
  await page.locator("#login-error").filter({ hasText: /\S/ }).waitFor();
  const result = {
    before,
    probe_status: probe,
    login_visible: await page.locator("#login").isVisible(),
    login_error: await page.locator("#login-error").textContent(),
    data_visible: await page.locator("#data").isVisible(),
    data_text: await page.locator("#data").textContent(),
    stored_token: await page.evaluate(() => sessionStorage.length),
    api: seen.api,
  };
  await context.close();
  return result;
}

async function unlocked(browser) {
  const { context, page, seen } = await tab(browser);
  await page.goto(`${input.admin}/ui`);
  await page.fill("#token", input.token);
  await page.click("#login-form button[type=submit]");
  const row = page.locator(`#delivery-rows tr[data-id="${input.replay_id}"]`);
  await row.waitFor();
  // Wait for a second sample so the rates have a value (a real wait: the page's own timer).
  await page.locator(".card.rate .value").first().filter({ hasText: "/s" }).waitFor();
  const listed = {
    deliveries_text: await page.locator("#delivery-rows").textContent(),
    endpoints_text: await page.locator("#endpoint-rows").textContent(),
    cards_text: await page.locator("#cards").textContent(),
    pwned: await page.evaluate(() => window.__pwned === undefined ? null : String(window.__pwned)),
    img_elements: await page.locator("img").count(),
    script_elements: await page.locator("script").count(),
    stored_token: await page.evaluate(() => sessionStorage.getItem("courier.admin_token")),
  };
  await row.locator("button.replay").click();
  // The page follows the replayed delivery in its detail panel until it is delivered.
  const state = page.locator('#detail [data-field="state"]');
  await state.filter({ hasText: "delivered" }).waitFor();
  // And the dead row is gone from the Dead tab.
  await row.waitFor({ state: "detached" });
  const result = {
    listed,
    detail_state: (await state.textContent()).trim(),
    detail_text: await page.locator("#detail").textContent(),
    status_text: await page.locator("#status").textContent(),
    console: seen.console,
    page_errors: seen.page_errors,
    api: seen.api,
  };
  if (input.screenshot) {
    // The picture in docs/operations.md (docs/ui.png): every delivery listed, the replayed one open.
    await page.click('#tabs button[data-state=""]');
    await row.waitFor();
    await page.screenshot({ path: input.screenshot, fullPage: true });
  }
  await context.close();
  return result;
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.COURIER_TEST_CHROMIUM,
    headless: true,
    // As root, on a machine with no network: without these it stalls. Playwright gives
    // each launch a fresh temporary profile (--user-data-dir) and removes it after.
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  try {
    const out = { locked: await locked(browser), unlocked: await unlocked(browser) };
    process.stdout.write(JSON.stringify(out) + "\n");
  } finally {
    await browser.close();
  }
})().catch((e) => {
  console.error(`ui_browser: ${e.stack || e}`);
  process.exit(1);
});
