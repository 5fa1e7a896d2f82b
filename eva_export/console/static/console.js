// eva console: the behaviour of the server-rendered pages. Served locally, no CDN, no framework.
// Dataset strings are written with textContent only (never innerHTML): task names and notes are
// user input.
"use strict";

const $ = (id) => document.getElementById(id);
const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

function el(tag, props, text) {
  const e = document.createElement(tag);
  Object.assign(e, props || {});
  if (text !== undefined) e.textContent = String(text);
  return e;
}

async function post(url, body) {
  const r = await fetch(url, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf()},
    body: JSON.stringify(body),
  });
  let j;
  try { j = await r.json(); } catch (e) { j = {ok: false, message: "HTTP " + r.status}; }
  return j;
}

async function getJSON(url) {
  const r = await fetch(url, {credentials: "same-origin"});
  if (!r.ok) throw new Error((await r.text()) || ("HTTP " + r.status));
  return r.json();
}

// ---- status line (capture/export/upload topics as the node last saw them) -----------------
// Asked for this page's dataset: the server keeps another dataset's last job out of the line.
function statusURL() {
  const d = document.body.dataset.dataset;
  return "/api/status" + (d ? "?dataset=" + encodeURIComponent(d) : "");
}

async function pollStatus() {
  const s = $("status");
  if (!s) return;
  try {
    const st = await getJSON(statusURL());
    const parts = [];
    for (const [k, v] of Object.entries(st.status)) parts.push(k + ": " + v);
    s.textContent = parts.join("  |  ");
  } catch (e) { s.textContent = "status unavailable"; }
  setTimeout(pollStatus, 2000);
}

// ---- jobs (dataset page) -------------------------------------------------------------------
// Progress in source episodes: a converting export counts each episode twice (split, then
// convert), so its raw counter would read 8/8 for a 4-episode dataset.
function episodeProgress(j) {
  const n = Number(document.body.dataset.episodes || 0), done = j.episodes_done, total = j.episodes_total;
  if (j.kind !== "export" || !n || total !== 2 * n) return "source episodes " + done + "/" + total;
  if (done <= n) return "source episodes " + done + "/" + n + " split";
  return "source episodes " + n + "/" + n + " split, " + (done - n) + "/" + n + " converted";
}

function describeJob(j) {
  let t = j.kind + " " + j.job_id + " (" + j.format + "): " + j.state;
  if (j.episodes_total) t += ", " + episodeProgress(j);
  if (j.files_total) t += ", files " + j.files_done + "/" + j.files_total;
  if (j.bytes_total) t += ", " + Math.round(100 * j.bytes_done / j.bytes_total) + "% bytes";
  if (j.state === "completed" && j.kind === "export")
    t += " - accepted " + j.accepted_episodes + " episodes (" + j.accepted_frames + " frames), rejected "
      + j.rejected_episodes + " (" + j.rejected_frames + ")";
  if (j.state === "completed" && j.remote_path) t += " - published at " + j.remote_path;
  if (j.last_error && j.state === "running") t += " - retrying after: " + j.last_error;
  return t;
}

async function followJob(kind, id) {
  const line = $("job-status"), err = $("job-error");
  for (;;) {
    let r;
    try { r = await getJSON("/api/job?kind=" + kind + "&id=" + encodeURIComponent(id)); }
    catch (e) { err.textContent = String(e.message || e); return; }
    if (!r.ok) { err.textContent = r.message; return; }
    // the node's message says "stalled: ..." when the job's process stopped recording it
    const stalled = typeof r.message === "string" && r.message.startsWith("stalled");
    line.textContent = describeJob(r.job) + (stalled ? " - " + r.message : "");
    line.dataset.state = stalled ? "stalled" : r.job.state;
    if (r.job.state === "failed") { err.textContent = r.job.error; return; }
    if (r.job.state === "completed") return;
    await new Promise((res) => setTimeout(res, 400));
  }
}

async function resumeJobs() {
  // a reloaded page follows this dataset's latest job again (and only this dataset's)
  try {
    const st = await getJSON(statusURL());
    const last = st.jobs[st.jobs.length - 1];
    if (last && !$("job-status").textContent) followJob(last.kind, last.job_id);
  } catch (e) { /* the status line says it is unavailable */ }
}

