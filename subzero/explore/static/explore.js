// SubZero explorer: one plotly view per array of the run; a click or a brushed
// rectangle on a view traces it (POST /api/trace) and every array it reaches gets an
// overlay.  Images and overlays are PNGs of the visible window at screen resolution,
// re-requested on every zoom.  Errors from the API are shown, never swallowed.
"use strict";

const explorer = {
  run: null, arrays: {}, views: {}, selected: null, direction: "backward", exact: false,
  trace: null, lastQuery: null, lastLatency: null, busy: false, traces: 0,
};
window.explorer = explorer;

const MAIN = "@main";
const $ = (sel) => document.querySelector(sel);

// -- API -------------------------------------------------------------------------------
function showError(msg) {
  const box = $("#error");
  box.textContent = msg;
  box.hidden = false;
}
function clearError() { $("#error").hidden = true; }

async function api(path, options) {
  let resp;
  try {
    resp = await fetch(path, options);
  } catch (e) {
    const msg = `cannot reach the explorer's server (${path}): ${e.message}`;
    showError(msg);
    throw new Error(msg);
  }
  if (!resp.ok) {
    let msg = `${resp.status} ${resp.statusText}`;
    try { msg = (await resp.json()).error || msg; } catch (e) { /* not JSON */ }
    msg = `${path.split("?")[0]}: ${msg}`;
    showError(msg);
    throw new Error(msg);
  }
  return resp;
}
explorer.api = api;

function blobToDataURL(blob) {
  return new Promise((ok, fail) => {
    const r = new FileReader();
    r.onload = () => ok(r.result);
    r.onerror = () => fail(r.error);
    r.readAsDataURL(blob);
  });
}

async function decoded(src) {       // the image decoded, so that drawing it costs nothing more
  const img = new Image();
  img.src = src;
  await img.decode();
  return src;
}

// -- views ------------------------------------------------------------------------------
function fullRegion(info) { return [0, info.view[0], 0, info.view[1]]; }

function squareCells(info) {
  const [r, c] = info.view;
  return r / c < 8 && c / r < 8;
}

function makeView(id, name, parent, width, height) {
  const info = explorer.arrays[name];
  const box = document.createElement("div");
  box.className = "view";
  box.dataset.view = id;
  const title = document.createElement("div");
  title.className = "title";
  const dims = info.dims.length ? ` [${info.dims.join(", ")}]` : "";
  const proj = info.projection ? " · projected" : "";
  title.innerHTML = `<b></b> <span class="count"></span><br><span class="shape"></span> <span class="op"></span>`;
  title.querySelector("b").textContent = name;
  title.querySelector(".shape").textContent = `${info.shape.join("×")} ${info.dtype}${dims}${proj}`;
  title.querySelector(".op").textContent = info.operator ? `· ${info.operator}(${info.inputs.join(", ")})` : "· input";
  title.title = info.projection ? `projection: ${info.projection}` : "";
  const plot = document.createElement("div");
  plot.className = "plot";
  title.style.width = `${width - 12}px`;
  box.append(title, plot);
  parent.append(box);
  const view = { id, name, info, box, title, gd: plot, width, height, region: fullRegion(info),
                 base: null, overlay: null, seq: 0 };
  explorer.views[id] = view;
  const [r0, r1, c0, c1] = view.region;
  const square = squareCells(info);
  const layout = {
    width, height, margin: { l: 42, r: 6, t: 4, b: 24 }, dragmode: false, hovermode: false,
    showlegend: false, paper_bgcolor: "#fff", plot_bgcolor: "#f1f5f9",
    xaxis: { range: [c0 - 0.5, c1 - 0.5], showgrid: false, zeroline: false, constrain: "domain",
             tickfont: { size: 9 }, nticks: width < 200 ? 3 : 6 },
    yaxis: { range: [r1 - 0.5, r0 - 0.5], showgrid: false, zeroline: false, constrain: "domain",
             tickfont: { size: 9 }, ...(square ? { scaleanchor: "x" } : {}) },
    images: [],
  };
  Plotly.newPlot(plot, [], layout, { displayModeBar: false, scrollZoom: false, doubleClick: false,
                                      responsive: false, showTips: false });
  plot.style.position = "relative";
  view.clip = document.createElement("div");
  view.clip.className = "overlay";
  view.clip.hidden = true;
  view.img = document.createElement("img");
  view.img.alt = `lineage on ${name}`;
  view.clip.append(view.img);
  plot.append(view.clip);
  plot.on("plotly_relayout", () => placeOverlay(view));
  attachMouse(view);
  return view;
}

