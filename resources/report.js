// kvscope report: draws every heatmap from the data embedded in this page, offline.
// Hover: layer, token, value, worst head. Drag across a map to zoom into tokens; double-click resets.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("kvscope-data").textContent);
  const tooltip = document.getElementById("tooltip");

  const SCALES = data.scales;  // the app's colour stops (core/analysis/map_spec.h)

  // A map in floors ("ratio") is coloured in units of each row's off threshold, on a log scale.
  function position(map, r, v) {
    if (map.offThresholds) {
      const lo = Math.log10(map.scale.min), hi = Math.log10(map.scale.max);
      return (Math.log10(Math.max(v / map.offThresholds[r], map.scale.min)) - lo) / (hi - lo);
    }
    return (v - map.scale.min) / (map.scale.max - map.scale.min || 1);
  }

  function colour(kind, min, max, v) {
    const stops = SCALES[kind];
    let t = (v - min) / (max - min || 1);
    t = Math.max(0, Math.min(1, t));
    for (let i = 1; i < stops.length; i++) {
      if (t <= stops[i][0]) {
        const [t0, c0] = stops[i - 1], [t1, c1] = stops[i];
        const f = t1 > t0 ? (t - t0) / (t1 - t0) : 0;
        return "rgb(" + c0.map((c, k) => Math.round(c + (c1[k] - c) * f)).join(",") + ")";
      }
    }
    return "rgb(" + stops[stops.length - 1][1].join(",") + ")";
  }

  function hatch(ctx) {
    const p = document.createElement("canvas");
    p.width = p.height = 6;
    const c = p.getContext("2d");
    c.fillStyle = "#f4f4f4";
    c.fillRect(0, 0, 6, 6);
    c.strokeStyle = "#999";
    c.beginPath();
    c.moveTo(0, 6);
    c.lineTo(6, 0);
    c.stroke();
    return ctx.createPattern(p, "repeat");
  }

  function drawMap(holder, map) {
    const left = 190, right = map.legend.length ? 100 : 70, top = 8, bottom = 34;
    const rowHeight = Math.max(3, Math.min(18, Math.floor(440 / map.rows.length)));
    const width = Math.min(1300, Math.max(600, holder.clientWidth || 1200));
    const height = top + bottom + rowHeight * map.rows.length;
    const canvas = document.createElement("canvas");
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    canvas.dataset.map = map.id;
    holder.appendChild(canvas);
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    const pattern = hatch(ctx);
    const total = map.firstToken + map.columns * map.tokensPerColumn;
    const view = { lo: map.firstToken - 0.5, hi: total - 0.5 };
    const plotW = width - left - right;
    const x = (token) => left + (token - view.lo) / (view.hi - view.lo) * plotW;
    const tokenAt = (px) => view.lo + (px - left) / plotW * (view.hi - view.lo);

    function render(selection) {
      ctx.clearRect(0, 0, width, height);
      ctx.fillStyle = pattern;  // absent cells show the hatching: never a colour of the scale
      ctx.fillRect(left, top, plotW, rowHeight * map.rows.length);
      for (let r = 0; r < map.rows.length; r++) {
        for (let c = 0; c < map.columns; c++) {
          const v = map.values[r * map.columns + c];
          if (v === null) continue;
          const t0 = map.firstToken + c * map.tokensPerColumn - 0.5;
          const x0 = x(t0), x1 = x(t0 + map.tokensPerColumn);
          if (x1 < left || x0 > left + plotW) continue;
          ctx.fillStyle = colour(map.scale.kind, 0, 1, position(map, r, v));
          ctx.fillRect(Math.max(left, x0), top + r * rowHeight, Math.min(x1, left + plotW) - Math.max(left, x0) + 0.6, rowHeight);
        }
      }
      ctx.save();
      ctx.beginPath();
      ctx.rect(left, top, plotW, rowHeight * map.rows.length);
      ctx.clip();
      const line = (tx, style, dash) => {
        // A white outline under the line keeps it visible on every cell colour.
        for (const [colour, width, pattern] of [["rgb(" + SCALES.markerOutline.join(",") + ")", 4, []], [style, 2, dash]]) {
          ctx.strokeStyle = colour;
          ctx.lineWidth = width;
          ctx.setLineDash(pattern);
          ctx.beginPath();
          ctx.moveTo(x(tx), top);
          ctx.lineTo(x(tx), top + rowHeight * map.rows.length);
          ctx.stroke();
        }
      };
      if (map.prefill !== null) line(map.prefill, "rgb(" + SCALES.prefillLine.join(",") + ")", []);
      for (const d of map.divergences) line(d, "rgb(" + SCALES.divergenceLine.join(",") + ")", [6, 4]);
      // The suspect (map_spec.h): the spread's rows dimmed and labelled, the onset's framed.
      if (map.onsetRow !== undefined) {
        ctx.fillStyle = "rgba(255,255,255,0.55)";
        for (const r of map.spreadRows) ctx.fillRect(left, top + r * rowHeight, plotW, rowHeight);
        ctx.strokeStyle = "rgb(70,70,90)";
        ctx.lineWidth = 2;
        ctx.setLineDash([]);
        ctx.strokeRect(left + 1, top + map.onsetRow * rowHeight, plotW - 2, rowHeight);
      }
      if (selection) {
        ctx.fillStyle = "rgba(0,0,0,0.15)";
        ctx.fillRect(Math.min(selection[0], selection[1]), top, Math.abs(selection[1] - selection[0]), rowHeight * map.rows.length);
      }
      ctx.restore();
      ctx.setLineDash([]);
      if (map.spreadRows && map.spreadRows.length) {  // one label, on the longest run of spread rows
        let best = [0, -1];
        for (let i = 0; i < map.spreadRows.length;) {
          let j = i;
          while (j + 1 < map.spreadRows.length && map.spreadRows[j + 1] === map.spreadRows[j] + 1) j++;
          if (map.spreadRows[j] - map.spreadRows[i] > best[1] - best[0]) best = [map.spreadRows[i], map.spreadRows[j]];
          i = j + 1;
        }
        ctx.font = "italic 11px sans-serif";
        ctx.textAlign = "right";
        ctx.textBaseline = "middle";
        const y = top + (best[0] + best[1] + 1) / 2 * rowHeight, w = ctx.measureText(map.spreadLabel).width;
        ctx.fillStyle = "rgba(255,255,255,0.8)";
        ctx.fillRect(left + plotW - 6 - w - 3, y - 8, w + 6, 16);
        ctx.fillStyle = "rgb(60,60,80)";
        ctx.fillText(map.spreadLabel, left + plotW - 6, y);
      }
      ctx.fillStyle = "#222";
      ctx.font = "11px sans-serif";
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      const every = Math.max(1, Math.ceil(13 / rowHeight));
      for (let r = 0; r < map.rows.length; r += every) ctx.fillText(map.rows[r], left - 4, top + (r + 0.5) * rowHeight);
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      const span = view.hi - view.lo;
      const step = Math.max(1, Math.pow(10, Math.floor(Math.log10(span / 8))));
      const nice = step * (span / step > 40 ? 5 : span / step > 16 ? 2 : 1);
      for (let t = Math.ceil(view.lo / nice) * nice; t <= view.hi; t += nice) {
        ctx.fillText(String(t), x(t), top + rowHeight * map.rows.length + 4);
      }
      ctx.fillText(map.xLabel, left + plotW / 2, height - 14);
      for (const [g, label] of map.topLabels || []) {
        ctx.save();
        ctx.translate(x(g), top + 2);
        ctx.fillStyle = "#444";
        ctx.font = "9px sans-serif";
        ctx.fillText(label, 0, 0);
        ctx.restore();
      }
      // colour bar
      const bx = width - right + 14, bh = rowHeight * map.rows.length;
      for (let i = 0; i < bh; i++) {
        ctx.fillStyle = colour(map.scale.kind, 0, 1, 1 - i / bh);
        ctx.fillRect(bx, top + i, 14, 1.5);
      }
      ctx.textAlign = "left";
      ctx.textBaseline = "middle";
      ctx.fillStyle = "#222";
      if (map.legend.length) {  // words at their values ("noise", "off", "10x off")
        const lo = Math.log10(map.scale.min), hi = Math.log10(map.scale.max);
        for (const [at, word] of map.legend)
          ctx.fillText(word, bx + 18, top + bh - (Math.log10(at) - lo) / (hi - lo) * bh);
      } else {
        ctx.fillText(String(map.scale.max), bx + 18, top + 5);
        ctx.fillText(String(map.scale.min), bx + 18, top + bh - 5);
      }
    }

    let dragFrom = null;
    canvas.addEventListener("mousedown", (e) => { dragFrom = e.offsetX; });
    canvas.addEventListener("mouseup", (e) => {
      if (dragFrom !== null && Math.abs(e.offsetX - dragFrom) > 6) {
        const a = tokenAt(Math.min(dragFrom, e.offsetX)), b = tokenAt(Math.max(dragFrom, e.offsetX));
        view.lo = Math.max(map.firstToken - 0.5, a);
        view.hi = Math.min(total - 0.5, Math.max(b, a + 2));
      }
      dragFrom = null;
      render();
    });
    canvas.addEventListener("dblclick", () => { view.lo = map.firstToken - 0.5; view.hi = total - 0.5; render(); });
    canvas.addEventListener("mouseleave", () => { tooltip.style.display = "none"; });
    canvas.addEventListener("mousemove", (e) => {
      if (dragFrom !== null) { render([dragFrom, e.offsetX]); return; }
      const r = Math.floor((e.offsetY - top) / rowHeight);
      const token = Math.round(tokenAt(e.offsetX));
      const c = Math.floor((token - map.firstToken) / map.tokensPerColumn);
      if (r < 0 || r >= map.rows.length || c < 0 || c >= map.columns || e.offsetX < left || e.offsetX > left + plotW) {
        tooltip.style.display = "none";
        return;
      }
      const v = map.values[r * map.columns + c];
      const head = map.heads ? map.heads[r * map.columns + c] : -1;
      const first = map.firstToken + c * map.tokensPerColumn;
      const tokens = map.tokensPerColumn > 1 ? "tokens " + first + "-" + (first + map.tokensPerColumn - 1) + " (worst)" : "token " + first;
      const text = map.tokenText && map.tokensPerColumn === 1 && map.tokenText[first] !== undefined ? " '" + map.tokenText[first] + "'" : "";
      tooltip.innerHTML = "<b>" + map.layerNames[r] + "</b><br>" + map.xName + " " + tokens.replace(/^tokens? /, "") + escapeHtml(text) +
        "<br>" + map.metric + ": " + (v === null ? "no data" : v) + (head >= 0 ? "<br>worst head: " + head : "") +
        (map.offThresholds && v !== null ? "<br>off above " + map.offThresholds[r].toPrecision(3) + " floors here (noise reaches it in one capture of a hundred): " +
          (v > map.offThresholds[r] ? "<b>off</b>" : v > 0.5 * map.offThresholds[r] ? "above noise, not off" : "noise") : "") +
        (map.spreadRows && map.spreadRows.includes(r) ? "<br><i>" + escapeHtml(map.spreadLabel) + ": the suspect starts there; this layer's error follows from it</i>" : "") +
        (map.onsetRow === r ? "<br><b>the suspect starts here</b>" : "");
      tooltip.style.left = (e.clientX + 14) + "px";
      tooltip.style.top = (e.clientY + 10) + "px";
      tooltip.style.display = "block";
    });
    render();
  }

  function escapeHtml(s) {
    return s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  }

  for (const map of data.maps) {
    const holder = document.getElementById("map-" + map.id);
    if (holder) drawMap(holder, map);
  }
  document.body.dataset.mapsDrawn = String(document.querySelectorAll("canvas[data-map]").length);
})();