function setupJobs() {
  const dataset = document.body.dataset.dataset;
  resumeJobs();
  for (const kind of ["export", "upload"]) {
    const b = $(kind + "-btn");
    if (!b) continue;
    b.addEventListener("click", async () => {
      $("job-error").textContent = "";
      $("job-status").textContent = kind + ": asking...";
      $("job-status").dataset.state = "";
      const r = await post("/api/" + kind, {dataset, format: $("format").value});
      if (!r.ok) { $("job-status").textContent = kind + " refused"; $("job-error").textContent = r.message; return; }
      followJob(kind, r.job_id);
    });
  }
}

// ---- episode view --------------------------------------------------------------------------
const CODEC_TYPES = {
  h264: 'video/mp4; codecs="avc1.42E01E"', avc1: 'video/mp4; codecs="avc1.42E01E"',
  av1: 'video/mp4; codecs="av01.0.05M.08"', libsvtav1: 'video/mp4; codecs="av01.0.05M.08"',
  hevc: 'video/mp4; codecs="hvc1.1.6.L93.B0"', h265: 'video/mp4; codecs="hvc1.1.6.L93.B0"',
  vp9: 'video/mp4; codecs="vp09.00.10.08"', libx264: 'video/mp4; codecs="avc1.42E01E"',
  libx265: 'video/mp4; codecs="hvc1.1.6.L93.B0"',
};
// 12 distinguishable colours: a group never shows more than GROUP lines, so none repeats in a group
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#393b79", "#637939"];
const GROUP = 8, ALL_MAX = 12;  // more dims than ALL_MAX: shown in groups of GROUP by default

function colourOf(j, shown) {
  if (shown <= COLOURS.length) return COLOURS[j % COLOURS.length];
  return "hsl(" + Math.round(j * 360 / shown) + ", 70%, 42%)";  // "all" of a wide robot: distinct hues
}

// Which element indices the plot shows: "all", or "g<k>" = indices k*GROUP .. k*GROUP+GROUP-1.
function dimOptions(series) {
  const width = Math.max(0, ...Object.values(series).map((s) => s.names.length));
  const first = Object.values(series)[0];
  const opts = [["all", "all " + width + " dimensions"]];
  if (width > ALL_MAX) {
    for (let k = 0; k * GROUP < width; k++) {
      const a = k * GROUP, b = Math.min(width, a + GROUP) - 1;
      const label = first ? first.names[a] + " .. " + first.names[Math.min(b, first.names.length - 1)] : "";
      opts.push(["g" + k, "dims " + a + "-" + b + " (" + label + ")"]);
    }
  }
  return {opts, initial: width > ALL_MAX ? "g0" : "all"};
}

function shownDims(sel, width) {
  if (sel === "all") return [...Array(width).keys()];
  const k = Number(sel.slice(1)), out = [];
  for (let j = k * GROUP; j < Math.min(width, (k + 1) * GROUP); j++) out.push(j);
  return out;
}

// The episode being reviewed (one per page): set by setupEpisode, read by the functions below.
const state = {ep: null, frame: 0, hover: null, videos: [], master: null, playing: false, dims: "all",
  savedNote: ""};
let dataset = "", index = 0, note = null;

function epLength() { return Math.max(1, state.ep.episode.length); }

function render() {
  const ep = state.ep, e = ep.episode;
  $("task").textContent = "task: " + e.task;
  $("quality").textContent = e.quality || "unrated";
  $("quality").className = e.quality || "unrated";
  showVerdict(e);
  note.value = e.note;
  noteSaved(e.note);
  for (const iss of ep.issues) $("issues").appendChild(el("li", {className: "issue"}, iss.code + ": " + iss.detail));
  const nav = [["prev", ep.prev], ["next", ep.next]];
  for (const [id, target] of nav) {
    if (target === null) $(id).classList.add("disabled");
    else $(id).href = "/d/" + encodeURIComponent(dataset) + "/e/" + target;
  }
  $("scrub").max = epLength() - 1;
  const {opts, initial} = dimOptions(ep.series);
  for (const [v, label] of opts) $("dims").appendChild(el("option", {value: v}, label));
  $("dims").value = state.dims = initial;
  renderVideos();
  drawPlot();
}

function showVerdict(e) {
  $("verdict").textContent = "verdict: " + (e.qc_verdict || "none") + (e.note ? " - note: " + e.note : "");
  $("verdict").className = "verdict " + e.qc_verdict;
}

function noteSaved(text) {
  state.savedNote = text;
  noteState();
}

function noteState() {
  const dirty = note.value !== state.savedNote;
  $("note-state").textContent = dirty ? "unsaved" : (state.savedNote ? "saved" : "");
  $("note-state").dataset.state = dirty ? "unsaved" : "saved";
  $("note-state").className = dirty ? "red" : "ok";
}