function axes(view) {
  const fl = view.gd._fullLayout;
  return { xa: fl.xaxis, ya: fl.yaxis };
}

// the visible window of a view, in view cells (half-open), and its size in pixels
function visible(view) {
  const { xa, ya } = axes(view);
  const [vr, vc] = view.info.view;
  const xs = xa.range.slice().sort((a, b) => a - b), ys = ya.range.slice().sort((a, b) => a - b);
  const clip = (v, n) => Math.max(0, Math.min(n, v));
  let c0 = clip(Math.floor(xs[0] + 0.5), vc), c1 = clip(Math.ceil(xs[1] + 0.5), vc);
  let r0 = clip(Math.floor(ys[0] + 0.5), vr), r1 = clip(Math.ceil(ys[1] + 0.5), vr);
  if (c1 <= c0) { c1 = Math.min(vc, c0 + 1); c0 = c1 - 1; }
  if (r1 <= r0) { r1 = Math.min(vr, r0 + 1); r0 = r1 - 1; }
  const dpr = window.devicePixelRatio || 1;
  const size = [Math.max(1, Math.round(ya._length * dpr)), Math.max(1, Math.round(xa._length * dpr))];
  return { region: [r0, r1, c0, c1], size };
}

function overlaySize(view, vis) {
  if (!explorer.exact) return vis.size;
  const [r0, r1, c0, c1] = vis.region;
  return [r1 - r0, c1 - c0];
}

function imageItem(src, win) {
  return { source: src, xref: "x", yref: "y", x: win.cols[0] - 0.5, y: win.rows[0] - 0.5,
           sizex: win.cols[1] - win.cols[0], sizey: win.rows[1] - win.rows[0],
           sizing: "stretch", xanchor: "left", yanchor: "top", layer: "below" };
}

// The base image is a plotly layout image; the overlay is an <img> over the plot area
// (clipped to it), placed from the axes' mapping: changing it costs no plotly redraw.
function draw(view) {
  const images = view.base ? [imageItem(view.base.src, view.base.win)] : [];
  return Plotly.relayout(view.gd, { images }).then(() => placeOverlay(view));
}

function placeOverlay(view) {
  const ov = view.overlay;
  if (!ov) { view.clip.hidden = true; view.img.removeAttribute("src"); return; }
  const { xa, ya } = axes(view);
  Object.assign(view.clip.style, { left: `${xa._offset}px`, top: `${ya._offset}px`,
                                   width: `${xa._length}px`, height: `${ya._length}px` });
  const x0 = xa.d2p(ov.win.cols[0] - 0.5), x1 = xa.d2p(ov.win.cols[1] - 0.5);
  const y0 = ya.d2p(ov.win.rows[0] - 0.5), y1 = ya.d2p(ov.win.rows[1] - 0.5);
  Object.assign(view.img.style, { left: `${Math.min(x0, x1)}px`, top: `${Math.min(y0, y1)}px`,
                                  width: `${Math.abs(x1 - x0)}px`, height: `${Math.abs(y1 - y0)}px` });
  if (view.img.getAttribute("src") !== ov.src) view.img.src = ov.src;
  view.clip.hidden = false;
}

// (re)load a view's image, and its overlay when the current trace reaches it
async function load(view) {
  const seq = ++view.seq;
  const vis = visible(view);
  const q = `region=${vis.region.join(",")}&size=${vis.size.join(",")}`;
  const jobs = [api(`/api/image/${encodeURIComponent(view.name)}?${q}`)];
  const t = explorer.trace;
  const reached = t && t.arrays[view.name];
  if (reached) {
    const size = overlaySize(view, vis);
    jobs.push(api(`/api/overlay/${t.id}/${encodeURIComponent(view.name)}?region=${vis.region.join(",")}&size=${size.join(",")}`));
  }
  const resps = await Promise.all(jobs);
  const parts = await Promise.all(resps.map(async (r) => ({
    src: await decoded(await blobToDataURL(await r.blob())),
    win: JSON.parse(r.headers.get("X-SubZero-Window")) })));
  if (seq !== view.seq) return;                 // a newer zoom took over
  view.base = parts[0];
  // a trace that answered meanwhile has placed its own overlay (each is placed by its own
  // window, so either is drawn where it belongs): keep the newer one
  if (explorer.trace === t) view.overlay = reached ? { ...parts[1], trace: t.id } : null;
  await draw(view);
}

