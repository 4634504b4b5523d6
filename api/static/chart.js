// A line chart on a canvas: no library. Points are [x, y]; redraw() after adding some.

export class LineChart {
  constructor(canvas, { label, color = "#2563eb", xLabel = "step", digits = 3 }) {
    Object.assign(this, { canvas, label, color, xLabel, digits });
    this.points = [];
    this.canvas.setAttribute("role", "img");
    this.redraw();
  }

  set(points) {
    this.points = points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
    this.redraw();
  }

  add(x, y) {
    if (!Number.isFinite(x) || !Number.isFinite(y)) return;
    const last = this.points[this.points.length - 1];
    if (last && last[0] === x) last[1] = y;
    else if (!last || x > last[0]) this.points.push([x, y]);
    this.redraw();
  }

  redraw() {
    const { canvas, points } = this;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 480;
    const height = canvas.clientHeight || 200;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    canvas.dataset.points = String(points.length);
    const last = points[points.length - 1];
    canvas.setAttribute("aria-label", last
      ? `${this.label}: ${points.length} points, last ${last[1].toFixed(this.digits)} at ${this.xLabel} ${last[0]}`
      : `${this.label}: no points yet`);
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    const pad = { left: 52, right: 12, top: 22, bottom: 28 };
    ctx.font = "12px system-ui, sans-serif";
    ctx.fillStyle = "#334155";
    ctx.fillText(this.label, pad.left, 14);
    if (!points.length) {
      ctx.fillStyle = "#64748b";
      ctx.fillText("waiting for data…", pad.left, height / 2);
      return;
    }
    const xs = points.map((p) => p[0]);
    const ys = points.map((p) => p[1]);
    const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
    if (y0 === y1) { y0 -= 0.5 * Math.abs(y0 || 1); y1 += 0.5 * Math.abs(y1 || 1); }
    const sx = (x) => pad.left + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (width - pad.left - pad.right);
    const sy = (y) => height - pad.bottom - ((y - y0) / (y1 - y0)) * (height - pad.top - pad.bottom);
    ctx.strokeStyle = "#cbd5e1";
    ctx.beginPath();
    ctx.moveTo(pad.left, pad.top);
    ctx.lineTo(pad.left, height - pad.bottom);
    ctx.lineTo(width - pad.right, height - pad.bottom);
    ctx.stroke();
    ctx.fillStyle = "#475569";
    ctx.fillText(y1.toFixed(this.digits), 4, pad.top + 4);
    ctx.fillText(y0.toFixed(this.digits), 4, height - pad.bottom);
    ctx.fillText(String(x0), pad.left, height - 8);
    const right = `${this.xLabel} ${x1}`;
    ctx.fillText(right, width - pad.right - ctx.measureText(right).width, height - 8);
    ctx.strokeStyle = this.color;
    ctx.fillStyle = this.color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    points.forEach(([x, y], i) => (i ? ctx.lineTo(sx(x), sy(y)) : ctx.moveTo(sx(x), sy(y))));
    ctx.stroke();
    if (points.length < 40) for (const [x, y] of points) ctx.fillRect(sx(x) - 2, sy(y) - 2, 4, 4);
  }
}
