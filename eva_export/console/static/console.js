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
async function pollStatus() {
  const s = $("status");
  if (!s) return;
  try {
    const st = await getJSON("/api/status");
    const parts = [];
    for (const [k, v] of Object.entries(st)) parts.push(k + ": " + v);
    s.textContent = parts.join("  |  ");
  } catch (e) { s.textContent = "status unavailable"; }
  setTimeout(pollStatus, 2000);
}

// ---- jobs (dataset page) -------------------------------------------------------------------
function describeJob(j) {
  let t = j.kind + " " + j.job_id + " (" + j.format + "): " + j.state;
  if (j.episodes_total) t += ", episodes " + j.episodes_done + "/" + j.episodes_total;
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
    line.textContent = describeJob(r.job);
    line.dataset.state = r.job.state;
    if (r.job.state === "failed") { err.textContent = r.job.error; return; }
    if (r.job.state === "completed") return;
    await new Promise((res) => setTimeout(res, 400));
  }
}

function setupJobs() {
  const dataset = document.body.dataset.dataset;
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
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf"];

function setupEpisode() {
  const body = document.body;
  const dataset = body.dataset.dataset, index = Number(body.dataset.episode);
  const state = {ep: null, frame: 0, hover: null, videos: [], master: null, playing: false};

  getJSON("/api/episode?dataset=" + encodeURIComponent(dataset) + "&episode=" + index)
    .then((ep) => { state.ep = ep; render(); })
    .catch((e) => { $("info").textContent = "cannot load episode: " + (e.message || e); });

  function length() { return Math.max(1, state.ep.episode.length); }

  function render() {
    const ep = state.ep, e = ep.episode;
    $("task").textContent = "task: " + e.task;
    $("quality").textContent = e.quality || "unrated";
    $("quality").className = e.quality;
    showVerdict(e);
    $("note").value = e.note;
    for (const iss of ep.issues) $("issues").appendChild(el("li", {className: "issue"}, iss.code + ": " + iss.detail));
    const nav = [["prev", ep.prev], ["next", ep.next]];
    for (const [id, target] of nav) {
      if (target === null) $(id).classList.add("disabled");
      else $(id).href = "/d/" + encodeURIComponent(dataset) + "/e/" + target;
    }
    $("scrub").max = length() - 1;
    renderVideos();
    drawPlot();
  }

  function showVerdict(e) {
    $("verdict").textContent = "verdict: " + (e.qc_verdict || "none") + (e.note ? " - note: " + e.note : "");
    $("verdict").className = "verdict " + e.qc_verdict;
  }

  function renderVideos() {
    const box = $("videos");
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
        setFrame(length() - 1, false);
        document.body.dataset.ended = "1";
      });
      state.master.addEventListener("timeupdate", () => { if (!state.playing) return; tick(); });
    }
  }

  function frameOfTime(t) { return Math.min(length() - 1, Math.max(0, Math.floor(t * state.ep.fps + 1e-3))); }

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
    state.frame = Math.min(length() - 1, Math.max(0, f));
    $("scrub").value = state.frame;
    $("frame-readout").textContent = "frame " + state.frame + " / " + (length() - 1)
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

  // plot: one panel per vector feature, one line per element, red bands where reasons are located
  function drawPlot() {
    const c = $("plot");
    if (!state.ep) return;
    const ctx = c.getContext("2d");
    const feats = Object.keys(state.ep.series);
    const W = c.width, H = c.height, left = 50, right = 10;
    ctx.clearRect(0, 0, W, H);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    const n = length();
    const x = (f) => left + (W - left - right) * (n > 1 ? f / (n - 1) : 0.5);
    const frameW = (W - left - right) / Math.max(1, n - 1);
    // reasons with a location, across all panels
    ctx.fillStyle = "rgba(200, 0, 32, 0.18)";
    for (const m of state.ep.markers) ctx.fillRect(x(m.from) - frameW / 2, 0, Math.max(2, frameW * (m.to - m.from + 1)), H);
    let points = 0;
    const panelH = feats.length ? H / feats.length : H;
    feats.forEach((key, p) => {
      const s = state.ep.series[key], top = p * panelH + 14, h = panelH - 24;
      let lo = Infinity, hi = -Infinity;
      for (const row of s.values) for (const v of row) if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      if (!isFinite(lo)) { lo = 0; hi = 1; }
      if (hi === lo) { hi += 1; lo -= 1; }
      const y = (v) => top + h - (v - lo) / (hi - lo) * h;
      ctx.fillStyle = "#222"; ctx.font = "12px sans-serif";
      ctx.fillText(key, left, top - 2);
      ctx.fillText(hi.toPrecision(4), 2, top + 10); ctx.fillText(lo.toPrecision(4), 2, top + h);
      ctx.strokeStyle = "#ddd"; ctx.strokeRect(left, top, W - left - right, h);
      s.names.forEach((name, j) => {
        ctx.strokeStyle = COLOURS[j % COLOURS.length];
        ctx.beginPath();
        let pen = false;
        s.values.forEach((row, f) => {
          const v = row[j];
          if (v === null) { pen = false; return; }
          if (pen) ctx.lineTo(x(f), y(v)); else ctx.moveTo(x(f), y(v));
          pen = true; points++;
        });
        ctx.stroke();
      });
    });
    // playhead and hover line
    ctx.strokeStyle = "#000"; ctx.beginPath(); ctx.moveTo(x(state.frame), 0); ctx.lineTo(x(state.frame), H); ctx.stroke();
    if (state.hover !== null) {
      ctx.setLineDash([4, 3]); ctx.strokeStyle = "#555";
      ctx.beginPath(); ctx.moveTo(x(state.hover), 0); ctx.lineTo(x(state.hover), H); ctx.stroke();
      ctx.setLineDash([]);
    }
    c.dataset.points = String(points);
    c.dataset.markers = String(state.ep.markers.length);
    c.dataset.rendered = "1";
    const legend = state.ep.markers.map((m) => m.code + " frames " + m.from + ".." + m.to);
    $("timeline-legend").textContent = legend.length ? "marked: " + legend.join("; ")
      : "no reason of this episode says which frames (listed above)";
  }

  function frameAtMouse(ev) {
    const c = $("plot"), r = c.getBoundingClientRect();
    const px = (ev.clientX - r.left) * c.width / r.width;
    const n = length();
    return Math.min(n - 1, Math.max(0, Math.round((px - 50) / (c.width - 60) * (n - 1))));
  }

  $("plot").addEventListener("mousemove", (ev) => {
    if (!state.ep) return;
    const f = frameAtMouse(ev);
    state.hover = f;
    const parts = ["frame " + f + " (t=" + (f / state.ep.fps).toFixed(3) + " s)"];
    for (const [key, s] of Object.entries(state.ep.series)) {
      parts.push(key + ": " + s.values[f].map((v) => (v === null ? "NaN" : v.toFixed(3))).join(", "));
    }
    for (const m of state.ep.markers) if (f >= m.from && f <= m.to) parts.push("[" + m.code + "] " + m.detail);
    $("cursor-readout").textContent = parts.join("  |  ");
    setFrame(f, true);  // the videos show the frame under the cursor
  });
  $("plot").addEventListener("mouseleave", () => { state.hover = null; drawPlot(); });
  $("play").addEventListener("click", () => setPlaying(!state.playing));
  $("scrub").addEventListener("input", () => { setPlaying(false); setFrame(Number($("scrub").value), true); });

  async function review(verdict) {
    const out = $("review-result");
    out.textContent = "saving...";
    const r = await post("/api/review", {dataset, episode: index, verdict, note: $("note").value});
    out.textContent = r.ok ? r.message : "refused: " + r.message;
    out.className = r.ok ? "ok" : "red";
    if (r.ok && r.episode) showVerdict(r.episode);
  }
  $("pass-btn").addEventListener("click", () => review("pass"));
  $("fail-btn").addEventListener("click", () => review("fail"));
  $("clear-btn").addEventListener("click", () => review("clear"));

  document.addEventListener("keydown", (ev) => {
    const typing = ev.target && (ev.target.tagName === "INPUT" || ev.target.tagName === "SELECT");
    if (typing) { if (ev.key === "Escape") ev.target.blur(); return; }
    if (ev.ctrlKey || ev.metaKey || ev.altKey || !state.ep) return;
    const go = (t) => { if (t !== null) location.href = "/d/" + encodeURIComponent(dataset) + "/e/" + t; };
    switch (ev.key) {
      case " ": setPlaying(!state.playing); break;
      case "p": review("pass"); break;
      case "f": review("fail"); break;
      case "c": review("clear"); break;
      case "n": $("note").focus(); break;
      case "j": go(state.ep.next); break;
      case "k": go(state.ep.prev); break;
      case "ArrowRight": setPlaying(false); setFrame(state.frame + 1, true); break;
      case "ArrowLeft": setPlaying(false); setFrame(state.frame - 1, true); break;
      default: return;
    }
    ev.preventDefault();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  pollStatus();
  const page = document.body.dataset.page;
  if (page === "episodes") setupJobs();
  if (page === "episode") setupEpisode();
});