function setRange(view, region) {
  const [r0, r1, c0, c1] = region;
  return Plotly.relayout(view.gd, { "xaxis.range": [c0 - 0.5, c1 - 0.5], "yaxis.range": [r1 - 0.5, r0 - 0.5] })
    .then(() => load(view));
}

explorer.zoom = (id, region) => setRange(explorer.views[id], region);
explorer.reset = () => Promise.all(Object.values(explorer.views).map((v) => setRange(v, fullRegion(v.info))));
explorer.zoomToAnswer = () => {
  const t = explorer.trace;
  if (!t) return Promise.resolve();
  return Promise.all(Object.values(explorer.views).map((v) => {
    const a = t.arrays[v.name];
    if (!a || !a.bounds || a.entire || v.name === t.start) return null;
    const [lo, hi] = a.bounds;
    const nd = lo.length;
    const region = nd === 0 ? fullRegion(v.info)
      : nd === 1 ? [0, 1, lo[0], hi[0]] : [lo[nd - 2], hi[nd - 2], lo[nd - 1], hi[nd - 1]];
    const pad = (a0, a1, n) => { const p = Math.max(2, Math.round((a1 - a0) * 0.1));
                                 return [Math.max(0, a0 - p), Math.min(n, a1 + p)]; };
    const [r0, r1] = pad(region[0], region[1], v.info.view[0]);
    const [c0, c1] = pad(region[2], region[3], v.info.view[1]);
    return setRange(v, [r0, r1, c0, c1]);
  }));
};

// screen position (client pixels) of the centre of view cell (row, col): the plot's axis mapping
explorer.screenPos = (id, row, col) => {
  const view = explorer.views[id];
  const { xa, ya } = axes(view);
  const rect = view.gd.getBoundingClientRect();
  return { x: rect.left + xa._offset + xa.d2p(col), y: rect.top + ya._offset + ya.d2p(row) };
};

function cellAt(view, ev) {
  const { xa, ya } = axes(view);
  const rect = view.gd.getBoundingClientRect();
  const px = ev.clientX - rect.left - xa._offset, py = ev.clientY - rect.top - ya._offset;
  if (px < 0 || py < 0 || px > xa._length || py > ya._length) return null;
  const col = Math.round(xa.p2d(px)), row = Math.round(ya.p2d(py));
  const [vr, vc] = view.info.view;
  if (row < 0 || col < 0 || row >= vr || col >= vc) return null;
  return [row, col];
}

