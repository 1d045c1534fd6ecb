#!/usr/bin/python3
"""The bench scripts' figures, as SVG files written with the standard library alone.

  plot.py run RESULTS_DIR       bench/run.sh's results (summary.tsv, percentiles.tsv,
                                writes.tsv): for claim_complete and partitions, the throughput
                                by clients of each implementation and the latency percentiles
                                at each client count; WAL and table writes per request
  plot.py simulate RESULTS_DIR  bench/simulate.sh's results (periods.tsv): per period, each
                                design's claims p99, table + index size, dead tuples, WAL and
                                the expiry's own statement time

The figures go to RESULTS_DIR/figures/*.svg; their names are printed. The drawing (scales,
ticks, the two kinds of chart) is pure and unit-tested (bench/test_plot.py); the readers at
the end only pick columns out of the bench scripts' tables.
"""
import csv
import math
import os
import sys
from html import escape

WIDTH, HEIGHT = 720, 360
LEFT, RIGHT, TOP, BOTTOM = 76, 170, 40, 52
# Colour-blind-safe (Okabe and Ito), then greys.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#999999", "#666666"]


# --- scales and ticks -------------------------------------------------------------------------

def nice_step(span, count):
    """The 1, 2 or 5 times a power of ten closest above span / count."""
    if span <= 0:
        return 1.0
    raw = span / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw * (1 - 1e-9):
            return m * power
    return 10 * power


def nice_ticks(lo, hi, count=5):
    """Evenly spaced round ticks from at most lo to at least hi (about count intervals)."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        hi = lo + 1
    step = nice_step(hi - lo, count)
    first = math.floor(lo / step + 1e-9) * step
    ticks, t = [], first
    while t < hi - 1e-9 * step:
        ticks.append(round(t, 12))
        t += step
    ticks.append(round(t, 12))
    return ticks


def log_ticks(lo, hi):
    """Powers of ten from at most lo to at least hi (lo > 0); with 2 and 5 between them when
    the range spans two decades or less."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if b == a:
        b += 1
    ticks = []
    for e in range(a, b + 1):
        ticks.append(10.0 ** e)
        if b - a <= 2 and e < b:
            ticks += [2 * 10.0 ** e, 5 * 10.0 ** e]
    return sorted(ticks)


def nines(p):
    """The position of percentile p (0-100) on a "nines" axis: 90 -> 1, 99 -> 2, 99.9 -> 3."""
    return -math.log10(max(1 - p / 100, 1e-6))


class Scale:
    """Maps values from [lo, hi] to pixels [a, b]: linear, log (values > 0) or nines (percentiles)."""

    def __init__(self, lo, hi, a, b, kind="linear"):
        self.kind, self.a, self.b = kind, a, b
        self.lo, self.hi = self.t(lo), self.t(hi)
        if self.hi == self.lo:
            self.hi = self.lo + 1

    def t(self, v):
        if self.kind == "log":
            return math.log10(v)
        if self.kind == "nines":
            return nines(v)
        return v

    def __call__(self, v):
        return self.a + (self.t(v) - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def label(v):
    """A short tick label: 1500 -> 1.5k, 2000000 -> 2M, 0.05 -> 0.05."""
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    if a == 0:
        return "0"
    return f"{v:.3g}"


# --- SVG --------------------------------------------------------------------------------------

def _text(x, y, s, anchor="middle", size=12, extra=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f"{escape(str(s))}</text>")


def _frame(title, y_title, x_title=""):
    middle = (TOP + HEIGHT - BOTTOM) / 2
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
             _text(LEFT, 22, title, anchor="start", size=14, extra=' font-weight="bold"'),
             _text(16, middle, y_title, extra=f' transform="rotate(-90 16 {middle})"')]
    if x_title:
        parts.append(_text((LEFT + WIDTH - RIGHT) / 2, HEIGHT - 10, x_title))
    return parts


def _y_axis(parts, scale, ticks):
    for t in ticks:
        y = scale(t)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(_text(LEFT - 6, y + 4, label(t), anchor="end"))
    bottom = HEIGHT - BOTTOM
    parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}" stroke="#333"/>')
    parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}" stroke="#333"/>')


def colour_of(names, colours=None):
    """Each name's colour: from colours where it names one, else the palette in order."""
    colours = colours or {}
    return {n: colours.get(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)}


def _legend(parts, colours):
    for i, (name, colour) in enumerate(colours.items()):
        y = TOP + 6 + i * 18
        parts.append(f'<rect x="{WIDTH - RIGHT + 12}" y="{y}" width="12" height="12" fill="{colour}"/>')
        parts.append(_text(WIDTH - RIGHT + 30, y + 10, name, anchor="start"))


