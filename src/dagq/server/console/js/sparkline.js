// A throughput sparkline: runs finished per bucket of time, as a small SVG polyline.
import { s } from "./dom.js";

/** `times` (epoch seconds) counted in `buckets` buckets over the last `span` seconds. */
export function sparkline(times, { span = 3600, buckets = 30, width = 180, height = 32, label = "" } = {}) {
  const now = Date.now() / 1000;
  const counts = new Array(buckets).fill(0);
  for (const t of times) {
    const k = Math.floor(((t - (now - span)) / span) * buckets);
    if (k >= 0 && k < buckets) counts[k]++;
  }
  const top = Math.max(1, ...counts);
  const step = width / (buckets - 1);
  const points = counts.map((c, k) => `${(k * step).toFixed(1)},${(height - 2 - (c / top) * (height - 4)).toFixed(1)}`);
  const total = counts.reduce((a, b) => a + b, 0);
  return s(
    "svg",
    { class: "sparkline", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `${label}${total} in the last ${span / 60} minutes` },
    s("title", {}, `${label}${total} in the last ${span / 60} minutes (peak ${top} per ${Math.round(span / buckets / 60)} min)`),
    s("polyline", { points: points.join(" "), fill: "none" }),
  );
}