// -- mouse: click = one cell, drag = a rectangle, wheel = zoom, double click = whole -------
function attachMouse(view) {
  const gd = view.gd;
  let down = null, brush = null, hoverTimer = null, lastHover = null;
  gd.addEventListener("mousedown", (ev) => {
    if (ev.button !== 0) return;
    const cell = cellAt(view, ev);
    if (!cell) return;
    down = { x: ev.clientX, y: ev.clientY, cell };
    ev.preventDefault();
  }, true);
  window.addEventListener("mousemove", (ev) => {
    if (!down) return;
    if (!brush && Math.hypot(ev.clientX - down.x, ev.clientY - down.y) < 4) return;
    if (!brush) { brush = document.createElement("div"); brush.className = "brush"; document.body.append(brush); }
    Object.assign(brush.style, { left: `${Math.min(ev.clientX, down.x)}px`, top: `${Math.min(ev.clientY, down.y)}px`,
                                 width: `${Math.abs(ev.clientX - down.x)}px`, height: `${Math.abs(ev.clientY - down.y)}px` });
  }, true);
  window.addEventListener("mouseup", (ev) => {
    if (!down) return;
    const t0 = performance.now();
    const start = down;
    down = null;
    const dragged = brush !== null || Math.hypot(ev.clientX - start.x, ev.clientY - start.y) >= 4;
    if (brush) { brush.remove(); brush = null; }
    if (!dragged && ev.detail >= 2) return;     // the second click of a double click: the zoom's
    let box;
    if (!dragged) {
      const [r, c] = start.cell;
      box = [[r, r + 1], [c, c + 1]];
    } else {
      const end = cellAt(view, ev) || clampCell(view, ev);
      box = [[Math.min(start.cell[0], end[0]), Math.max(start.cell[0], end[0]) + 1],
             [Math.min(start.cell[1], end[1]), Math.max(start.cell[1], end[1]) + 1]];
    }
    runTrace(view.name, box, t0).catch(() => {});
  }, true);
  gd.addEventListener("mousemove", (ev) => {
    const cell = cellAt(view, ev);
    if (!cell || (lastHover && cell[0] === lastHover[0] && cell[1] === lastHover[1])) return;
    lastHover = cell;
    clearTimeout(hoverTimer);
    hoverTimer = setTimeout(() => showValue(view, cell), 40);
  });
  gd.addEventListener("wheel", (ev) => {
    const { xa, ya } = axes(view);
    const rect = gd.getBoundingClientRect();
    const px = ev.clientX - rect.left - xa._offset, py = ev.clientY - rect.top - ya._offset;
    if (px < 0 || py < 0 || px > xa._length || py > ya._length) return;
    ev.preventDefault();
    const f = ev.deltaY > 0 ? 1.25 : 0.8;
    const cx = xa.p2d(px), cy = ya.p2d(py);
    const [vr, vc] = view.info.view;
    const xr = xa.range.map((v) => cx + (v - cx) * f), yr = ya.range.map((v) => cy + (v - cy) * f);
    const full = Math.abs(xr[1] - xr[0]) > vc * 1.2 && Math.abs(yr[1] - yr[0]) > vr * 1.2;
    if (full) { setRange(view, fullRegion(view.info)); return; }
    Plotly.relayout(gd, { "xaxis.range": xr, "yaxis.range": yr });
    clearTimeout(view.wheelTimer);
    view.wheelTimer = setTimeout(() => load(view).catch(() => {}), 120);
  }, { passive: false });
  // plotly's drag layer swallows dblclick: the second click of a pair says it
  gd.addEventListener("click", (ev) => {
    if (ev.detail === 2) setRange(view, fullRegion(view.info)).catch(() => {});
  }, true);
}

function clampCell(view, ev) {
  const { xa, ya } = axes(view);
  const rect = view.gd.getBoundingClientRect();
  const px = Math.max(0, Math.min(xa._length, ev.clientX - rect.left - xa._offset));
  const py = Math.max(0, Math.min(ya._length, ev.clientY - rect.top - ya._offset));
  const [vr, vc] = view.info.view;
  return [Math.max(0, Math.min(vr - 1, Math.round(ya.p2d(py)))), Math.max(0, Math.min(vc - 1, Math.round(xa.p2d(px))))];
}

async function showValue(view, cell) {
  const v = await api(`/api/value/${encodeURIComponent(view.name)}?cell=${cell.join(",")}`).then((r) => r.json());
  const where = view.info.view[0] === 1 && view.info.shape.length < 2 ? `[${cell[1]}]` : `[${cell.join(", ")}]`;
  const labels = v.labels ? " · " + Object.entries(v.labels).map(([k, x]) => `${k}=${x}`).join(", ") : "";
  const sky = v.sky ? ` · ${v.sky} (ICRS)` : "";
  $("#hover").textContent = `hover: ${view.name}${where} = ${v.value}${v.projection ? " (max over the projected axes)" : ""}${labels}${sky}`;
}