def bar_chart(title, categories, series, values, y_title, x_title="", colours=None):
    """Grouped bars: one group per category along x, one bar per series in each group;
    values[(category, series)] a number or missing; colours: series -> colour (optional).
    Returns the SVG text."""
    colours = colour_of(series, colours)
    present = [v for v in values.values() if v is not None and not math.isnan(v)]
    ticks = nice_ticks(min(0.0, *present) if present else 0.0, max(present) if present else 1.0)
    y = Scale(ticks[0], ticks[-1], HEIGHT - BOTTOM, TOP)
    parts = _frame(title, y_title, x_title)
    _y_axis(parts, y, ticks)
    width = (WIDTH - RIGHT - LEFT) / max(len(categories), 1)
    bar = width * 0.8 / max(len(series), 1)
    for ci, c in enumerate(categories):
        x0 = LEFT + ci * width + width * 0.1
        for si, s in enumerate(series):
            v = values.get((c, s))
            if v is None or math.isnan(v):
                continue
            top, base = y(max(v, 0)), y(min(v, 0))
            parts.append(f'<rect x="{x0 + si * bar:.1f}" y="{top:.1f}" width="{bar * 0.92:.1f}" '
                         f'height="{max(base - top, 0.5):.1f}" fill="{colours[s]}">'
                         f"<title>{escape(f'{s}, {c}: {v:,.4g}')}</title></rect>")
        parts.append(_text(LEFT + ci * width + width / 2, HEIGHT - BOTTOM + 18, c))
    _legend(parts, colours)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def line_chart(title, lines, y_title, x_title="", x_kind="linear", y_kind="linear", x_ticks=None, x_labels=None,
               colours=None):
    """Lines through points: lines is [(name, [(x, y), ...])]; a log axis leaves out values <= 0;
    x_ticks / x_labels: the x axis's ticks and their labels (default: round ticks); colours:
    name -> colour (optional). Returns the SVG text."""
    colours = colour_of([name for name, _ in lines], colours)
    def usable(v, kind):
        return v is not None and not math.isnan(v) and (kind != "log" or v > 0)

    pts = [(x, y) for _, p in lines for x, y in p if usable(x, x_kind) and usable(y, y_kind)]
    xs, ys = [x for x, _ in pts] or [0, 1], [y for _, y in pts] or [0, 1]
    if y_kind == "log":
        y_ticks = log_ticks(min(ys), max(ys))
    else:
        y_ticks = nice_ticks(min(0.0, min(ys)), max(ys))
    if x_ticks is None:
        x_ticks = log_ticks(min(xs), max(xs)) if x_kind == "log" else nice_ticks(min(xs), max(xs), 6)
    x_lo, x_hi = min(x_ticks[0], min(xs)), max(x_ticks[-1], max(xs))
    y = Scale(y_ticks[0], y_ticks[-1], HEIGHT - BOTTOM, TOP, y_kind)
    x = Scale(x_lo, x_hi, LEFT, WIDTH - RIGHT, x_kind)
    parts = _frame(title, y_title, x_title)
    _y_axis(parts, y, y_ticks)
    for i, t in enumerate(x_ticks):
        parts.append(_text(x(t), HEIGHT - BOTTOM + 18, x_labels[i] if x_labels else label(t)))
    for name, p in lines:
        p = [(a, b) for a, b in p if usable(a, x_kind) and usable(b, y_kind)]
        if not p:
            continue
        colour = colours[name]
        path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in p)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for a, b in p:
            parts.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="2.5" fill="{colour}">'
                         f"<title>{escape(f'{name}: {label(a)}, {b:,.4g}')}</title></circle>")
    _legend(parts, colours)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# --- the bench scripts' tables ----------------------------------------------------------------

def read_tsv(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return float("nan")


def write(out_dir, name, svg, made):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        f.write(svg)
    made.append(path)


# The scenarios of run.sh that get figures (issues 34 and 35), and the names of its implementations.
RUN_SCENARIOS = ["claim_complete", "partitions"]
NAMES = {"ext": "extension", "ext_deferred": "ext, deferred", "ext_committed": "ext, committed first",
         "ext_spi": "ext, SPI read", "peer": "PL/pgSQL peer", "floor": "raw SQL floor", "portable": "portable",
         "limit": "one bare INSERT", "p1": "1 period", "p3": "3 periods"}
ORDER = list(NAMES)
# One colour per implementation in every figure.
COLOURS = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(NAMES.values())}