function renderVideos() {
  const box = $("videos");
  const n = state.ep.cameras.length;
  // 1-4 cameras in one row, 5-8 in two: the plot and the review bar keep their room
  box.style.setProperty("--cols", String(Math.max(1, n <= 4 ? n : Math.ceil(n / 2))));
  box.dataset.rows = n > 4 ? "2" : "1";
  for (const cam of state.ep.cameras) {
    const fig = el("figure", {className: "cam"});
    fig.appendChild(el("figcaption", {}, cam.key + " (" + (cam.codec || "unknown codec") + ")"));
    const probe = document.createElement("video");
    const type = CODEC_TYPES[(cam.codec || "").toLowerCase()];
    const msg = el("div", {className: "codec-msg red"});
    if (!cam.exists) {
      msg.textContent = "video file missing: " + cam.url;
    } else if (!type || probe.canPlayType(type) === "") {
      msg.textContent = "This browser cannot play " + (cam.codec || "this codec") + " video. Open the file with a "
        + "desktop player (e.g. ffplay) or re-encode a copy to H.264; nothing is transcoded here.";
    }
    if (!msg.textContent) {
      const v = el("video", {muted: true, preload: "auto", playsInline: true, src: cam.url});
      v.dataset.key = cam.key;
      v.addEventListener("error", () => {
        msg.textContent = "This browser could not decode " + (cam.codec || "the") + " video of " + cam.key
          + " (" + (v.error ? v.error.message || v.error.code : "error") + ").";
      });
      fig.appendChild(v);
      state.videos.push(v);
    }
    fig.appendChild(msg);
    box.appendChild(fig);
  }
  state.master = state.videos[0] || null;
  if (state.master) {
    state.master.addEventListener("ended", () => {
      setPlaying(false);
      // a camera that lagged behind (busy machine) is moved to its end too: all show the last frame
      for (const v of state.videos) if (v !== state.master && !v.ended) v.currentTime = v.duration;
      setFrame(epLength() - 1, false);
      document.body.dataset.ended = "1";
    });
    state.master.addEventListener("timeupdate", () => { if (!state.playing) return; tick(); });
  }
}

function frameOfTime(t) { return Math.min(epLength() - 1, Math.max(0, Math.floor(t * state.ep.fps + 1e-3))); }

function tick() {
  if (!state.master) return;
  const t = state.master.currentTime;
  for (const v of state.videos) {
    if (v !== state.master && Math.abs(v.currentTime - t) > 0.5 / state.ep.fps) v.currentTime = t;
  }
  setFrame(frameOfTime(t), false);
  if (state.playing) requestAnimationFrame(tick);
}

function setFrame(f, seek) {
  state.frame = Math.min(epLength() - 1, Math.max(0, f));
  $("scrub").value = state.frame;
  $("frame-readout").textContent = "frame " + state.frame + " / " + (epLength() - 1)
    + "  t=" + (state.frame / state.ep.fps).toFixed(3) + " s";
  if (seek) {
    const t = (state.frame + 0.5) / state.ep.fps;
    for (const v of state.videos) v.currentTime = Math.min(t, Math.max(0, (v.duration || t) - 1e-3));
  }
  drawPlot();
}

function setPlaying(on) {
  state.playing = on;
  $("play").textContent = on ? "pause (space)" : "play (space)";
  if (on) {
    delete document.body.dataset.ended;
    if (state.master && state.master.ended) for (const v of state.videos) v.currentTime = 0;
    for (const v of state.videos) v.play().catch(() => {});
    requestAnimationFrame(tick);
  } else {
    for (const v of state.videos) v.pause();
  }
}

const plotGeom = {left: 50, right: 10};

function renderLegend(dims) {
  const box = $("legend");
  box.textContent = "";
  const first = Object.values(state.ep.series)[0];
  if (!first) return;
  for (const j of dims) {
    const item = el("span", {className: "legend-item"});
    const sw = el("span", {className: "swatch"});
    sw.style.background = colourOf(dims.indexOf(j), dims.length);
    item.appendChild(sw);
    item.appendChild(document.createTextNode(first.names[j] || ("[" + j + "]")));
    box.appendChild(item);
  }
}