// -- traces ------------------------------------------------------------------------------
async function runTrace(name, box, t0, locate) {
  clearError();
  explorer.busy = true;
  const views = {};
  for (const v of Object.values(explorer.views)) {
    const vis = visible(v);
    views[v.id] = { array: v.name, region: vis.region, size: overlaySize(v, vis) };
  }
  explorer.lastQuery = locate ? { array: name, locate, direction: explorer.direction }
                              : { array: name, box, direction: explorer.direction };
  try {
    const tReq = performance.now();
    const resp = await api("/api/trace", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...explorer.lastQuery, views }) });
    const t = await resp.json();
    const tResp = performance.now();
    explorer.trace = t;
    const srcs = {};
    await Promise.all(Object.entries(t.overlays).map(async ([id, o]) => { srcs[id] = await decoded(o.png); }));
    const tDecoded = performance.now();
    const redraws = [];
    for (const v of Object.values(explorer.views)) {
      const e = t.arrays[v.name];
      const o = t.overlays[v.id];
      if (e && o) {
        v.overlay = { src: srcs[v.id], win: o, trace: t.id };
        placeOverlay(v);
      } else if (e) {
        redraws.push(load(v));             // the view moved meanwhile: its own window
      } else if (v.overlay) {
        v.overlay = null;
        placeOverlay(v);
      }
      v.box.classList.toggle("reached", Boolean(e) && e.count > 0);
      v.box.classList.toggle("unreached", !e && v.name !== name);
      // how the answer came: the cells only an all-to-all step (an overscan mean, a
      // global statistic) brought in are said apart, as `subzero trace` says them
      const via = e && e.all_to_all_only > 0 && !e.entire
        ? ` (${e.all_to_all_only.toLocaleString()} only through all-to-all steps)` : "";
      v.title.querySelector(".count").textContent = e ? `· ${e.entire ? "all " : ""}${e.count.toLocaleString()} cells${via}` : "";
    }
    await Promise.all(redraws);
    await new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)));
    const t1 = performance.now();
    explorer.lastLatency = { id: t.id, total_ms: t1 - t0, request_ms: tResp - tReq,
                             server_trace_ms: t.seconds * 1000, decode_ms: tDecoded - tResp,
                             draw_ms: t1 - tResp };
    showSummary(t, explorer.lastLatency);
    explorer.traces += 1;
  } finally {
    explorer.busy = false;
  }
}

function methodClass(m) {
  if (m.startsWith("stored")) return "m-stored";
  if (m.startsWith("map")) return "m-map";
  if (m.startsWith("reexec")) return "m-reexec";
  if (m === "all-to-all") return "m-all";
  return "m-empty";
}

function showSummary(t, lat) {
  const reached = Object.keys(t.arrays).filter((a) => a !== t.start).length;
  $("#summary").innerHTML = "";
  const lines = [
    `${t.direction} trace from ${t.start}: ${t.cells_in.toLocaleString()} cell(s) in, ${reached} array(s) reached`,
    `trace ${t.seconds * 1000 > 0 ? (t.seconds * 1000).toFixed(1) : "0"} ms on the server · click → drawn ${lat.total_ms.toFixed(0)} ms`,
  ];
  for (const l of lines) { const d = document.createElement("div"); d.textContent = l; $("#summary").append(d); }
  const body = $("#steps tbody");
  body.innerHTML = "";
  for (const s of t.steps) {
    const tr = document.createElement("tr");
    const cells = [`${s.op}:${s.input} ${s.direction === "backward" ? "←" : "→"}`, s.method,
                   `${s.cells_in.toLocaleString()} → ${s.cells_out.toLocaleString()}`, (s.seconds * 1000).toFixed(2)];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      if (i === 1) td.className = methodClass(s.method);
      if (i >= 2) td.classList.add("num");
      if (s.note && i === 1) td.title = s.note;
      tr.append(td);
    });
    body.append(tr);
  }
}

// -- the page ----------------------------------------------------------------------------
function select(name) {
  if (!explorer.arrays[name]) {      // the server says what is wrong (and the page shows it)
    return api(`/api/image/${encodeURIComponent(name)}?size=1,1`).then(() => {});
  }
  explorer.selected = name;
  $("#array").value = name;
  const host = $("#mainview");
  const old = explorer.views[MAIN];
  if (old) { Plotly.purge(old.gd); delete explorer.views[MAIN]; }
  host.innerHTML = "";
  const [vr, vc] = explorer.arrays[name].view;
  const width = vr > vc * 2 ? 360 : 640;
  const v = makeView(MAIN, name, host, width, 640);
  for (const s of Object.values(explorer.views)) s.box.classList.toggle("selected", s.name === name && s.id !== MAIN);
  const url = new URL(window.location);
  url.searchParams.set("array", name);
  history.replaceState(null, "", url);
  return load(v);
}
explorer.select = select;

