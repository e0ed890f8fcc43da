// The agent-otel report's timeline: GPU tracks and tool lanes on one canvas.
// Times in the data are milliseconds from the report window's start.
(function () {
  "use strict";
  var scriptStart = performance.now();
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var canvas = document.getElementById("timeline");
  var ctx = canvas.getContext("2d");
  var wrap = document.getElementById("timeline-wrap");
  var labels = document.getElementById("lane-labels");
  var tip = document.getElementById("tip");

  var AXIS_H = 26, GPU_H = 54, ROW_H = 10, LANE_PAD = 5, TRACK_GAP = 2;
  // Every colour comes from timeline.css: data colours (--c-*) each have a
  // legend swatch, the chart's own lines and text are --ui-*.
  var style = getComputedStyle(document.documentElement);
  function css(name) { return style.getPropertyValue(name).trim(); }
  var COL = {
    queue: css("--c-queue"), exec: css("--c-exec"), blamed: css("--c-blamed"), idle: css("--c-idle"),
    idleEdge: css("--c-idle-edge"), util: css("--c-util"), utilFill: css("--c-util-fill"), unused: css("--c-unused"),
    model: css("--c-model"), modelFailed: css("--c-model-failed"), firstChunk: css("--c-first-chunk"),
    turn: css("--c-turn"), turnFill: css("--c-turn-fill"), loop: css("--c-loop"),
    grid: css("--ui-grid"), axis: css("--ui-axis"), text: css("--ui-text"), track: css("--ui-track"),
    laneAlt: css("--ui-lane-alt"), backdrop: css("--ui-backdrop")
  };

  var C = D.calls;
  var n = C.lane.length;
  var submit = Float64Array.from(C.submit), start = Float64Array.from(C.start), end = Float64Array.from(C.end);
  var lane = Int32Array.from(C.lane), row = Int32Array.from(C.row), outcome = Int8Array.from(C.outcome);
  var S = D.shares;
  var shareStart = Float64Array.from(S.start), shareEnd = Float64Array.from(S.end), shareCall = Int32Array.from(S.call);
  var maxShare = 0;
  for (var i = 0; i < shareStart.length; i++) maxShare = Math.max(maxShare, shareEnd[i] - shareStart[i]);

  // Turns and model calls: their own lanes above the tools.
  var T = D.turns, M = D.models.calls;
  var turnStart = Float64Array.from(T.start), turnEnd = Float64Array.from(T.end), turnRow = Int32Array.from(T.row);
  var modelStart = Float64Array.from(M.start), modelEnd = Float64Array.from(M.end), modelRow = Int32Array.from(M.row);
  var maxTurn = 0;
  for (var i = 0; i < turnStart.length; i++) maxTurn = Math.max(maxTurn, turnEnd[i] - turnStart[i]);

  var full = Math.max(D.seconds * 1000, 1);
  var pad = full * 0.01;
  var v0 = -pad, v1 = full + pad;

  // Layout: the axis, one track per GPU, one lane per tool (in rank order).
  var tracks = [];
  var rowBase = [];  // lane -> index of its first row in the per-row arrays
  var y = AXIS_H, totalRows = 0;
  D.gpus.forEach(function (g) {
    tracks.push({ kind: "gpu", gpu: g, y: y, h: GPU_H });
    y += GPU_H + TRACK_GAP;
  });
  if (turnStart.length) {
    tracks.push({ kind: "turns", y: y, h: Math.max(T.rows * ROW_H + 2 * LANE_PAD, 34) });
    y += tracks[tracks.length - 1].h + TRACK_GAP;
  }
  D.models.lanes.forEach(function (m) {
    var maxDur = 0;
    for (var k = m.first; k < m.first + m.count; k++) maxDur = Math.max(maxDur, modelEnd[k] - modelStart[k]);
    m.maxDur = maxDur;
    var h = Math.max(m.rows * ROW_H + 2 * LANE_PAD, 34);
    tracks.push({ kind: "model", model: m, y: y, h: h });
    y += h + TRACK_GAP;
  });
  // One lane per event loop: the stretches it ran nothing else.
  D.loops.forEach(function (loop) {
    var maxDur = 0;
    for (var k = 0; k < loop.start.length; k++) maxDur = Math.max(maxDur, loop.end[k] - loop.start[k]);
    loop.maxDur = maxDur;
    tracks.push({ kind: "loop", loop: loop, y: y, h: 24 });
    y += 24 + TRACK_GAP;
  });
  D.lanes.forEach(function (l, index) {
    var maxDur = 0;
    for (var k = l.first; k < l.first + l.count; k++) maxDur = Math.max(maxDur, end[k] - submit[k]);
    l.maxDur = maxDur;
    l.index = index;
    var h = Math.max(l.rows * ROW_H + 2 * LANE_PAD, 34);
    tracks.push({ kind: "lane", lane: l, y: y, h: h });
    rowBase.push(totalRows);
    totalRows += l.rows;
    y += h + TRACK_GAP;
  });
  var contentH = y + 4;
  var lastPix = new Float64Array(totalRows);  // per row: last pixel column drawn
  var lastSharePix = new Float64Array(totalRows);

  tracks.forEach(function (t) {
    var div = document.createElement("div");
    div.className = "lane-label" + (t.kind === "gpu" ? " gpu" : "");
    div.style.top = t.y + "px";
    div.style.height = t.h + "px";
    if (t.kind === "gpu") {
      div.dataset.gpu = t.gpu.gpu;
      div.title = "GPU " + t.gpu.gpu + (t.gpu.simulated ? " (simulated: agent-otel's simulated GPU, not a real one)" : "");
      div.innerHTML = "GPU " + esc(t.gpu.gpu) + (t.gpu.simulated ? ' <span class="badge simulated">simulated</span>' : "") +
        '<span class="sub">utilization</span>';
    } else if (t.kind === "turns") {
      div.className = "lane-label turns";
      div.innerHTML = "agent turns" + '<span class="sub">' + turnStart.length + (turnStart.length === 1 ? " turn" : " turns") + "</span>";
    } else if (t.kind === "loop") {
      div.className = "lane-label loop";
      div.dataset.loop = t.loop.thread;
      div.title = "event loop of thread " + t.loop.thread;
      div.innerHTML = "loop " + esc(t.loop.thread) + '<span class="sub">' + compact(t.loop.start.length) +
        (t.loop.start.length === 1 ? " block, " : " blocks, ") + compact(t.loop.blocked_s) + " s blocked</span>";
    } else if (t.kind === "model") {
      div.className = "lane-label model";
      div.dataset.model = t.model.model;
      div.title = t.model.model;
      div.innerHTML = esc(t.model.model) + '<span class="sub">' + t.model.count + (t.model.count === 1 ? " model call, " : " model calls, ") + t.model.seconds.toFixed(2) + " s</span>";
    } else {
      div.dataset.tool = t.lane.tool;
      div.title = t.lane.tool;
      div.innerHTML = esc(t.lane.tool) + '<span class="sub">' + compact(t.lane.count) + (t.lane.count === 1 ? " call, " : " calls, ") + compact(t.lane.blocked_s) + " s blocked</span>";
    }
    labels.appendChild(div);
  });
  labels.style.height = contentH + "px";

  var W = 0, H = 0, dpr = 1;
  function resize() {
    dpr = window.devicePixelRatio || 1;
    H = contentH;
    canvas.style.height = H + "px";  // first: a scrollbar may appear and narrow the canvas
    W = Math.max(canvas.clientWidth, 100);
    canvas.width = Math.round(W * dpr);
    canvas.height = Math.round(H * dpr);
  }

  function lowerBound(arr, lo, hi, value) {  // first index in [lo, hi) with arr[i] >= value
    while (lo < hi) {
      var mid = (lo + hi) >>> 1;
      if (arr[mid] < value) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  function niceStep(span, target) {
    var raw = span / target, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 5, 10];
    for (var k = 0; k < steps.length; k++) if (steps[k] * mag >= raw) return steps[k] * mag;
    return 10 * mag;
  }

  // 25240 -> "25.2k", 6490.76 -> "6.49k", 12.345 -> "12.3", 0.123 -> "0.12": lane labels stay one short line
  function compact(value) {
    var units = [[1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(value) >= units[i][0]) return (value / units[i][0]).toPrecision(3).replace(/\.?0+$/, "") + units[i][1];
    }
    if (Number.isInteger(value)) return String(value);
    return value.toPrecision(3).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
  }

  function fmtTime(ms, step) {
    var digits = Math.max(0, Math.min(6, -Math.floor(Math.log10(step / 1000))));
    return (ms / 1000).toFixed(digits) + " s";
  }

  function draw() {
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, H);
    var scale = W / (v1 - v0);
    // grid and axis
    var step = niceStep(v1 - v0, Math.max(2, W / 110));
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.fillStyle = COL.text;
    ctx.strokeStyle = COL.grid;
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (var t = Math.ceil(v0 / step) * step; t <= v1; t += step) {
      var gx = Math.round((t - v0) * scale) + 0.5;
      ctx.moveTo(gx, AXIS_H - 6);
      ctx.lineTo(gx, H);
      var label = fmtTime(t, step), width = ctx.measureText(label).width;
      ctx.fillText(label, Math.min(gx + 3, W - width - 3), AXIS_H / 2);  // the last label stays inside
    }
    ctx.stroke();
    ctx.strokeStyle = COL.axis;
    ctx.beginPath();
    ctx.moveTo(0, AXIS_H - 0.5);
    ctx.lineTo(W, AXIS_H - 0.5);
    ctx.stroke();
    for (var k = 0; k < tracks.length; k++) {
      var tr = tracks[k];
      if (tr.kind === "gpu") drawGpu(tr, scale);
      else if (tr.kind === "turns") drawTurns(tr, scale);
      else if (tr.kind === "model") drawModels(tr, scale);
      else if (tr.kind === "loop") drawLoop(tr, scale);
      else drawLane(tr, scale, k);
    }
    drawShares(scale);
  }

  function drawGpu(tr, scale) {
    var g = tr.gpu, top = tr.y + 4, h = tr.h - 8;
    ctx.fillStyle = COL.track;
    ctx.fillRect(0, tr.y, W, tr.h);
    ctx.fillStyle = COL.idle;
    var idle = g.idle;
    for (var i = 0; i < idle.start.length; i++) {
      if (idle.end[i] < v0 || idle.start[i] > v1) continue;
      var x0 = (idle.start[i] - v0) * scale, w = Math.max(1, (idle.end[i] - idle.start[i]) * scale);
      ctx.fillRect(x0, tr.y, w, tr.h);
      if (w > 3) {  // its edges, as the legend's swatch shows them
        ctx.fillStyle = COL.idleEdge;
        ctx.fillRect(x0, tr.y, 1, tr.h);
        ctx.fillRect(x0 + w - 1, tr.y, 1, tr.h);
        ctx.fillStyle = COL.idle;
      }
    }
    if (!g.t.length) {
      var note = "no utilization samples (idle windows from gpu.idle spans)";
      ctx.fillStyle = COL.backdrop;  // readable over the idle shading
      ctx.fillRect(4, tr.y + tr.h / 2 - 8, ctx.measureText(note).width + 6, 16);
      ctx.fillStyle = COL.text;
      ctx.fillText(note, 7, tr.y + tr.h / 2);
      return;
    }
    // The utilization curve: each sample covers the period ending at its
    // time. Zoomed out, one step per pixel column (its busiest sample).
    var first = Math.max(0, lowerBound(g.t, 0, g.t.length, v0) - 1);
    var last = Math.min(g.t.length - 1, lowerBound(g.t, 0, g.t.length, v1));
    ctx.beginPath();
    var prevX = (g.t[first] - v0) * scale;
    ctx.moveTo(prevX, top + h);
    var column = Math.floor(prevX), peak = -1;
    for (var i = first + 1; i <= last; i++) {
      var x = (g.t[i] - v0) * scale;
      peak = Math.max(peak, g.u[i]);
      if (Math.floor(x) === column && i < last) continue;
      var yy = top + h - peak * h;
      ctx.lineTo(prevX, yy);
      ctx.lineTo(x, yy);
      prevX = x;
      column = Math.floor(x);
      peak = -1;
    }
    ctx.lineTo(prevX, top + h);
    ctx.closePath();
    ctx.fillStyle = COL.utilFill;
    ctx.fill();
    ctx.strokeStyle = COL.util;
    ctx.lineWidth = 1.2;
    ctx.stroke();
    ctx.lineWidth = 1;
    drawUnused(g.unused, top, h, scale);
    drawUtilizationAxis(top, h);
  }

  // The GPU lane's vertical axis: 0, 50 and 100% utilization, with a faint
  // line at 50 and 100 and the labels on a backdrop at the left edge.
  function drawUtilizationAxis(top, h) {
    ctx.save();
    ctx.strokeStyle = COL.axis;
    ctx.setLineDash([2, 3]);
    ctx.beginPath();
    [0, 0.5].forEach(function (f) {
      var yy = Math.round(top + f * h) + 0.5;
      ctx.moveTo(0, yy);
      ctx.lineTo(W, yy);
    });
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.font = "9px system-ui, sans-serif";
    [[1, "100%"], [0.5, "50%"], [0, "0%"]].forEach(function (tick) {
      var yy = top + h - tick[0] * h, width = ctx.measureText(tick[1]).width;
      ctx.fillStyle = COL.backdrop;
      ctx.fillRect(1, yy - 5, width + 4, 10);
      ctx.fillStyle = COL.text;
      ctx.fillText(tick[1], 3, yy);
    });
    ctx.restore();
  }

  // Capacity left unused while tool calls were in flight, blamed on them:
  // hung from the top of the lane, so it sits in the gap above the
  // utilization curve. Zoomed out, one bar per pixel column (its largest).
  function drawUnused(un, top, h, scale) {
    if (!un || !un.start.length) return;
    ctx.fillStyle = COL.unused;
    var column = null, peak = 0;
    for (var i = lowerBound(un.end, 0, un.end.length, v0); i < un.start.length && un.start[i] <= v1; i++) {
      var a = (un.start[i] - v0) * scale, b = (un.end[i] - v0) * scale, r = un.blamed[i];
      if (b - a >= 1) {  // wide enough to draw on its own
        if (r > 0) ctx.fillRect(a, top, b - a, r * h);
        continue;
      }
      if (column !== null && Math.floor(a) !== column) {
        if (peak > 0) ctx.fillRect(column, top, 1, peak * h);
        peak = 0;
      }
      column = Math.floor(a);
      peak = Math.max(peak, r);
    }
    if (column !== null && peak > 0) ctx.fillRect(column, top, 1, peak * h);
  }

  function drawLane(tr, scale, index) {
    var l = tr.lane;
    if (index % 2) {
      ctx.fillStyle = COL.laneAlt;
      ctx.fillRect(0, tr.y, W, tr.h);
    }
    var base = rowBase[l.index];
    for (var r = 0; r < l.rows; r++) lastPix[base + r] = -1;
    var lo = lowerBound(submit, l.first, l.first + l.count, v0 - l.maxDur);
    var hi = lowerBound(submit, lo, l.first + l.count, v1);
    for (var k = lo; k < hi; k++) {
      if (end[k] < v0) continue;
      var r = row[k], yy = tr.y + LANE_PAD + r * ROW_H;
      var xs = (submit[k] - v0) * scale, xe = (end[k] - v0) * scale;
      if (xe - xs < 1) {
        // Thinner than a pixel: one pixel per column and row is enough.
        var px = Math.floor(xs);
        if (px === lastPix[base + r]) continue;
        lastPix[base + r] = px;
        ctx.fillStyle = COL.exec;
        ctx.fillRect(px, yy, 1, ROW_H - 2);
        continue;
      }
      lastPix[base + r] = Math.floor(xe);
      var xx = (start[k] - v0) * scale;
      if (xx > xs) {
        ctx.fillStyle = COL.queue;
        ctx.fillRect(xs, yy, xx - xs, ROW_H - 2);
      }
      ctx.fillStyle = COL.exec;
      ctx.fillRect(xx, yy, Math.max(xe - xx, 0.5), ROW_H - 2);
      if (outcome[k] === 1 || outcome[k] === 2) {
        ctx.strokeStyle = COL.blamed;
        ctx.strokeRect(xs + 0.5, yy + 0.5, Math.max(xe - xs - 1, 0.5), ROW_H - 3);
      }
    }
  }

  function drawTurns(tr, scale) {
    ctx.fillStyle = COL.track;
    ctx.fillRect(0, tr.y, W, tr.h);
    var lo = lowerBound(turnStart, 0, turnStart.length, v0 - maxTurn);
    var hi = lowerBound(turnStart, lo, turnStart.length, v1);
    for (var k = lo; k < hi; k++) {
      if (turnEnd[k] < v0) continue;
      var yy = tr.y + LANE_PAD + turnRow[k] * ROW_H;
      var x0 = (turnStart[k] - v0) * scale, w = Math.max((turnEnd[k] - turnStart[k]) * scale, 1);
      ctx.fillStyle = COL.turnFill;
      ctx.fillRect(x0, yy, w, ROW_H - 2);
      ctx.strokeStyle = COL.turn;
      ctx.strokeRect(x0 + 0.5, yy + 0.5, Math.max(w - 1, 0.5), ROW_H - 3);
    }
  }

  function drawLoop(tr, scale) {
    var loop = tr.loop;
    ctx.fillStyle = COL.track;
    ctx.fillRect(0, tr.y, W, tr.h);
    ctx.fillStyle = COL.loop;
    var lo = lowerBound(loop.start, 0, loop.start.length, v0 - loop.maxDur);
    for (var k = lo; k < loop.start.length && loop.start[k] <= v1; k++) {
      if (loop.end[k] < v0) continue;
      var x0 = (loop.start[k] - v0) * scale, w = Math.max((loop.end[k] - loop.start[k]) * scale, 1);
      ctx.fillRect(x0, tr.y + 6, w, tr.h - 12);
    }
  }

  function drawModels(tr, scale) {
    var m = tr.model;
    var lo = lowerBound(modelStart, m.first, m.first + m.count, v0 - m.maxDur);
    var hi = lowerBound(modelStart, lo, m.first + m.count, v1);
    for (var k = lo; k < hi; k++) {
      if (modelEnd[k] < v0) continue;
      var yy = tr.y + LANE_PAD + modelRow[k] * ROW_H;
      var x0 = (modelStart[k] - v0) * scale, w = Math.max((modelEnd[k] - modelStart[k]) * scale, 1);
      ctx.fillStyle = M.failed[k] ? COL.modelFailed : COL.model;
      ctx.fillRect(x0, yy, w, ROW_H - 2);
      if (M.first[k] !== null) {  // the first chunk of a streamed answer
        ctx.fillStyle = COL.firstChunk;
        ctx.fillRect(x0 + M.first[k] * scale, yy, 1, ROW_H - 2);
      }
    }
  }

  function drawShares(scale) {
    var laneY = {};
    tracks.forEach(function (t) { if (t.kind === "lane") laneY[t.lane.index] = t.y; });
    lastSharePix.fill(-1);
    ctx.fillStyle = COL.blamed;
    var lo = lowerBound(shareStart, 0, shareStart.length, v0 - maxShare);
    var hi = lowerBound(shareStart, lo, shareStart.length, v1);
    for (var k = lo; k < hi; k++) {
      if (shareEnd[k] < v0) continue;
      var c = shareCall[k], slot = rowBase[lane[c]] + row[c];
      var x0 = (shareStart[k] - v0) * scale, x1 = (shareEnd[k] - v0) * scale;
      if (x1 <= lastSharePix[slot]) continue;  // this row is already red there
      lastSharePix[slot] = Math.max(x1, Math.floor(x0) + 1);
      var yy = laneY[lane[c]] + LANE_PAD + row[c] * ROW_H + ROW_H - 4;
      ctx.fillRect(x0, yy, Math.max(x1 - x0, 1), 3);
    }
  }

  // ---- interaction
  var pending = false;
  function redraw() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; draw(); });
  }

  canvas.addEventListener("wheel", function (e) {
    e.preventDefault();
    var rect = canvas.getBoundingClientRect();
    var at = v0 + (e.clientX - rect.left) * (v1 - v0) / W;
    var factor = Math.exp(e.deltaY * 0.0015);
    var span = Math.min(Math.max((v1 - v0) * factor, 0.001), full * 4);
    var f = (at - v0) / (v1 - v0);
    v0 = at - f * span;
    v1 = v0 + span;
    redraw();
  }, { passive: false });

  var drag = null;
  canvas.addEventListener("pointerdown", function (e) {
    drag = { x: e.clientX, v0: v0, v1: v1 };
    canvas.setPointerCapture(e.pointerId);
    canvas.classList.add("dragging");
  });
  canvas.addEventListener("pointerup", function (e) {
    drag = null;
    canvas.releasePointerCapture(e.pointerId);
    canvas.classList.remove("dragging");
  });
  canvas.addEventListener("pointermove", function (e) {
    if (drag) {
      var shift = (e.clientX - drag.x) * (drag.v1 - drag.v0) / W;
      v0 = drag.v0 - shift;
      v1 = drag.v1 - shift;
      tip.hidden = true;
      redraw();
      return;
    }
    hover(e);
  });
  canvas.addEventListener("pointerleave", function () { tip.hidden = true; });
  canvas.addEventListener("dblclick", function () { v0 = -pad; v1 = full + pad; redraw(); });
  window.addEventListener("resize", function () { resize(); redraw(); });

  document.querySelectorAll("#tools-table tbody tr[data-tool]").forEach(function (tr) {
    tr.addEventListener("click", function () {
      var t = tracks.find(function (x) { return x.kind === "lane" && x.lane.tool === tr.dataset.tool; });
      if (t) wrap.scrollTo({ top: Math.max(0, t.y - AXIS_H - 40), behavior: "smooth" });
    });
  });

  function hover(e) {
    var rect = canvas.getBoundingClientRect();
    var x = e.clientX - rect.left, yy = e.clientY - rect.top;
    var at = v0 + x * (v1 - v0) / W, slack = 3 * (v1 - v0) / W;
    var tr = tracks.find(function (t) { return yy >= t.y && yy < t.y + t.h; });
    var html = null;
    if (tr && tr.kind === "lane") html = callTip(tr, yy, at, slack);
    else if (tr && tr.kind === "gpu") html = gpuTip(tr.gpu, at);
    else if (tr && tr.kind === "turns") html = turnTip(tr, yy, at, slack);
    else if (tr && tr.kind === "model") html = modelTip(tr, yy, at, slack);
    else if (tr && tr.kind === "loop") html = loopTip(tr.loop, at, slack);
    if (!html) { tip.hidden = true; return; }
    tip.innerHTML = html;
    tip.hidden = false;
    var left = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    var top = Math.min(e.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = left + "px";
    tip.style.top = top + "px";
  }

  function callTip(tr, yy, at, slack) {
    var l = tr.lane, r = Math.floor((yy - tr.y - LANE_PAD) / ROW_H);
    var lo = lowerBound(submit, l.first, l.first + l.count, at - l.maxDur - slack);
    var best = -1, bestDist = Infinity;
    for (var k = lo; k < l.first + l.count && submit[k] <= at + slack; k++) {
      if (row[k] !== r) continue;
      var dist = at < submit[k] ? submit[k] - at : at > end[k] ? at - end[k] : 0;
      if (dist <= slack && dist < bestDist) { best = k; bestDist = dist; }
    }
    if (best < 0) return null;
    var k = best, id = C.id[k];
    return "<b>" + esc(l.tool) + "</b><table>" +
      rowHtml("call id", id === null ? "-" : esc(id)) +
      rowHtml("outcome", D.outcomes[outcome[k]]) +
      rowHtml("requested", "+" + (submit[k] / 1000).toFixed(3) + " s") +
      rowHtml("queue", ms(start[k] - submit[k])) +
      rowHtml("exec", ms(end[k] - start[k])) +
      rowHtml("blamed GPU idle", C.blocked[k].toFixed(3) + " s") +
      rowHtml("trace id", D.traces[C.trace[k]]) + "</table>";
  }

  function nearest(starts, ends, rows, lo, hi, r, at, slack) {  // the span of row r nearest to at, in [lo, hi)
    var best = -1, bestDist = Infinity;
    for (var k = lo; k < hi && starts[k] <= at + slack; k++) {
      if (rows[k] !== r) continue;
      var dist = at < starts[k] ? starts[k] - at : at > ends[k] ? at - ends[k] : 0;
      if (dist <= slack && dist < bestDist) { best = k; bestDist = dist; }
    }
    return best;
  }

  function turnTip(tr, yy, at, slack) {
    var r = Math.floor((yy - tr.y - LANE_PAD) / ROW_H);
    var k = nearest(turnStart, turnEnd, turnRow, lowerBound(turnStart, 0, turnStart.length, at - maxTurn - slack),
                    turnStart.length, r, at, slack);
    if (k < 0) return null;
    var p = T.parts[k];  // client CPU, model, tool queue, tool exec, other (report/turns.py's PARTS)
    return "<b>" + esc(T.name[k]) + "</b><table>" +
      rowHtml("end to end", ms(turnEnd[k] - turnStart[k])) +
      (p[0] ? rowHtml("client CPU", p[0].toFixed(3) + " s") : "") +  // as the text: only where there is any
      rowHtml("model", p[1].toFixed(3) + " s") + rowHtml("tool queue", p[2].toFixed(3) + " s") +
      rowHtml("tool exec", p[3].toFixed(3) + " s") + rowHtml("other", p[4].toFixed(3) + " s") +
      rowHtml("trace id", T.trace[k]) + "</table>";
  }

  function modelTip(tr, yy, at, slack) {
    var m = tr.model, r = Math.floor((yy - tr.y - LANE_PAD) / ROW_H);
    var k = nearest(modelStart, modelEnd, modelRow, lowerBound(modelStart, m.first, m.first + m.count, at - m.maxDur - slack),
                    m.first + m.count, r, at, slack);
    if (k < 0) return null;
    return "<b>" + esc(m.model) + "</b><table>" +
      rowHtml("requested", "+" + (modelStart[k] / 1000).toFixed(3) + " s") +
      rowHtml("duration", ms(modelEnd[k] - modelStart[k])) +
      rowHtml("first chunk", M.first[k] === null ? "-" : ms(M.first[k])) +
      rowHtml("tokens in / out", (M.input[k] === null ? "-" : M.input[k]) + " / " + (M.output[k] === null ? "-" : M.output[k])) +
      rowHtml("outcome", M.failed[k] ? "error" : "ok") + "</table>";
  }

  function loopTip(loop, at, slack) {
    var lo = lowerBound(loop.start, 0, loop.start.length, at - loop.maxDur - slack), best = -1, bestDist = Infinity;
    for (var k = lo; k < loop.start.length && loop.start[k] <= at + slack; k++) {
      var dist = at < loop.start[k] ? loop.start[k] - at : at > loop.end[k] ? at - loop.end[k] : 0;
      if (dist <= slack && dist < bestDist) { best = k; bestDist = dist; }
    }
    if (best < 0) return null;
    return "<b>event loop " + esc(loop.thread) + " blocked</b><table>" +
      rowHtml("by", loop.tool[best] === null ? "code that is no tool" : esc(loop.tool[best])) +
      rowHtml("from", "+" + (loop.start[best] / 1000).toFixed(3) + " s") +
      rowHtml("blocked", ms(loop.end[best] - loop.start[best])) +
      rowHtml("calls waiting", String(loop.waiting[best])) + "</table>";
  }

  function gpuTip(g, at) {
    var out = "<b>GPU " + esc(g.gpu) + "</b><table>";
    if (g.t.length) {
      var i = Math.min(lowerBound(g.t, 0, g.t.length, at), g.t.length - 1);
      out += rowHtml("utilization", (g.u[i] * 100).toFixed(0) + " %");
    }
    var un = g.unused;
    if (un && un.start.length) {
      var j = lowerBound(un.end, 0, un.end.length, at);
      if (j < un.end.length && un.start[j] <= at) {
        out += rowHtml("unused while tools ran", (un.blamed[j] * 100).toFixed(0) + " %");
      }
    }
    var idle = g.idle;
    for (var k = 0; k < idle.start.length; k++) {
      if (idle.start[k] <= at && at <= idle.end[k]) {
        out += rowHtml("idle window", ms(idle.end[k] - idle.start[k])) +
          rowHtml("blocked by", idle.blocked_by[k] === null ? "no tool" : esc(idle.blocked_by[k])) +
          rowHtml("unattributed", idle.unattributed[k].toFixed(3) + " s");
        break;
      }
    }
    return out + "</table>";
  }

  function rowHtml(name, value) { return "<tr><td>" + name + "</td><td>" + value + "</td></tr>"; }
  function ms(value) { return value >= 1000 ? (value / 1000).toFixed(3) + " s" : value.toFixed(1) + " ms"; }
  function esc(text) {
    return String(text).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  // ---- first render, and the measurements the docs quote
  function flush() { ctx.getImageData(0, 0, 1, 1); }  // forces the canvas to rasterize
  resize();
  draw();
  flush();
  var root = document.documentElement;
  root.dataset.firstRenderMs = performance.now().toFixed(1);
  root.dataset.scriptMs = (performance.now() - scriptStart).toFixed(1);
  root.dataset.calls = String(n);
  if (location.hash === "#bench") {
    var times = [];
    for (var f = 0; f < 30; f++) {
      var span = full / Math.pow(2, f % 10), center = full * ((f * 0.37) % 1);
      v0 = center - span / 2;
      v1 = center + span / 2;
      var t0 = performance.now();
      draw();
      flush();
      times.push(performance.now() - t0);
    }
    v0 = -pad; v1 = full + pad;
    draw();
    root.dataset.frameMsAvg = (times.reduce(function (a, b) { return a + b; }, 0) / times.length).toFixed(2);
    root.dataset.frameMsMax = Math.max.apply(null, times).toFixed(2);
  }
})();
