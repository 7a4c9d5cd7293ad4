'use strict';
// cargo-trace's report: every view drawn from the profile embedded in #profile-data
// (its format is written down in profile/src/writers/html/data.rs). Plain script, no
// library, nothing fetched.
(function () {
  const started = performance.now();
  const profile = JSON.parse(document.getElementById('profile-data').textContent);

  // ---- Figures as a person reads them (the same forms as html/units.rs) ----
  const BINARY = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function significant(v) {
    if (Math.abs(v) < 100) {
      const t = v.toFixed(1);
      return t.endsWith('.0') ? t.slice(0, -2) : t;
    }
    return v.toFixed(0);
  }
  function bytes(n) {
    if (Math.abs(n) < 1024) return Math.round(n) + ' B';
    let v = n / 1024, u = 0;
    while (Math.abs(v) >= 1024 && u < BINARY.length - 1) { v /= 1024; u++; }
    return significant(v) + ' ' + BINARY[u];
  }
  function nanoseconds(ns) {
    const a = Math.abs(ns);
    if (a < 1e3) return Math.round(ns) + ' ns';
    if (a < 1e6) return significant(ns / 1e3) + ' µs';
    if (a < 1e9) return significant(ns / 1e6) + ' ms';
    if (a < 1e11) { const s = ns / 1e9; return (Math.abs(s) < 10 ? s.toFixed(2) : s.toFixed(1)) + ' s'; }
    const s = Math.floor(a / 1e9), sign = ns < 0 ? '-' : '';
    return s < 3600 ? sign + Math.floor(s / 60) + ' min ' + (s % 60) + ' s'
      : sign + Math.floor(s / 3600) + ' h ' + (Math.floor(s / 60) % 60) + ' min';
  }
  function count(n) {
    n = Math.round(n);
    return (n < 0 ? '-' : '') + Math.abs(n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  }
  function format(n, unit) {
    switch (unit) {
      case 'bytes': return bytes(n);
      case 'nanoseconds': return nanoseconds(n);
      case 'microseconds': return nanoseconds(n * 1e3);
      default: return count(n);
    }
  }
  function share(part, whole) {
    if (!(whole > 0)) return '';
    if (part === 0) return '0%';
    const p = 100 * part / whole;
    return (p >= 9.95 ? p.toFixed(0) : p >= 0.995 ? p.toFixed(1) : p.toFixed(2)) + '%';
  }
  const ENTITIES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  function esc(text) { return String(text).replace(/[&<>"']/g, c => ENTITIES[c]); }
  function plural(n, one, many) { return count(n) + ' ' + (Math.round(n) === 1 ? one : many); }
  function $(id) { return document.getElementById(id); }

  // ---- The profile: frames, the tree of stacks, samples and their value columns ----
  const values = profile.values;
  const frameName = profile.frames.name, frameKind = profile.frames.kind;
  const frameObject = profile.frames.object;
  const F = frameName.length;
  const objectName = profile.objects.map(path => path.slice(path.lastIndexOf('/') + 1));
  const USER = 0, KERNEL = 1, NOT_CODE = 2;

  let N = 1;
  for (const item of profile.tree) if (item >= 0) N++;
  // Node 0 is "all", above every stack; nodes are in preorder, children in name order.
  const nodeFrame = new Int32Array(N), nodeParent = new Int32Array(N), nodeDepth = new Int32Array(N);
  const firstChild = new Int32Array(N).fill(-1), nextSibling = new Int32Array(N).fill(-1);
  {
    const lastChild = new Int32Array(N).fill(-1);
    const path = [0];
    nodeFrame[0] = -1; nodeParent[0] = -1;
    let n = 1;
    for (const item of profile.tree) {
      if (item < 0) { path.length += item; continue; }
      const parent = path[path.length - 1];
      nodeFrame[n] = item; nodeParent[n] = parent; nodeDepth[n] = path.length;
      if (lastChild[parent] < 0) firstChild[parent] = n; else nextSibling[lastChild[parent]] = n;
      lastChild[parent] = n;
      path.push(n);
      n++;
    }
  }
  let maxDepth = 0;
  for (let n = 1; n < N; n++) if (nodeDepth[n] > maxDepth) maxDepth = nodeDepth[n];

  const S = profile.samples.node.length;
  const sampleNode = new Int32Array(S), samplePid = new Int32Array(S);
  {
    let node = 0;
    const deltas = profile.samples.node, pidIndexes = profile.samples.pid;
    for (let i = 0; i < S; i++) {
      node += deltas[i];
      sampleNode[i] = node;
      if (pidIndexes) samplePid[i] = pidIndexes[i];
    }
  }
  const pids = profile.pids;

  const columnCache = [];
  function column(v) {
    if (columnCache[v]) return columnCache[v];
    const encoded = profile.columns[v], scale = encoded.scale || 1;
    const out = new Float64Array(S);
    if (encoded.dense) {
      for (let i = 0; i < S; i++) out[i] = encoded.dense[i] * scale;
    } else {
      let i = 0;
      for (let k = 0; k < encoded.at.length; k++) { i += encoded.at[k]; out[i] = encoded.v[k] * scale; }
    }
    columnCache[v] = out;
    return out;
  }
  // Calls fn(sample, value) for each sample with a value other than 0, without
  // decoding a sparse column.
  function eachValue(v, fn) {
    const encoded = profile.columns[v], scale = encoded.scale || 1;
    if (encoded.dense) {
      for (let i = 0; i < S; i++) if (encoded.dense[i]) fn(i, encoded.dense[i] * scale);
    } else {
      let i = 0;
      for (let k = 0; k < encoded.at.length; k++) { i += encoded.at[k]; fn(i, encoded.v[k] * scale); }
    }
  }
  function valueIndex(kind) { return values.findIndex(t => t.kind === kind); }
  const totals = values.map((_, v) => { let t = 0; eachValue(v, (_, x) => { t += x; }); return t; });

  // Each node's own (self) and total weight by value v: its samples, and its subtree's.
  const weightCache = new Map();
  function weights(v) {
    let w = weightCache.get(v);
    if (w) return w;
    const self = new Float64Array(N);
    eachValue(v, (i, x) => { self[sampleNode[i]] += x; });
    const total = self.slice();
    for (let n = N - 1; n > 0; n--) total[nodeParent[n]] += total[n];
    w = { self, total };
    if (weightCache.size >= 3) weightCache.delete(weightCache.keys().next().value);
    weightCache.set(v, w);
    return w;
  }

  function label(n) { return n === 0 ? 'all' : frameName[nodeFrame[n]]; }
  function describeFrame(f) {
    const kind = frameKind[f] === KERNEL ? ' (kernel)' : '';
    const object = frameObject[f] >= 0 ? ' in ' + objectName[frameObject[f]] : '';
    return frameName[f] + kind + object;
  }
  // The functions of a stack, innermost first.
  function stackFrames(n) {
    const frames = [];
    for (; n > 0; n = nodeParent[n]) frames.push(nodeFrame[n]);
    return frames;
  }
  function shortStack(n, shown) {
    const frames = stackFrames(n);
    const names = frames.slice(0, shown).map(f => frameName[f]);
    let text = names.join(' ← ');
    if (frames.length > shown) text += ' ← … (' + frames.length + ' frames)';
    return text || '[no stack]';
  }
  // A stack as a short line, and the whole of it on demand.
  function stackCell(n) {
    const frames = stackFrames(n);
    if (frames.length <= 6) return '<td class="name">' + esc(shortStack(n, 6)) + '</td>';
    return '<td class="name"><details data-stack="' + n + '"><summary>' + esc(shortStack(n, 4)) +
      '</summary></details></td>';
  }
  document.addEventListener('toggle', event => {
    const details = event.target;
    if (!details.dataset || details.dataset.stack === undefined || details.dataset.filled) return;
    details.dataset.filled = '1';
    const list = stackFrames(+details.dataset.stack).map(f => '<li>' + esc(describeFrame(f)) + '</li>');
    details.insertAdjacentHTML('beforeend', '<ol>' + list.join('') + '</ol>');
  }, true);

  // ---- What the views follow: the value, the search, the zoom, the function chosen ----
  const flameValues = values.map((t, v) => v).filter(v => values[v].flame);
  let value = profile.initial;
  if (!values[value] || !values[value].flame || totals[value] === 0) {
    value = flameValues.find(v => totals[v] !== 0);
    if (value === undefined) value = flameValues.length ? flameValues[0] : 0;
  }
  let zoom = 0;
  let selected = -1;
  let search = '';
  let matchFrame = null;  // Uint8Array over frames, when searching
  let underMatch = null;  // over nodes: the node or one of its callers matches
  let aboveMatch = null;  // over nodes: the node or one of its callees matches

  function setSearch(text) {
    search = text.trim();
    if (!search) { matchFrame = underMatch = aboveMatch = null; return; }
    let test = null;
    const regex = /^\/(.+)\/([a-z]*)$/.exec(search);
    if (regex) {
      try {
        const re = new RegExp(regex[1], regex[2].replace(/[^imsu]/g, '') + (regex[2].includes('i') ? '' : 'i'));
        test = name => re.test(name);
      } catch (e) { test = null; }
    }
    if (!test) { const needle = search.toLowerCase(); test = name => name.toLowerCase().includes(needle); }
    matchFrame = new Uint8Array(F);
    for (let f = 0; f < F; f++) matchFrame[f] = test(frameName[f]) ? 1 : 0;
    underMatch = new Uint8Array(N);
    aboveMatch = new Uint8Array(N);
    for (let n = 1; n < N; n++) underMatch[n] = matchFrame[nodeFrame[n]] | underMatch[nodeParent[n]];
    for (let n = N - 1; n > 0; n--) {
      if (aboveMatch[n] || matchFrame[nodeFrame[n]]) { aboveMatch[n] = 1; aboveMatch[nodeParent[n]] = 1; }
    }
  }
  // Whether sample i's stack goes through the search's functions (every sample, without one).
  function kept(i) { return !underMatch || underMatch[sampleNode[i]] === 1; }
  function filterNote() {
    return search ? ' <span class="note">(the stacks through “' + esc(search) + '”)</span>' : '';
  }

  function valueName(v) { return values[v].name; }
  function fmt(n, v) { return format(n, values[v === undefined ? value : v].unit); }

  // ---- The flamegraph ----
  const ROW = 16, PRINT_ROW = 15, PRINT_WIDTH = 1000, PRINT_ROWS_PER_PAGE = 90;
  const MIN_WIDTH = 0.5, MAX_BOXES = 40000;
  function hash(text) {
    let h = 2166136261;
    for (let i = 0; i < text.length; i++) { h ^= text.charCodeAt(i); h = Math.imul(h, 16777619); }
    return h >>> 0;
  }
  const colors = new Array(F);
  function color(n) {
    const f = nodeFrame[n];
    if (f < 0) return '#cfcfcf';
    if (colors[f]) return colors[f];
    const h = hash(frameName[f]);
    let c;
    if (frameKind[f] === NOT_CODE) c = '#c8c8c8';
    else if (frameKind[f] === KERNEL) c = 'hsl(' + (180 + h % 30) + ',55%,' + (60 + (h >>> 8) % 15) + '%)';
    else c = 'hsl(' + (h % 50) + ',' + (75 + (h >>> 8) % 20) + '%,' + (55 + (h >>> 16) % 14) + '%)';
    colors[f] = c;
    return c;
  }
  const charWidths = {};
  function charWidth(px) {
    if (!charWidths[px]) {
      const context = document.createElement('canvas').getContext('2d');
      let width = px * 0.62;
      if (context) {
        context.font = px + 'px "DejaVu Sans Mono", monospace';
        width = context.measureText('MMMMMMMMMM').width / 10 || width;
      }
      charWidths[px] = width;
    }
    return charWidths[px];
  }

  // The boxes of the flamegraph of weights w zoomed on node root, `width` pixels wide:
  // root's callers at full width above it, its callees scaled to it; boxes narrower
  // than MIN_WIDTH are left out, and narrower ones still while there are more than
  // MAX_BOXES (boxes.minWidth says how narrow).
  function layout(w, root, width) {
    for (let minWidth = MIN_WIDTH; ; minWidth *= 2) {
      const boxes = layoutAt(w, root, width, minWidth);
      if (boxes.node.length <= MAX_BOXES || minWidth > width) return boxes;
    }
  }
  function layoutAt(w, root, width, minWidth) {
    const boxes = { node: [], x: [], width: [], depth: 0, minWidth };
    function add(n, x, bw) {
      boxes.node.push(n); boxes.x.push(x); boxes.width.push(bw);
      if (nodeDepth[n] > boxes.depth) boxes.depth = nodeDepth[n];
    }
    for (let n = nodeParent[root]; n >= 0; n = nodeParent[n]) add(n, 0, width);
    if (!(w.total[root] > 0)) return boxes;
    add(root, 0, width);
    const scale = width / w.total[root];
    const pending = [root, 0];
    while (pending.length && boxes.node.length <= MAX_BOXES) {
      const x = pending.pop(), n = pending.pop();
      let cx = x;
      for (let c = firstChild[n]; c >= 0; c = nextSibling[c]) {
        const cw = w.total[c] * scale;
        if (cw >= minWidth) {
          add(c, cx, cw);
          pending.push(c, cx);
        }
        cx += cw;
      }
    }
    return boxes;
  }
  function narrowNote(boxes) {
    return boxes.minWidth > MIN_WIDTH ? 'boxes narrower than ' + plural(boxes.minWidth, 'pixel', 'pixels') +
      ' are left out, to draw at most ' + count(MAX_BOXES) : '';
  }

  // The boxes of rows [from, to) as one SVG.
  function flameSvg(boxes, root, width, row, from, to) {
    const px = row <= 15 ? 10 : 11;
    const cw = charWidth(px);
    const height = (to - from) * row;
    const parts = ['<svg class="flame" viewBox="0 0 ', width, ' ', height, '" width="', width,
      '" height="', height, '" style="font-size:', px, 'px">'];
    for (let i = 0; i < boxes.node.length; i++) {
      const n = boxes.node[i], d = nodeDepth[n];
      if (d < from || d >= to) continue;
      const x = boxes.x[i], bw = boxes.width[i], y = (d - from) * row;
      let cls = '';
      if (d < nodeDepth[root]) cls = ' class="above"';
      else if (matchFrame && n > 0 && matchFrame[nodeFrame[n]]) cls = ' class="hit"';
      parts.push('<rect x="', x.toFixed(1), '" y="', y, '" width="', bw.toFixed(1), '" height="', row - 1,
        '" fill="', color(n), '" data-n="', n, '"', cls, '/>');
      if (bw >= cw * 3 + 4) {
        const name = label(n), fit = Math.floor((bw - 4) / cw);
        const text = name.length <= fit ? name : name.slice(0, fit - 2) + '..';
        parts.push('<text x="', (x + 2).toFixed(1), '" y="', y + row - 4, '">', esc(text), '</text>');
      }
    }
    parts.push('</svg>');
    return parts.join('');
  }

  function boxText(n, w) {
    const total = w.total[n], all = w.total[0];
    let text = (n === 0 ? 'all' : describeFrame(nodeFrame[n])) + ': ' + fmt(total) + ' ' + valueName(value);
    if (n > 0) text += ' (' + share(total, all) + '), self ' + fmt(w.self[n]);
    return text;
  }

  function drawFlame() {
    const view = $('flame');
    const w = weights(value);
    if (!(w.total[0] > 0)) {
      view.innerHTML = '<p class="empty">No ' + esc(valueName(value)) + ' in this profile: nothing to draw.</p>';
      $('details').textContent = '';
      return;
    }
    if (!(w.total[zoom] > 0)) zoom = 0;
    const width = Math.max(600, (view.clientWidth || 1200) - 2);
    const boxes = layout(w, zoom, width);
    view.innerHTML = flameSvg(boxes, zoom, width, ROW, 0, boxes.depth + 1);
    let text = boxText(zoom, w);
    if (zoom > 0) text = 'zoomed on ' + text;
    if (narrowNote(boxes)) text += ' — ' + narrowNote(boxes);
    view.dataset.summary = text;
    $('details').textContent = text;
  }

  function initFlame() {
    const view = $('flame');
    view.addEventListener('mousemove', event => {
      const n = event.target.dataset && event.target.dataset.n;
      if (n !== undefined) $('details').textContent = boxText(+n, weights(value));
    });
    view.addEventListener('mouseleave', () => { $('details').textContent = view.dataset.summary || ''; });
    view.addEventListener('click', event => {
      const n = event.target.dataset && event.target.dataset.n;
      if (n === undefined) return;
      zoom = +n;
      drawFlame();
      view.scrollTop = 0;
      if (zoom > 0) select(nodeFrame[zoom]);
    });
    $('reset').addEventListener('click', () => { zoom = 0; drawFlame(); });
    let resizing = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resizing);
      resizing = setTimeout(drawFlame, 150);
    });
  }

  // Printed, every value's flamegraph, one under another, a page's rows per SVG.
  let printed = false;
  function drawForPrint() {
    if (printed) return;
    printed = true;
    for (const figure of document.querySelectorAll('.flamegraph[data-value]')) {
      const v = +figure.dataset.value;
      const boxes = layout(weights(v), 0, PRINT_WIDTH);
      const parts = [];
      for (let from = 0; from <= boxes.depth; from += PRINT_ROWS_PER_PAGE) {
        parts.push(flameSvg(boxes, 0, PRINT_WIDTH, PRINT_ROW, from, Math.min(from + PRINT_ROWS_PER_PAGE, boxes.depth + 1)));
      }
      if (narrowNote(boxes)) parts.push('<p class="note">The ' + narrowNote(boxes) + '.</p>');
      figure.querySelector('.flame-print').innerHTML = parts.join('');
    }
  }
  window.addEventListener('beforeprint', drawForPrint);
  if (window.matchMedia) {
    const print = window.matchMedia('print');
    const onChange = event => { if (event.matches) drawForPrint(); };
    if (print.addEventListener) print.addEventListener('change', onChange);
    else if (print.addListener) print.addListener(onChange);
  }

  // ---- Functions: self and total, and the callers and callees of the one chosen ----
  // Self: the function's own frames at the top of stacks; total: the stacks it is in,
  // each counted once however often the function recurs in it.
  function functionWeights(w) {
    const self = new Float64Array(F), total = new Float64Array(F), active = new Int32Array(F);
    const path = [];
    for (let n = 1; n < N; n++) {
      const d = nodeDepth[n];
      while (path.length >= d) active[nodeFrame[path.pop()]]--;
      const f = nodeFrame[n];
      self[f] += w.self[n];
      if (active[f] === 0) total[f] += w.total[n];
      active[f]++;
      path.push(n);
    }
    return { self, total };
  }

  let functionSort = 'total', functionLimit = 100;
  function drawFunctions() {
    const view = $('functions-view');
    const w = weights(value), all = w.total[0];
    const stats = functionWeights(w);
    const rows = [];
    for (let f = 0; f < F; f++) {
      if (stats.total[f] > 0 && (!matchFrame || matchFrame[f])) rows.push(f);
    }
    const key = functionSort === 'self' ? stats.self : stats.total;
    rows.sort((a, b) => key[b] - key[a] || stats.total[b] - stats.total[a] || (frameName[a] < frameName[b] ? -1 : 1));
    if (!rows.length) {
      view.innerHTML = '<p class="empty">' + (search ? 'No function matches “' + esc(search) + '”.'
        : 'No ' + esc(valueName(value)) + ' in this profile: no functions to list.') + '</p>';
      return;
    }
    const html = ['<p class="hint">By ', esc(valueName(value)), ': self is a function’s own weight ',
      '(its frames at the top of a stack), total the weight of the stacks it is in. ',
      plural(rows.length, 'function', 'functions'), search ? ' match “' + esc(search) + '”' : '',
      '. Click one for its callers and callees.</p><table class="functions"><thead><tr><th>function</th>',
      '<th class="n sort" data-sort="self">self', functionSort === 'self' ? ' ▾' : '', '</th><th class="n">%</th>',
      '<th class="n sort" data-sort="total">total', functionSort === 'total' ? ' ▾' : '', '</th><th class="n">%</th>',
      '<th></th></tr></thead><tbody>'];
    for (const f of rows.slice(0, functionLimit)) {
      html.push('<tr class="clickable', f === selected ? ' selected' : '', '" data-f="', f, '"><td class="name">',
        esc(describeFrame(f)), '</td><td class="n">', fmt(stats.self[f]), '</td><td class="n">',
        share(stats.self[f], all), '</td><td class="n">', fmt(stats.total[f]), '</td><td class="n">',
        share(stats.total[f], all), '</td><td><span class="bar" style="width:',
        (all > 0 ? 80 * stats.total[f] / all : 0).toFixed(1), 'px"></span></td></tr>');
    }
    html.push('</tbody></table>');
    if (rows.length > functionLimit) {
      html.push('<p class="more"><button type="button" data-more="functions">Show ',
        Math.min(100, rows.length - functionLimit), ' more</button> (',
        count(rows.length - functionLimit), ' lighter functions not shown)</p>');
    }
    view.innerHTML = html.join('');
  }

  function initFunctions() {
    $('functions-view').addEventListener('click', event => {
      const sort = event.target.closest('[data-sort]');
      if (sort) { functionSort = sort.dataset.sort; drawFunctions(); return; }
      if (event.target.closest('[data-more]')) { functionLimit += 100; drawFunctions(); return; }
      const row = event.target.closest('tr[data-f]');
      if (row) select(+row.dataset.f);
    });
    $('neighbours-view').addEventListener('click', event => {
      const row = event.target.closest('tr[data-f]');
      if (row) select(+row.dataset.f);
    });
  }

  function select(f) {
    selected = f;
    drawNeighbours();
    for (const row of document.querySelectorAll('#functions-view tr[data-f]')) {
      row.classList.toggle('selected', +row.dataset.f === f);
    }
  }

  // Callers and callees of frame f, each stack counted once per caller (callee) however
  // often f recurs in it.
  function neighbours(f, w) {
    const callers = new Map(), callees = new Map();
    const activeCallers = new Map(), activeCallees = new Map();
    let self = 0, total = 0, activeSelf = 0;
    const path = [];
    const add = (map, key, x) => map.set(key, (map.get(key) || 0) + x);
    function leave(n) {
      const parent = nodeParent[n], parentFrame = parent > 0 ? nodeFrame[parent] : -1;
      if (nodeFrame[n] === f) { add(activeCallers, parentFrame, -1); activeSelf--; }
      if (parentFrame === f) add(activeCallees, nodeFrame[n], -1);
    }
    for (let n = 1; n < N; n++) {
      const d = nodeDepth[n];
      while (path.length >= d) leave(path.pop());
      const parent = nodeParent[n], parentFrame = parent > 0 ? nodeFrame[parent] : -1;
      if (nodeFrame[n] === f) {
        if (!activeCallers.get(parentFrame)) add(callers, parentFrame, w.total[n]);
        add(activeCallers, parentFrame, 1);
        if (!activeSelf) total += w.total[n];
        activeSelf++;
        self += w.self[n];
      }
      if (parentFrame === f) {
        if (!activeCallees.get(nodeFrame[n])) add(callees, nodeFrame[n], w.total[n]);
        add(activeCallees, nodeFrame[n], 1);
      }
      path.push(n);
    }
    return { callers, callees, self, total };
  }

  function drawNeighbours() {
    const view = $('neighbours-view');
    if (selected < 0) {
      view.innerHTML = '<h3>Callers and callees</h3><p class="empty">No function chosen: click one in the ' +
        'table above or in the flamegraph to see who calls it and what it calls.</p>';
      return;
    }
    const w = weights(value), n = neighbours(selected, w);
    function table(title, map, none) {
      const rows = Array.from(map.entries()).filter(e => e[1] > 0).sort((a, b) => b[1] - a[1]);
      const html = ['<div><h3>', title, '</h3>'];
      if (!rows.length) {
        html.push('<p class="empty">', none, '</p></div>');
        return html.join('');
      }
      html.push('<table><thead><tr><th>function</th><th class="n">', esc(valueName(value)),
        '</th><th class="n">% of its total</th></tr></thead><tbody>');
      for (const [f, x] of rows.slice(0, 200)) {
        const name = f < 0 ? '(none: the root of its stacks)' : describeFrame(f);
        html.push('<tr', f >= 0 ? ' class="clickable" data-f="' + f + '"' : '', '><td class="name">', esc(name),
          '</td><td class="n">', fmt(x), '</td><td class="n">', share(x, n.total), '</td></tr>');
      }
      html.push('</tbody></table>');
      if (rows.length > 200) html.push('<p class="note">', count(rows.length - 200), ' more not shown.</p>');
      html.push('</div>');
      return html.join('');
    }
    const name = esc(frameName[selected]);
    view.innerHTML = '<h3>Callers and callees of <code>' + name + '</code></h3><p>' + fmt(n.total) + ' ' +
      esc(valueName(value)) + ' in all (' + share(n.total, w.total[0]) + '), ' + fmt(n.self) + ' in itself.</p>' +
      '<div class="columns">' +
      table('Called by', n.callers, 'Nothing calls it in this profile.') +
      table('Calls', n.callees, 'It calls nothing: its weight is all its own.') + '</div>';
  }

  // ---- Top-down: the call tree ----
  const expanded = new Set();
  const TREE_ROWS = 3000, TREE_CHILDREN = 100;
  function visible(n, w) { return w.total[n] > 0 && (!aboveMatch || aboveMatch[n] || underMatch[n]); }
  function childrenOf(n, w) {
    const list = [];
    for (let c = firstChild[n]; c >= 0; c = nextSibling[c]) if (visible(c, w)) list.push(c);
    list.sort((a, b) => w.total[b] - w.total[a]);
    return list;
  }
  // Opens n, and below it each node that is its parent's only child, up to `levels`.
  function expandChain(n, w, levels) {
    for (let i = 0; i < levels; i++) {
      expanded.add(n);
      const children = childrenOf(n, w);
      if (children.length !== 1) return;
      n = children[0];
    }
  }
  function treeIndent(depth) {
    return 'padding-left:' + (4 + Math.min(depth - 1, 40) * 12) + 'px';
  }
  function drawTopDown() {
    const view = $('top-down-view');
    const w = weights(value), all = w.total[0];
    if (!(all > 0)) {
      view.innerHTML = '<p class="empty">No ' + esc(valueName(value)) + ' in this profile: the tree is empty.</p>';
      return;
    }
    if (search && !aboveMatch[0]) {
      view.innerHTML = '<p class="empty">No stack goes through a function matching “' + esc(search) + '”.</p>';
      return;
    }
    const rows = [];
    let cut = false;
    function emit(n) {
      const children = childrenOf(n, w);
      for (let i = 0; i < children.length; i++) {
        if (rows.length >= TREE_ROWS) { cut = true; return; }
        if (i === TREE_CHILDREN) {
          rows.push('<tr><td class="note" style="' + treeIndent(nodeDepth[children[i]]) + '">' +
            count(children.length - i) + ' lighter callees not shown</td><td></td><td></td><td></td></tr>');
          break;
        }
        const c = children[i], open = expanded.has(c), leaf = firstChild[c] < 0 || childrenOf(c, w).length === 0;
        const d = nodeDepth[c], f = nodeFrame[c];
        const hit = matchFrame && matchFrame[f] ? ' style="background:#f3dcf8"' : '';
        rows.push('<tr class="clickable" data-n="' + c + '"' + hit + '><td class="name" style="' + treeIndent(d) +
          '"><span class="toggle">' + (leaf ? '' : open ? '▾' : '▸') + '</span>' +
          (d > 41 ? '<span class="depth">' + d + '</span>' : '') + esc(describeFrame(f)) + '</td><td class="n">' +
          fmt(w.total[c]) + '</td><td class="n">' + share(w.total[c], all) + '</td><td class="n">' +
          fmt(w.self[c]) + '</td></tr>');
        if (open && !leaf) emit(c);
      }
    }
    emit(0);
    view.innerHTML = '<p class="hint">By ' + esc(valueName(value)) + filterNote() +
      ': each row a function called from the row above it; click a row to open or close it (a chain of ' +
      'single callees opens at once).</p><table class="tree"><thead><tr><th>function</th><th class="n">total</th>' +
      '<th class="n">%</th><th class="n">self</th></tr></thead><tbody>' + rows.join('') + '</tbody></table>' +
      (cut ? '<p class="note">Only the first ' + count(TREE_ROWS) + ' rows are shown: close some to see others.</p>' : '');
  }
  function initTopDown() {
    $('top-down-view').addEventListener('click', event => {
      const row = event.target.closest('tr[data-n]');
      if (!row) return;
      const n = +row.dataset.n;
      if (expanded.has(n)) expanded.delete(n); else expandChain(n, weights(value), 500);
      select(nodeFrame[n]);
      drawTopDown();
    });
  }
  // Opens the heaviest path from the root while one callee holds most of its caller.
  function resetTopDown() {
    expanded.clear();
    const w = weights(value);
    let n = 0;
    for (let i = 0; i < 40; i++) {
      expanded.add(n);
      const children = childrenOf(n, w);
      if (!children.length || w.total[children[0]] * 2 < w.total[n]) return;
      n = children[0];
    }
  }

  // ---- Bottom-up: each function's own weight, and the callers it came through ----
  let bottomRoots = [], bottomLimit = 100;
  function bottomUpRoots() {
    const w = weights(value);
    const byFrame = new Map();
    for (let n = 1; n < N; n++) {
      if (!(w.self[n] > 0) || (underMatch && !underMatch[n])) continue;
      let row = byFrame.get(nodeFrame[n]);
      if (!row) { row = { frame: nodeFrame[n], nodes: [], weights: [], weight: 0, depth: 1, open: false, children: null }; byFrame.set(nodeFrame[n], row); }
      row.nodes.push(n); row.weights.push(w.self[n]); row.weight += w.self[n];
    }
    bottomRoots = Array.from(byFrame.values()).sort((a, b) => b.weight - a.weight);
    bottomLimit = 100;
  }
  function bottomUpChildren(row) {
    if (row.children) return row.children;
    const byFrame = new Map();
    for (let i = 0; i < row.nodes.length; i++) {
      const parent = nodeParent[row.nodes[i]];
      if (parent <= 0) continue;
      let child = byFrame.get(nodeFrame[parent]);
      if (!child) { child = { frame: nodeFrame[parent], nodes: [], weights: [], weight: 0, depth: row.depth + 1, open: false, children: null }; byFrame.set(nodeFrame[parent], child); }
      child.nodes.push(parent); child.weights.push(row.weights[i]); child.weight += row.weights[i];
    }
    row.children = Array.from(byFrame.values()).sort((a, b) => b.weight - a.weight);
    return row.children;
  }
  function drawBottomUp() {
    const view = $('bottom-up-view');
    const all = weights(value).total[0];
    if (!bottomRoots.length) {
      view.innerHTML = '<p class="empty">' + (search ? 'No stack goes through a function matching “' + esc(search) + '”.'
        : 'No ' + esc(valueName(value)) + ' in this profile: nothing to list.') + '</p>';
      return;
    }
    const rows = [], index = [];
    let cut = false;
    function emit(list, limit) {
      for (let i = 0; i < list.length && i < limit; i++) {
        if (rows.length >= TREE_ROWS) { cut = true; return; }
        const row = list[i], children = row.open ? bottomUpChildren(row) : null;
        const leaf = row.children ? row.children.length === 0 : false;
        index.push(row);
        rows.push('<tr class="clickable" data-r="' + (index.length - 1) + '"><td class="name" style="' +
          treeIndent(row.depth) + '"><span class="toggle">' + (leaf ? '' : row.open ? '▾' : '▸') + '</span>' +
          (row.depth > 41 ? '<span class="depth">' + row.depth + '</span>' : '') + esc(describeFrame(row.frame)) +
          '</td><td class="n">' + fmt(row.weight) + '</td><td class="n">' + share(row.weight, all) + '</td></tr>');
        if (children) emit(children, TREE_CHILDREN);
      }
    }
    emit(bottomRoots, bottomLimit);
    drawBottomUp.index = index;
    view.innerHTML = '<p class="hint">By ' + esc(valueName(value)) + filterNote() +
      ': the functions by their own weight; open one to see the callers it came through, and theirs.</p>' +
      '<table class="tree"><thead><tr><th>function ← caller ← …</th><th class="n">self</th><th class="n">%</th></tr></thead><tbody>' +
      rows.join('') + '</tbody></table>' +
      (bottomRoots.length > bottomLimit ? '<p class="more"><button type="button" data-more="bottom">Show ' +
        Math.min(100, bottomRoots.length - bottomLimit) + ' more</button> (' + count(bottomRoots.length - bottomLimit) +
        ' lighter functions not shown)</p>' : '') +
      (cut ? '<p class="note">Only the first ' + count(TREE_ROWS) + ' rows are shown.</p>' : '');
  }
  function initBottomUp() {
    $('bottom-up-view').addEventListener('click', event => {
      if (event.target.closest('[data-more]')) { bottomLimit += 100; drawBottomUp(); return; }
      const tr = event.target.closest('tr[data-r]');
      if (!tr) return;
      const row = drawBottomUp.index[+tr.dataset.r];
      row.open = !row.open;
      select(row.frame);
      drawBottomUp();
    });
  }

  // ---- Processes ----
  function drawProcesses() {
    const view = $('processes-view');
    // The main values (and the one chosen).
    const shown = flameValues.filter(v => totals[v] !== 0 && (values[v].main || v === value));
    const sums = pids.map(() => new Float64Array(values.length));
    const any = new Uint8Array(pids.length);
    for (const v of shown) eachValue(v, (i, x) => { if (kept(i)) { sums[samplePid[i]][v] += x; any[samplePid[i]] = 1; } });
    const heapProcesses = profile.heap ? profile.heap.processes : [];
    const byPid = new Map(heapProcesses.map(p => [p.pid, p]));
    const merged = profile.mergedProcesses;
    const html = ['<p class="hint">The profile keeps no thread ids: its stacks are split by process, not ',
      'by thread.', filterNote(), '</p>'];
    const order = pids.map((_, i) => i).filter(i => any[i] || !search)
      .sort((a, b) => sums[b][value] - sums[a][value] || pids[a] - pids[b]);
    if (!order.length) {
      view.innerHTML = html.join('') + '<p class="empty">' + (search ? 'No process has a stack through “' +
        esc(search) + '”.' : 'No stacks: no process to list.') + '</p>';
      return;
    }
    html.push('<table><thead><tr><th>process</th>');
    for (const v of shown) html.push('<th class="n">', esc(valueName(v)), '</th>');
    if (heapProcesses.length) html.push('<th class="n">peak live</th><th class="n">live at the end</th>');
    html.push('<th></th></tr></thead><tbody>');
    const all = totals[value];
    for (const i of order) {
      const pid = pids[i];
      const name = pid === 0 && merged > 0 ? 'exited processes (' + count(merged) + ') counted together' : 'pid ' + pid;
      html.push('<tr><td class="nowrap">', esc(name), '</td>');
      for (const v of shown) {
        html.push('<td class="n">', fmt(sums[i][v], v), ' <span class="note">', share(sums[i][v], totals[v]), '</span></td>');
      }
      const heap = byPid.get(pid);
      if (heapProcesses.length) {
        html.push('<td class="n">', heap ? bytes(heap.peak) : '', '</td><td class="n">', heap ? bytes(heap.live) : '', '</td>');
      }
      html.push('<td><span class="bar" style="width:', (all > 0 ? 120 * sums[i][value] / all : 0).toFixed(1),
        'px"></span></td></tr>');
    }
    html.push('</tbody></table>');
    if (pids.length === 1) html.push('<p class="note">One process.</p>');
    view.innerHTML = html.join('');
  }

  function legend(items) {
    return '<p class="legend">' + items.map(([c, text]) =>
      '<span><span class="swatch" style="background:' + c + '"></span>' + text + '</span>').join('') + '</p>';
  }

  // ---- Heap: the stacks that hold the most, leaks, sizes and lifetimes ----
  // (memory over time is drawn by the writer: html/charts.rs)
  const heapKinds = {
    leakedBytes: valueIndex('leaked_bytes'), leakedBlocks: valueIndex('leaked_blocks'),
    leakedAge: valueIndex('leaked_age'), peakBytes: valueIndex('peak_bytes'),
  };

  function drawMemory() {
    const view = $('memory-view');
    const html = [];
    // What the model has of each stack: its live bytes at the peak and at the end.
    html.push('<h3>The stacks that hold the most</h3><p class="note">The profile records the heap\'s totals over ',
      'time, not each stack\'s: a stack\'s live bytes are known at the peak (when its process\'s live bytes ',
      'were highest) and at the end.', filterNote(), '</p>');
    const none = new Float64Array(S);
    const peak = heapKinds.peakBytes >= 0 ? column(heapKinds.peakBytes) : none;
    const end = heapKinds.leakedBytes >= 0 ? column(heapKinds.leakedBytes) : none;
    const rows = [];
    for (let i = 0; i < S; i++) {
      if ((peak[i] > 0 || end[i] > 0) && kept(i)) rows.push(i);
    }
    rows.sort((a, b) => Math.max(peak[b], end[b]) - Math.max(peak[a], end[a]));
    if (!rows.length) {
      html.push('<p class="empty">No stack held memory at the peak or at the end.</p>');
    } else {
      const most = Math.max(peak[rows[0]], end[rows[0]]);
      html.push('<table><thead><tr><th class="n">at the peak</th><th class="n">at the end</th><th></th>',
        '<th>allocated at</th><th>process</th></tr></thead><tbody>');
      for (const i of rows.slice(0, 10)) {
        html.push('<tr><td class="n">', bytes(peak[i]), '</td><td class="n">', bytes(end[i]),
          '</td><td><span class="bar" style="width:', (60 * peak[i] / most).toFixed(1), 'px"></span><br>',
          '<span class="bar alt" style="width:', (60 * end[i] / most).toFixed(1), 'px"></span></td>',
          stackCell(sampleNode[i]), '<td>', pids[samplePid[i]], '</td></tr>');
      }
      html.push('</tbody></table>', legend([['#e0793c', 'live at the peak'], ['#4a7fd0', 'live at the end']]));
    }
    view.innerHTML = html.join('');
  }

  let leakLimit = 50;
  function drawLeaks() {
    const view = $('leaks-view');
    if (heapKinds.leakedBlocks < 0 || heapKinds.leakedBytes < 0) {
      view.innerHTML = '<p class="empty">This profile counts no leaked blocks.</p>';
      return;
    }
    const blocks = column(heapKinds.leakedBlocks), leaked = column(heapKinds.leakedBytes);
    const ages = heapKinds.leakedAge >= 0 ? column(heapKinds.leakedAge) : null;
    const rows = [];
    let allBlocks = 0, allBytes = 0, allAge = 0;
    for (let i = 0; i < S; i++) {
      if (blocks[i] > 0 && kept(i)) {
        rows.push(i);
        allBlocks += blocks[i]; allBytes += leaked[i]; allAge += ages ? ages[i] : 0;
      }
    }
    if (!rows.length) {
      view.innerHTML = '<p class="empty">' + (search ? 'No leaks among the stacks through “' + esc(search) + '”.'
        : 'No leaks: every block allocated while tracing was freed by the end.') + '</p>';
      return;
    }
    rows.sort((a, b) => leaked[b] - leaked[a] || blocks[b] - blocks[a]);
    const html = ['<p><strong>', bytes(allBytes), ' leaked in ', plural(allBlocks, 'block', 'blocks'), '</strong> from ',
      plural(rows.length, 'stack', 'stacks'), ages ? ', ' + nanoseconds(allAge / allBlocks * 1e3) + ' old on average' : '',
      ': blocks still live when tracing ended, by where they were allocated.', filterNote(), '</p>',
      '<table><thead><tr><th class="n">leaked</th><th class="n">blocks</th><th class="n">mean age</th>',
      '<th>allocated at</th><th>process</th></tr></thead><tbody>'];
    for (const i of rows.slice(0, leakLimit)) {
      html.push('<tr><td class="n">', bytes(leaked[i]), '</td><td class="n">', count(blocks[i]), '</td><td class="n">',
        ages ? nanoseconds(ages[i] / blocks[i] * 1e3) : '', '</td>', stackCell(sampleNode[i]), '<td>',
        pids[samplePid[i]], '</td></tr>');
    }
    html.push('</tbody></table>');
    if (rows.length > leakLimit) {
      html.push('<p class="more"><button type="button" data-more="leaks">Show ', Math.min(50, rows.length - leakLimit),
        ' more</button> (', count(rows.length - leakLimit), ' smaller leaks not shown)</p>');
    }
    view.innerHTML = html.join('');
  }

  // A histogram of buckets `prefix`0.. (bucket k: values of bit length k), as rows of bars.
  function drawHistogram(viewId, prefix, bucketLabel, what, none, after) {
    const view = $(viewId);
    const first = valueIndex(prefix + '0');
    const buckets = profile.heap.buckets;
    if (first < 0) { view.innerHTML = '<p class="empty">' + none + '</p>'; return; }
    const sums = new Float64Array(buckets);
    for (let k = 0; k < buckets; k++) eachValue(first + k, (i, x) => { if (kept(i)) sums[k] += x; });
    let lo = -1, hi = -1, all = 0, most = 0;
    for (let k = 0; k < buckets; k++) {
      if (sums[k] > 0) { if (lo < 0) lo = k; hi = k; all += sums[k]; most = Math.max(most, sums[k]); }
    }
    if (lo < 0) {
      view.innerHTML = '<p class="empty">' + none + (search ? ' among the stacks through “' + esc(search) + '”' : '') + '.</p>';
      return;
    }
    const html = ['<p>', plural(all, what[0], what[1]), ' ', what[2], filterNote(), '.', after ? ' ' + after : '', '</p>',
      '<table><thead><tr><th>', what[3], '</th><th class="n">', what[1], '</th><th class="n">%</th><th></th></tr></thead><tbody>'];
    for (let k = lo; k <= hi; k++) {
      html.push('<tr><td>', esc(bucketLabel(k, buckets)), '</td><td class="n">', count(sums[k]), '</td><td class="n">',
        share(sums[k], all), '</td><td><span class="bar" style="width:', (300 * sums[k] / most).toFixed(1),
        'px"></span></td></tr>');
    }
    html.push('</tbody></table>');
    view.innerHTML = html.join('');
  }
  function sizeLabel(k, buckets) {
    if (k === 0) return '0 B';
    const from = Math.pow(2, k - 1);
    if (k === buckets - 1) return bytes(from) + ' or more';
    const to = Math.pow(2, k) - 1;
    return from === to ? bytes(from) : to < 1024 ? from + '–' + to + ' B' : bytes(from) + ' to under ' + bytes(to + 1);
  }
  function lifetimeLabel(k, buckets) {
    if (k === 0) return 'under 1 ns';
    const from = Math.pow(2, k - 1);
    if (k === buckets - 1) return nanoseconds(from) + ' or more';
    return nanoseconds(from) + ' to under ' + nanoseconds(2 * from);
  }
  function drawSizes() {
    drawHistogram('sizes-view', 'size_bucket_', sizeLabel,
      ['allocation', 'allocations', 'by size (in powers of two)', 'size'], 'No allocation sizes were counted');
  }
  function drawLifetimes() {
    let after = '';
    if (heapKinds.leakedBlocks >= 0) {
      let live = 0;
      eachValue(heapKinds.leakedBlocks, (i, x) => { if (kept(i)) live += x; });
      if (live > 0) after = plural(live, 'block was', 'blocks were') + ' still live at the end (see Leaks).';
    }
    const threshold = profile.heap.temporaryMs;
    if (threshold > 0) after += ' Blocks freed within ' + nanoseconds(threshold * 1e6) + ' count as temporary.';
    drawHistogram('lifetimes-view', 'lifetime_bucket_', lifetimeLabel,
      ['freed block', 'freed blocks', 'by how long they lived, from allocation to free', 'lifetime'],
      'No block was freed', after);
  }

  // ---- The controls ----
  function drawMatches() {
    const out = $('matches');
    if (!search) { out.textContent = ''; return; }
    const w = weights(value);
    let matched = 0;
    for (let n = 1; n < N; n++) {
      if (matchFrame[nodeFrame[n]] && !underMatch[nodeParent[n]]) matched += w.total[n];
    }
    let functions = 0;
    for (let f = 0; f < F; f++) functions += matchFrame[f];
    out.textContent = functions ? plural(functions, 'function matches', 'functions match') + ': ' + fmt(matched) + ' ' +
      valueName(value) + ' (' + share(matched, w.total[0]) + ')' : 'no function matches';
  }

  // Each view drawn on its own: one that fails says so, and the others are drawn.
  function draw(name, fn) {
    try { fn(); } catch (error) {
      const view = $(name);
      if (view) view.innerHTML = '<p class="bad">This view could not be drawn: ' + esc(error && error.message) + '</p>';
      setTimeout(() => { throw error; });
    }
  }
  function drawWeighted() {
    draw('flame', drawFlame);
    draw('matches', drawMatches);
    draw('functions-view', drawFunctions);
    draw('neighbours-view', drawNeighbours);
    draw('top-down-view', drawTopDown);
    draw('bottom-up-view', () => { bottomUpRoots(); drawBottomUp(); });
    draw('processes-view', drawProcesses);
  }
  function drawFiltered() {
    if (profile.heap) {
      draw('memory-view', drawMemory);
      draw('leaks-view', drawLeaks);
      draw('sizes-view', drawSizes);
      draw('lifetimes-view', drawLifetimes);
    }
  }

  function initToolbar() {
    const select = $('value');
    select.innerHTML = flameValues.map(v => '<option value="' + v + '"' + (v === value ? ' selected' : '') +
      (totals[v] === 0 ? ' disabled' : '') + '>' + esc(valueName(v)) + (totals[v] === 0 ? ' (none)' : ' — ' +
      esc(fmt(totals[v], v))) + '</option>').join('');
    select.addEventListener('change', () => {
      value = +select.value;
      resetTopDown();
      drawWeighted();
    });
    // Applied as one types (after a pause), and at once on Enter or when the box loses focus.
    let typing = 0;
    const box = $('search');
    function apply() {
      clearTimeout(typing);
      if (box.value.trim() === search) return;
      setSearch(box.value);
      printed = false;
      functionLimit = 100;
      leakLimit = 50;
      resetTopDown();
      drawWeighted();
      drawFiltered();
    }
    box.addEventListener('input', () => {
      clearTimeout(typing);
      typing = setTimeout(apply, 250);
    });
    box.addEventListener('change', apply);
    box.addEventListener('search', apply);
    document.addEventListener('click', event => {
      if (event.target.closest('[data-more="leaks"]')) { leakLimit += 50; draw('leaks-view', drawLeaks); }
    });
  }

  initToolbar();
  initFlame();
  initFunctions();
  initTopDown();
  initBottomUp();
  resetTopDown();
  drawWeighted();
  drawFiltered();
  document.body.dataset.drawnMs = (performance.now() - started).toFixed(0);
})();