def plot_run(results):
    made, figures = [], os.path.join(results, "figures")
    summary = read_tsv(os.path.join(results, "summary.tsv"))
    majors = sorted({r["pg"] for r in summary})
    for pg in majors:
        suffix = f"-pg{pg}" if len(majors) > 1 else ""
        for scenario in RUN_SCENARIOS:
            rows = [r for r in summary if r["pg"] == pg and r["scenario"] == scenario]
            if not rows:
                continue
            impls = sorted({r["impl"] for r in rows}, key=ORDER.index)
            clients = sorted({int(r["clients"]) for r in rows})
            values = {(f"{r['clients']} clients", NAMES[r["impl"]]): num(r["tps"]) for r in rows}
            write(figures, f"{scenario}-throughput{suffix}.svg",
                  bar_chart(f"{scenario}: throughput by clients{' (PostgreSQL ' + pg + ')' if pg else ''}",
                            [f"{c} clients" for c in clients], [NAMES[i] for i in impls], values,
                            "transactions per second", colours=COLOURS), made)
        pct = [r for r in read_tsv(os.path.join(results, "percentiles.tsv")) if r["pg"] == pg]
        cols = [c for c in (pct[0].keys() if pct else []) if c.startswith("p") and c.endswith("_ms") and c != "p100_ms"]
        ps = [float(c[1:-3]) for c in cols]
        for scenario in RUN_SCENARIOS:
            for c in sorted({int(r["clients"]) for r in pct if r["scenario"] == scenario}):
                rows = sorted((r for r in pct if r["scenario"] == scenario and int(r["clients"]) == c),
                              key=lambda r: ORDER.index(r["impl"]))
                lines = [(NAMES[r["impl"]], [(p, num(r[col])) for p, col in zip(ps, cols, strict=True)]) for r in rows]
                ticks = [p for p in (50, 90, 99, 99.9) if p <= max(ps, default=0)]
                write(figures, f"{scenario}-latency-c{c}{suffix}.svg",
                      line_chart(f"{scenario}, {c} clients: latency by percentile", lines, "ms (log scale)",
                                 "percentile", x_kind="nines", y_kind="log", x_ticks=ticks,
                                 x_labels=[f"p{t:g}" for t in ticks], colours=COLOURS), made)
    writes = read_tsv(os.path.join(results, "writes.tsv"))
    for pg in sorted({r["pg"] for r in writes}):
        rows = sorted((r for r in writes if r["pg"] == pg), key=lambda r: ORDER.index(r["impl"]))
        suffix = f"-pg{pg}" if len({r["pg"] for r in writes}) > 1 else ""
        names = [NAMES[r["impl"]] for r in rows]
        wal = {("WAL", NAMES[r["impl"]]): num(r["wal_bytes"]) / num(r["transactions"]) for r in rows}
        write(figures, f"claim_complete-wal{suffix}.svg",
              bar_chart("claim_complete: WAL per request (warm pages)", ["WAL"], names, wal, "bytes per request",
                        colours=COLOURS), made)
        counts = {}
        for r in rows:
            n = num(r["transactions"])
            for col, what in (("upd", "updates"), ("del", "deletes"), ("dead", "dead tuples")):
                counts[(what, NAMES[r["impl"]])] = num(r[col]) / n
        write(figures, f"claim_complete-dead-tuples{suffix}.svg",
              bar_chart("claim_complete: updates, deletes, dead tuples per request",
                        ["updates", "deletes", "dead tuples"], names, counts, "per request", colours=COLOURS), made)
    return made


# simulate.sh's periods.tsv: one row per design and period. (column, title, unit, divisor)
MB = 1048576
SIM_FIGURES = [("p99_ms", "claims' p99 per period", "ms", 1),
               ("total_bytes", "table + index size at the end of each period", "MB", MB),
               ("dead_tuples", "dead tuples at the end of each period", "n_dead_tup", 1),
               ("wal_bytes", "WAL per period", "MB", MB),
               ("expiry_ms", "the expiry's own statement time per period (sweeps)", "ms", 1)]


def plot_simulate(results):
    made, figures = [], os.path.join(results, "figures")
    rows = read_tsv(os.path.join(results, "periods.tsv"))
    days = read_tsv(os.path.join(results, "days.tsv"))
    designs = list(dict.fromkeys(r["design"] for r in rows))
    for col, title, unit, divisor in SIM_FIGURES:
        lines = [(d, [(num(r["day"]), num(r[col]) / divisor) for r in rows if r["design"] == d]) for d in designs]
        if col == "total_bytes":  # and what the live records take on their own, at each day's end
            lines += [(f"live ({d})", [(num(r["day"]), num(r["live_bytes"]) / MB)
                                                        for r in days if r["design"] == d]) for d in designs]
        write(figures, f"simulate-{col.replace('_', '-')}.svg",
              line_chart(f"Simulation: {title}", lines, unit, "simulated days"), made)
    return made


def main(argv):
    if len(argv) == 2 and argv[0] in ("run", "simulate"):
        made = plot_run(argv[1]) if argv[0] == "run" else plot_simulate(argv[1])
        for path in made:
            print(f"figure: {path}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
