// Opens a profile in the speedscope app, in Debian's chromium driven by playwright-core,
// and prints what the app drew: first the profile it opened with, `{"opened": 2}`, then
// each of the file's profiles in order, one JSON line each:
//   {"position": 4, "count": 11, "name": "./leaky (pid 42) — bytes leaked",
//    "rows": [{"symbol": "malloc", "total": "148.39 KB (100%)", "self": ...}, ...]}
// The names come from the app's toolbar, the symbols from its sandwich view's table (HTML:
// the flame graphs are drawn on a canvas); `p` and `n` switch profiles, as a person
// would. A screenshot of each profile goes to SHOTS/profile-N.png, and one of the last
// profile's flame graph (left heavy) to SHOTS/flamegraph.png.
//
// Usage: node read.mjs URL USER_DATA_DIR SHOTS
// URL opens the app with `#profileURL=...&view=sandwich`. Any error of the page, or a
// profile that never draws, fails with a non-zero exit and the reason on stderr.
import { chromium } from 'playwright-core';

const [url, userDataDir, shots] = process.argv.slice(2);
// How long the app may take to import the file and draw a profile (SPEEDSCOPE_TIMEOUT_MS).
const TIMEOUT = Number(process.env.SPEEDSCOPE_TIMEOUT_MS ?? 60000);
if (!shots) {
  console.error('usage: node read.mjs URL USER_DATA_DIR SHOTS');
  process.exit(2);
}

// playwright adds --headless (headless: true) and --user-data-dir (the fresh directory
// given); the other flags keep chromium off the network and quiet.
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1280, height: 800 },
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});
const errors = [];
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.on('pageerror', (error) => errors.push(`page error: ${error}`));
  page.on('console', (message) => {
    if (message.type() === 'error') errors.push(`console error: ${message.text()}`);
  });
  page.on('dialog', (dialog) => {
    errors.push(`dialog: ${dialog.message()}`);
    dialog.dismiss();
  });
  await page.goto(url);
  // The app names the page after the file once it has imported it.
  await page.waitForFunction(() => document.title.endsWith(' - speedscope'), null, {
    timeout: TIMEOUT,
  });

  // The toolbar's profile name and "(position/count)", and the table's symbols.
  const drawn = () =>
    page.evaluate(() => {
      let name = null;
      let position = 1;
      let count = 1;
      for (const span of document.querySelectorAll('span > span')) {
        const match = /^\((\d+)\/(\d+)\)$/.exec(span.textContent.trim());
        if (match) {
          position = Number(match[1]);
          count = Number(match[2]);
          name = span.parentElement.textContent.slice(0, -span.textContent.length).trim();
        }
      }
      // The sandwich table's rows: a color swatch before each symbol (the profile menu's
      // rows have none).
      if (name === null) {
        // One profile: its name is the toolbar's own text, between the view buttons and
        // the file buttons.
        const views = [...document.querySelectorAll('div')].find(
          (div) => div.children.length === 1 && div.textContent.trim().endsWith('Sandwich'),
        );
        const toolbar = views?.parentElement?.parentElement;
        name = [...(toolbar?.childNodes ?? [])]
          .filter((node) => node.nodeType === Node.TEXT_NODE)
          .map((node) => node.textContent)
          .join('')
          .trim();
      }
      const rows = [];
      for (const row of document.querySelectorAll('tr')) {
        const cells = [...row.querySelectorAll('td')].map((cell) => cell.textContent.trim());
        if (cells.length === 3 && row.querySelector('td > span[style*="background-color"]')) {
          rows.push({ symbol: cells[2], total: cells[0], self: cells[1] });
        }
      }
      return { position, count, name, rows };
    });
  const drawnTable = () =>
    page.waitForFunction(
      () =>
        [...document.querySelectorAll('td > span[style*="background-color"]')].length > 0,
      null,
      { timeout: TIMEOUT },
    );
  const switchTo = async (key, position) => {
    await page.keyboard.press(key);
    await page.waitForFunction(
      (wanted) =>
        [...document.querySelectorAll('span > span')].some((s) =>
          new RegExp(`^\\(${wanted}/\\d+\\)$`).test(s.textContent.trim()),
        ),
      position,
      { timeout: TIMEOUT },
    );
  };

  await drawnTable();
  let { position } = await drawn();
  console.log(JSON.stringify({ opened: position }));
  for (; position > 1; position--) await switchTo('p', position - 1);
  for (;;) {
    await drawnTable();
    const profile = await drawn();
    console.log(JSON.stringify(profile));
    await page.screenshot({ path: `${shots}/profile-${profile.position}.png` });
    if (profile.position >= profile.count) break;
    await switchTo('n', profile.position + 1);
  }
  await page.keyboard.press('2');
  await page.waitForTimeout(500);
  await page.screenshot({ path: `${shots}/flamegraph.png` });
} catch (error) {
  errors.push(String(error));
} finally {
  await context.close();
}
if (errors.length > 0) {
  console.error(errors.join('\n'));
  process.exit(1);
}
