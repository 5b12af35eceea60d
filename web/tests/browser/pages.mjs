// Drives headless Chromium (Debian's /usr/bin/chromium, through playwright-core) through
// every lagscope page of a running service, as lagscope/tests/pages_browser.rs sets it up:
//
//   node pages.mjs --base http://127.0.0.1:PORT --artifacts DIR --hostile CLIENT_ID
//
// For each page: the response is 200, no console error and no uncaught exception, charts
// (inline SVG) render with a size, and a full-page screenshot is written to DIR. It then
// follows links as a person would (overview -> anomaly -> client timeline -> dashboards), and
// checks that a client id full of markup is shown as text on every page that names it:
// no script from telemetry runs, and the page is not pushed wider than the window.
// Exits non-zero with every failure listed.

import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, value, index, all) => {
    if (value.startsWith("--")) pairs.push([value.slice(2), all[index + 1]]);
    return pairs;
  }, []),
);
const base = args.base;
const artifacts = args.artifacts;
const hostile = args.hostile;
if (!base || !artifacts || !hostile) {
  console.error("usage: node pages.mjs --base URL --artifacts DIR --hostile CLIENT_ID");
  process.exit(2);
}
mkdirSync(artifacts, { recursive: true });

const failures = [];
const fail = (message) => {
  failures.push(message);
  console.error(`FAIL ${message}`);
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
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
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
const page = await context.newPage();
let consoleErrors = [];
page.on("console", (message) => {
  if (message.type() === "error") consoleErrors.push(message.text());
});
page.on("pageerror", (error) => consoleErrors.push(`uncaught: ${error.message}`));
// A script from telemetry would set this; the pages' own script never does.
await page.addInitScript(() => {
  window.__lagscopePwned = false;
});

/** Opens `path`, checks it, screenshots it as `name`; returns the response status. */
async function visit(name, path, { charts = 0, status = 200 } = {}) {
  consoleErrors = [];
  const response = await page.goto(new URL(path, base).toString(), { waitUntil: "load" });
  const got = response ? response.status() : 0;
  if (got !== status) fail(`${name} (${path}): status ${got}, expected ${status}`);
  await page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true });
  // An error page's own status is logged by Chromium as a failed load: expected there.
  const expected = `the server responded with a status of ${status}`;
  for (const error of consoleErrors) {
    if (status !== 200 && error.includes(expected)) continue;
    fail(`${name}: console error: ${error}`);
  }
  const drawn = await page.$$eval("svg.chart", (svgs) =>
    svgs.filter((svg) => {
      const box = svg.getBoundingClientRect();
      return box.width > 100 && box.height > 50 && svg.querySelectorAll("rect, path, polyline, line").length > 0;
    }).length,
  );
  if (drawn < charts) fail(`${name}: ${drawn} charts rendered, expected at least ${charts}`);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 2) fail(`${name}: the page is ${overflow}px wider than the window`);
  if (await page.evaluate(() => window.__lagscopePwned !== false)) fail(`${name}: a script from telemetry ran`);
  console.log(`ok ${name} (${path}): ${drawn} charts`);
  return got;
}

// Overview, then the first anomaly listed, then its client's timeline, through the links.
await visit("overview", "/", { charts: 1 });
// One of the simulator's stale reads (not the hostile client's), through its link.
const anomalyHref = await page.$$eval("#recent-anomalies tbody tr", (rows) => {
  const row = rows.find((r) => r.cells[2] && r.cells[2].textContent === "stale_read" && !r.textContent.includes("<script>"));
  return row ? row.querySelector("a[href^='/anomalies/']").getAttribute("href") : null;
});
// Every open window anomaly, which has no client to draw but metrics that show it.
const openHrefs = await page.$$eval("#open-anomalies tbody tr td:first-child a", (links) => links.map((a) => a.getAttribute("href")));
if (!anomalyHref) {
  fail("overview: no anomaly linked in 'In this range'");
} else {
  await page.click(`#recent-anomalies tbody a[href='${anomalyHref}']`);
  await page.waitForLoadState("load");
  if (!page.url().endsWith(anomalyHref)) fail(`overview -> anomaly: landed on ${page.url()}`);
  await visit("anomaly", anomalyHref, { charts: 1 });
  const summary = (await page.textContent("#summary")) || "";
  if (summary.trim().length === 0) fail("anomaly: no summary");
  const clientLink = await page.getAttribute("#client-link", "href");
  if (clientLink) {
    await page.click("#client-link");
    await page.waitForLoadState("load");
    await visit("client-timeline", new URL(page.url()).pathname + new URL(page.url()).search, { charts: 1 });
    const attempts = await page.$$eval("#attempts tbody tr", (rows) => rows.length);
    if (attempts < 1) fail("client timeline: no attempts listed");
  } else {
    fail("anomaly: no link to the client's timeline");
  }
}

if (openHrefs.length === 0) fail("overview: no open anomaly listed");
for (const href of openHrefs) {
  await visit(`open-${href.split("/").pop()}`, href, { charts: 1 });
}

// Every dashboard in the navigation bar, reached by its link.
await page.goto(new URL("/", base).toString());
const dashboards = await page.$$eval("header nav a[href^='/dashboards/']", (links) =>
  links.map((link) => link.getAttribute("href")),
);
if (dashboards.length < 4) fail(`navigation: ${dashboards.length} dashboards linked, expected at least 4`);
for (const href of dashboards) {
  await page.goto(new URL("/", base).toString());
  await page.click(`header nav a[href='${href}']`);
  await page.waitForLoadState("load");
  await visit(`dashboard-${href.split("/").pop()}`, href, { charts: 1 });
}

// Errors are pages too.
await visit("not-found", "/anomalies/999999999", { status: 404 });
await visit("bad-request", "/?from=yesterday", { status: 400 });

// Hostile telemetry: the client id is markup and very long. It must show as text.
const hostilePath = `/clients/${encodeURIComponent(hostile)}`;
await visit("hostile-client", hostilePath, { charts: 1 });
const text = await page.evaluate(() => document.body.innerText);
if (!text.includes("<script>")) fail("hostile-client: the client id is not shown as text");
const injected = await page.$$eval("script", (scripts) =>
  scripts.filter((script) => !(script.getAttribute("src") || "").startsWith("/assets/")).length,
);
if (injected > 0) fail(`hostile-client: ${injected} script elements besides lagscope's own`);
const hostileAnomaly = await page.getAttribute("#client-anomalies tbody a[href^='/anomalies/']", "href");
if (!hostileAnomaly) {
  fail("hostile-client: its stale read is not listed");
} else {
  await visit("hostile-anomaly", hostileAnomaly, { charts: 1 });
  const summary = (await page.textContent("#summary")) || "";
  if (!summary.includes("<script>")) fail("hostile-anomaly: the summary does not show the client id as text");
}
await visit("hostile-overview", "/", { charts: 1 });

await browser.close();
if (failures.length > 0) {
  console.error(`${failures.length} failures`);
  process.exit(1);
}
console.log(`all pages passed; screenshots in ${artifacts}`);