async function init() {
  const params = new URLSearchParams(window.location.search);
  const run = await api("/api/run").then((r) => r.json());
  explorer.run = run;
  for (const a of run.arrays) explorer.arrays[a.name] = a;
  $("#runinfo").textContent = `run ${run.run_id} · ${run.workflow} · ${run.arrays.length} arrays`
    + (run.trusted ? "" : " · untrusted: stored lineage only")
    + (run.rerun ? ` · re-run of run ${run.rerun.parent} with new ${run.rerun.inputs.join(", ")}:`
       + ` ${run.rerun.recomputed} of ${run.rerun.tiles} tiles recomputed` : "");
  const sel = $("#array");
  for (const a of run.arrays) {
    const o = document.createElement("option");
    o.value = a.name;
    o.textContent = `${a.name} (${a.shape.join("×")})` + (!a.rerun ? "" : a.rerun.how === "kept"
      ? " · the parent's" : a.rerun.how === "input" ? ` · corrected in ${a.rerun.changed_chunks} chunks`
      : ` · ${a.rerun.recomputed} of ${a.rerun.tiles} tiles recomputed,`
      + ` ${a.rerun.changed_chunks} chunks changed`);
    sel.append(o);
  }
  sel.addEventListener("change", () => select(sel.value).catch(() => {}));
  if (params.get("direction") === "forward") {
    explorer.direction = "forward";
    document.querySelector('input[value="forward"]').checked = true;
  }
  for (const r of document.querySelectorAll('input[name="direction"]')) {
    r.addEventListener("change", () => {
      explorer.direction = r.value;
      const q = explorer.lastQuery;
      if (q) runTrace(q.array, q.box, performance.now(), q.locate).catch(() => {});
    });
  }
  $("#exact").addEventListener("change", (ev) => {
    explorer.exact = ev.target.checked;
    explorer.reloadAll().catch(() => {});
  });
  $("#locate").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") explorer.locate(ev.target.value).catch(() => {});
  });
  $("#zoom-answer").addEventListener("click", () => explorer.zoomToAnswer().catch(() => {}));
  $("#reset").addEventListener("click", () => explorer.reset().catch(() => {}));
  const grid = $("#grid");
  const small = [];
  for (const a of run.arrays) {
    const [vr, vc] = a.view;
    const plotH = 200;      // square cells where they fit; margins 48 x 28 pixels
    const w = squareCells(a) ? Math.max(110, Math.min(300, Math.round(48 + plotH * vc / vr))) : 160;
    small.push(makeView(a.name, a.name, grid, w, plotH + 28));
  }
  const first = params.get("array") || (run.arrays.find((a) => a.name === "stars") || run.arrays[run.arrays.length - 1]).name;
  await Promise.all([select(first), ...small.map((v) => load(v))]);
  explorer.ready = true;
}

// "go to": trace the cells a sky position or labels name on the selected array (the
// server reads the text, as `subzero trace --sky/--sel` does), then zoom the main view there
explorer.locate = async (text) => {
  text = text.trim();
  if (!text || !explorer.selected) return;
  const name = explorer.selected;
  await runTrace(name, null, performance.now(), text);
  const a = explorer.trace && explorer.trace.arrays[name];
  if (!a || !a.bounds || a.bounds[0].length < 2) return;
  const [lo, hi] = a.bounds, nd = lo.length, v = explorer.views[MAIN], pad = 20;
  await setRange(v, [Math.max(0, lo[nd - 2] - pad), Math.min(v.info.view[0], hi[nd - 2] + pad),
                     Math.max(0, lo[nd - 1] - pad), Math.min(v.info.view[1], hi[nd - 1] + pad)]);
};

explorer.reloadAll = () => Promise.all(Object.values(explorer.views).map((v) => load(v)));

init().catch((e) => { showError(`the explorer could not start: ${e.message}`); explorer.ready = "failed"; });