// Where reasons are located: a solid strip on top and a faint wash, so the lines stay readable.
// Overlapping marks are drawn once (their union), so stacked reasons do not darken the wash.
function drawBands(ctx, x, frameW, H) {
  const n = epLength(), hit = new Uint8Array(n);
  for (const m of state.ep.markers) for (let f = Math.max(0, m.from); f <= Math.min(n - 1, m.to); f++) hit[f] = 1;
  for (let f = 0; f < n; f++) {
    if (!hit[f]) continue;
    let g = f;
    while (g + 1 < n && hit[g + 1]) g++;
    const x0 = x(f) - frameW / 2, w = Math.max(2, frameW * (g - f + 1));
    ctx.fillStyle = "rgba(200, 0, 32, 0.06)"; ctx.fillRect(x0, 0, w, H);
    ctx.fillStyle = "rgba(200, 0, 32, 0.85)"; ctx.fillRect(x0, 0, w, 5);
    f = g;
  }
}

function drawPanel(ctx, key, dims, top, h, x, W) {
  const s = state.ep.series[key];
  let lo = Infinity, hi = -Infinity;
  for (const row of s.values) for (const j of dims) { const v = row[j]; if (v !== null && v !== undefined) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }
  if (!isFinite(lo)) { lo = 0; hi = 1; }
  if (hi === lo) { hi += 1; lo -= 1; }
  const y = (v) => top + h - (v - lo) / (hi - lo) * h;
  ctx.fillStyle = "#222"; ctx.font = "12px sans-serif";
  ctx.fillText(key, plotGeom.left, top - 2);
  ctx.fillText(hi.toPrecision(4), 2, top + 10); ctx.fillText(lo.toPrecision(4), 2, top + h);
  ctx.strokeStyle = "#ddd"; ctx.strokeRect(plotGeom.left, top, W - plotGeom.left - plotGeom.right, h);
  let points = 0;
  dims.forEach((j, c) => {
    ctx.strokeStyle = colourOf(c, dims.length);
    ctx.beginPath();
    let pen = false;
    s.values.forEach((row, f) => {
      const v = row[j];
      if (v === null || v === undefined) { pen = false; return; }
      if (pen) ctx.lineTo(x(f), y(v)); else ctx.moveTo(x(f), y(v));
      pen = true; points++;
    });
    ctx.stroke();
  });
  return points;
}

// plot: one panel per vector feature, one line per shown element
function drawPlot() {
  const c = $("plot");
  if (!state.ep) return;
  const ctx = c.getContext("2d");
  const feats = Object.keys(state.ep.series);
  const W = c.width, H = c.height;
  ctx.clearRect(0, 0, W, H);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
  const n = epLength();
  const x = (f) => plotGeom.left + (W - plotGeom.left - plotGeom.right) * (n > 1 ? f / (n - 1) : 0.5);
  drawBands(ctx, x, (W - plotGeom.left - plotGeom.right) / Math.max(1, n - 1), H);
  let points = 0;
  const panelH = feats.length ? H / feats.length : H;
  const width = Math.max(0, ...feats.map((k) => state.ep.series[k].names.length));
  const dims = shownDims(state.dims, width);
  feats.forEach((key, p) => {
    const own = dims.filter((j) => j < state.ep.series[key].names.length);
    points += drawPanel(ctx, key, own, p * panelH + 16, panelH - 26, x, W);
  });
  ctx.strokeStyle = "#000"; ctx.beginPath(); ctx.moveTo(x(state.frame), 0); ctx.lineTo(x(state.frame), H); ctx.stroke();
  if (state.hover !== null) {
    ctx.setLineDash([4, 3]); ctx.strokeStyle = "#555";
    ctx.beginPath(); ctx.moveTo(x(state.hover), 0); ctx.lineTo(x(state.hover), H); ctx.stroke();
    ctx.setLineDash([]);
  }
  if (c.dataset.dims !== state.dims) renderLegend(dims);
  c.dataset.dims = state.dims;
  c.dataset.points = String(points);
  c.dataset.markers = String(state.ep.markers.length);
  c.dataset.rendered = "1";
  const legend = state.ep.markers.map((m) => m.code + " frames " + m.from + ".." + m.to);
  $("timeline-legend").textContent = legend.length ? "marked: " + legend.join("; ")
    : state.ep.issues.length ? "no reason of this episode says which frames (listed above)"
      : "no issues recorded for this episode";
}

function frameAtMouse(ev) {
  const c = $("plot"), r = c.getBoundingClientRect();
  const px = (ev.clientX - r.left) * c.width / r.width;
  const n = epLength();
  const span = c.width - plotGeom.left - plotGeom.right;
  return Math.min(n - 1, Math.max(0, Math.round((px - plotGeom.left) / span * (n - 1))));
}

function readout(f) {
  const parts = ["frame " + f + " (t=" + (f / state.ep.fps).toFixed(3) + " s)"];
  for (const [key, s] of Object.entries(state.ep.series)) {
    const dims = shownDims(state.dims, s.names.length);
    parts.push(key + ": " + dims.map((j) => {
      const v = s.values[f][j];
      return s.names[j] + "=" + (v === null ? "NaN" : v.toFixed(3));
    }).join(", "));
  }
  for (const m of state.ep.markers) if (f >= m.from && f <= m.to) parts.push("[" + m.code + "] " + m.detail);
  return parts.join("  |  ");
}

async function review(verdict) {
  const out = $("review-result");
  out.textContent = "saving...";
  const text = note.value;
  // the take the page shows: if another take now holds this index, the review is refused
  const r = await post("/api/review", {dataset, episode: index, verdict, note: text,
    take_id: state.ep.episode.take_id || ""});
  out.textContent = r.ok ? r.message : "refused: " + r.message;
  out.className = r.ok ? "ok" : "red";
  if (r.ok && r.episode) { showVerdict(r.episode); noteSaved(r.episode.note); }
}

function onKey(key) {
  const go = (t) => { if (t !== null) location.href = "/d/" + encodeURIComponent(dataset) + "/e/" + t; };
  switch (key) {
    case " ": setPlaying(!state.playing); break;
    case "p": review("pass"); break;
    case "f": review("fail"); break;
    case "c": review("clear"); break;
    case "n": note.focus(); break;
    case "j": go(state.ep.next); break;
    case "k": go(state.ep.prev); break;
    case "ArrowRight": setPlaying(false); setFrame(state.frame + 1, true); break;
    case "ArrowLeft": setPlaying(false); setFrame(state.frame - 1, true); break;
    default: return false;
  }
  return true;
}

function onKeydown(ev) {
  if (ev.target === note) {
    if (ev.key === "Enter") { ev.preventDefault(); note.blur(); review(""); }  // "" = the note only
    else if (ev.key === "Escape") note.blur();
    return;
  }
  if (ev.target && (ev.target.tagName === "SELECT" || ev.target.tagName === "TEXTAREA"
      || (ev.target.tagName === "INPUT" && ev.target.type !== "range"))) return;
  if (ev.ctrlKey || ev.metaKey || ev.altKey || !state.ep) return;
  if (!onKey(ev.key)) return;
  ev.preventDefault();
}

function setupEpisode() {
  dataset = document.body.dataset.dataset;
  index = Number(document.body.dataset.episode);
  note = $("note");

  getJSON("/api/episode?dataset=" + encodeURIComponent(dataset) + "&episode=" + index)
    .then((ep) => { state.ep = ep; render(); })
    .catch((e) => { $("info").textContent = "cannot load episode: " + (e.message || e); });

  $("plot").addEventListener("mousemove", (ev) => {
    if (!state.ep) return;
    const f = frameAtMouse(ev);
    state.hover = f;
    $("cursor-readout").textContent = readout(f);
    setFrame(f, true);  // the videos show the frame under the cursor
  });
  $("plot").addEventListener("mouseleave", () => { state.hover = null; drawPlot(); });
  $("dims").addEventListener("change", () => { state.dims = $("dims").value; $("dims").blur(); drawPlot(); });
  $("play").addEventListener("click", () => setPlaying(!state.playing));
  $("scrub").addEventListener("input", () => { setPlaying(false); setFrame(Number($("scrub").value), true); });

  $("pass-btn").addEventListener("click", () => review("pass"));
  $("fail-btn").addEventListener("click", () => review("fail"));
  $("clear-btn").addEventListener("click", () => review("clear"));
  note.addEventListener("input", noteState);

  // After a click or drag, the slider or a button holds the focus and would eat the keys (a
  // range input takes arrows, a button takes space): give the focus back to the page.
  document.addEventListener("pointerup", () => {
    const a = document.activeElement;
    if (a && a !== note && a.tagName !== "SELECT" && a !== document.body) a.blur();
  });
  document.addEventListener("keydown", onKeydown);
}

document.addEventListener("DOMContentLoaded", () => {
  pollStatus();
  const page = document.body.dataset.page;
  if (page === "episodes") setupJobs();
  if (page === "episode") setupEpisode();
});
