"""``lakehouse report``: one self-contained HTML file with plots of the runner's books.

Read with delta-rs from ops.stream_progress, ops.runs and ops.quality_results (no Spark), drawn
as inline SVG (no script, no network, no plotting library): the declared flow graph with each
flow's last recorded watermark and state, throughput and micro-batch duration
over time per flow, state rows over time per stateful operator, watermark lag, quality pass
rates, rows dropped as late or duplicate, and the last run of each flow.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from lakehouse.flows import Flow, LandingInput
from lakehouse.ops.status import current_marks, last_runs, read_table
from lakehouse.redaction import redact
from lakehouse.runner.declarations import pipeline
from lakehouse.settings import Settings

COLORS = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
    "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
)  # fmt: skip
WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 30, 40


def _number(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.0f}k"
    if abs(value) >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2f}"


Series = pd.Series | list[pd.Series]


def line_chart(title: str, unit: str, series: dict[str, Series]) -> str:
    """An SVG line chart: one colour (lines with points) per series of values indexed by
    time; a series given as a list of segments (one per run) is not joined across them."""
    segments = {
        k: [v.dropna().sort_index() for v in (parts if isinstance(parts, list) else [parts])]
        for k, parts in series.items()
    }
    segments = {k: [v for v in parts if len(v)] for k, parts in segments.items()}
    segments = {k: parts for k, parts in segments.items() if parts}
    head = f"<h3>{html.escape(title)}</h3>"
    if not segments:
        return head + "<p class='empty'>no data recorded yet</p>"
    every = [v for parts in segments.values() for v in parts]
    times = pd.concat([v.index.to_series() for v in every])
    values = pd.concat(every)
    t0, t1 = times.min(), times.max()
    v0, v1 = min(0.0, float(values.min())), float(values.max())
    span_t = max((t1 - t0).total_seconds(), 1.0)
    span_v = (v1 - v0) or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t) -> float:
        return LEFT + (t - t0).total_seconds() / span_t * plot_w

    def y(v) -> float:
        return TOP + plot_h - (v - v0) / span_v * plot_h

    parts = [
        f"<svg width='{WIDTH}' height='{HEIGHT}' role='img' aria-label='{html.escape(title)}'>"
    ]
    for i in range(5):  # horizontal grid with labels
        v = v0 + span_v * i / 4
        parts.append(
            f"<line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{y(v):.1f}' y2='{y(v):.1f}' class='grid'/>"
            f"<text x='{LEFT - 6}' y='{y(v) + 4:.1f}' text-anchor='end'>{_number(v)}</text>"
        )
    parts.append(
        f"<text x='{LEFT}' y='{HEIGHT - 10}'>{t0:%Y-%m-%d %H:%M:%S}</text>"
        f"<text x='{WIDTH - RIGHT}' y='{HEIGHT - 10}' text-anchor='end'>{t1:%H:%M:%S} UTC</text>"
        f"<text x='{LEFT}' y='{TOP - 12}' class='unit'>{html.escape(unit)}</text>"
    )
    for n, (name, pieces) in enumerate(segments.items()):
        color = COLORS[n % len(COLORS)]
        for s in pieces:
            points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s.items())
            parts.append(
                f"<polyline points='{points}' fill='none' stroke='{color}' stroke-width='1.5'/>"
            )
            parts.extend(
                f"<circle cx='{x(t):.1f}' cy='{y(v):.1f}' r='2.5' fill='{color}'>"
                f"<title>{html.escape(name)} {t:%H:%M:%S}: {_number(v)}</title></circle>"
                for t, v in s.items()
            )
    parts.append("</svg>")
    legend = "".join(
        f"<span><i style='background:{COLORS[n % len(COLORS)]}'></i>{html.escape(name)}</span>"
        for n, name in enumerate(segments)
    )
    return head + "".join(parts) + f"<div class='legend'>{legend}</div>"


def bar_chart(title: str, unit: str, bars: dict[str, float]) -> str:
    """An SVG horizontal bar chart, one bar per name."""
    head = f"<h3>{html.escape(title)}</h3>"
    if not bars:
        return head + "<p class='empty'>no data recorded yet</p>"
    top = max(max(bars.values()), 1.0)
    label_w, row_h = 260, 22
    height = row_h * len(bars) + 10
    parts = [
        f"<svg width='{WIDTH}' height='{height}' role='img' aria-label='{html.escape(title)}'>"
    ]
    for i, (name, value) in enumerate(bars.items()):
        y = 5 + i * row_h
        w = (WIDTH - label_w - 90) * value / top
        parts.append(
            f"<text x='{label_w - 6}' y='{y + 15}' text-anchor='end'>{html.escape(name)}</text>"
            f"<rect x='{label_w}' y='{y + 3}' width='{w:.1f}' height='{row_h - 6}' "
            f"fill='{COLORS[i % len(COLORS)]}'/>"
            f"<text x='{label_w + w + 6:.1f}' y='{y + 15}'>{value:,.0f} {html.escape(unit)}</text>"
        )
    return head + "".join(parts) + "</svg>"


def _graph_nodes(flows: Sequence[Flow]) -> dict[str, list[str]]:
    """Per column (landing, then each layer), its nodes in declaration order, side outputs
    (a flow's second and later tables, such as the quarantines) after the main ones."""
    order: dict[str, tuple[int, int]] = {}
    for flow in flows:
        for source in flow.inputs:
            if isinstance(source, LandingInput):
                order.setdefault(f"landing.{source.source}", (0, len(order)))
        for n, output in enumerate(flow.outputs):
            order.setdefault(output.table, (int(n > 0), len(order)))
    columns: dict[str, list[str]] = {}
    for node in sorted(order, key=order.__getitem__):
        columns.setdefault(node.split(".")[0], []).append(node)
    return columns


def _sources(flow: Flow) -> list[str]:
    return [f"landing.{s.source}" if isinstance(s, LandingInput) else s.table for s in flow.inputs]


def flow_graph(flows: Sequence[Flow]) -> str:
    """The declared pipeline as an SVG: one column per layer (landing files first), a box per
    table, and per flow an arrow from each of its inputs to each table it writes, one colour
    per flow."""
    columns = _graph_nodes(flows)
    box_h, row_h = 22, 30
    # each column as wide as its longest name (11 px text: about 7 px a letter)
    widths = [max(90, 12 + 7 * max(len(n.split(".", 1)[1]) for n in c)) for c in columns.values()]
    gap = (WIDTH - sum(widths)) / max(len(columns) - 1, 1)
    lefts = [sum(widths[:c]) + c * gap for c in range(len(columns))]
    height = 30 + row_h * max(len(nodes) for nodes in columns.values())
    where = {
        node: (lefts[c], 26 + r * row_h, widths[c])
        for c, nodes in enumerate(columns.values())
        for r, node in enumerate(nodes)
    }
    parts = [f"<svg width='{WIDTH}' height='{height}' role='img' aria-label='flow graph'>"]
    parts.extend(
        f"<text x='{lefts[c] + 4:.1f}' y='14' class='unit'>{html.escape(name)}</text>"
        for c, name in enumerate(columns)
    )
    for n, flow in enumerate(flows):
        color = COLORS[n % len(COLORS)]
        for source in _sources(flow):
            for output in flow.outputs:
                (x0, y0, w0), (x1, y1, _) = where[source], where[output.table]
                x0, y0, y1 = x0 + w0, y0 + box_h / 2, y1 + box_h / 2
                middle = (x0 + x1) / 2
                parts.append(
                    f"<path d='M{x0:.1f},{y0:.1f} C{middle:.1f},{y0:.1f} {middle:.1f},{y1:.1f} "
                    f"{x1:.1f},{y1:.1f}' fill='none' stroke='{color}' stroke-width='1.5'>"
                    f"<title>{html.escape(flow.name)}: {html.escape(source)} to "
                    f"{html.escape(output.table)}</title></path>"
                )
    for node, (x, y, w) in where.items():
        label = node.split(".", 1)[1]
        parts.append(
            f"<rect x='{x:.1f}' y='{y}' width='{w}' height='{box_h}' rx='4' "
            f"fill='#f4f4f4' stroke='#999'/>"
            f"<text x='{x + 6:.1f}' y='{y + 15}'>{html.escape(label)}</text>"
        )
    parts.append("</svg>")
    legend = "".join(
        f"<span><i style='background:{COLORS[n % len(COLORS)]}'></i>{html.escape(f.name)}</span>"
        for n, f in enumerate(flows)
    )
    return "".join(parts) + f"<div class='legend'>{legend}</div>"


def flow_table(flows: Sequence[Flow], progress: pd.DataFrame, settings: Settings) -> str:
    """Per flow what ``lakehouse flows`` prints that needs no Spark: inputs, outputs, mode and
    keys, checkpoint; and from its last recorded micro-batch, its watermark and each stateful
    operator with its state rows (``lakehouse flows`` analyses the plan instead)."""
    last: dict[str, pd.DataFrame] = {}
    if not progress.empty:
        for flow, rows in progress.groupby("flow"):
            rows = rows[rows["timestamp"] == rows["timestamp"].max()]
            last[str(flow)] = rows
    body = []
    for flow in flows:
        mode = flow.modes
        rows = last.get(flow.name)
        operators, watermark = "no micro-batch recorded", ""
        if rows is not None:
            named = rows.dropna(subset=["operator"]).sort_values("operator_index")
            operators = (
                ", ".join(
                    f"{r.operator} ({int(r.state_rows):,} state rows)" for r in named.itertuples()
                )
                or "none"
            )
            mark = rows["watermark"].iloc[0]
            watermark = "" if pd.isna(mark) or mark.year <= 1970 else f"{mark:%Y-%m-%d %H:%M:%S}"
        cells = (
            flow.name,
            ", ".join(_sources(flow)),
            ", ".join(o.table for o in flow.outputs),
            mode,
            operators,
            watermark,
            str(settings.checkpoint_path(flow.layer, flow.flow)),
        )
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return (
        "<table><tr><th>flow</th><th>reads</th><th>writes</th><th>output mode</th>"
        "<th>stateful operators (last micro-batch)</th><th>watermark (UTC)</th>"
        f"<th>checkpoint</th></tr>{''.join(body)}</table>"
    )


def _batches(progress: pd.DataFrame) -> pd.DataFrame:
    """One row per micro-batch (the progress table has one per stateful operator)."""
    return progress.drop_duplicates(["run_id", "batch_id"]).set_index("timestamp").sort_index()


def _per_run(frame: pd.DataFrame, flow: str, column: str) -> list[pd.Series]:
    """A flow's values of ``column``, one segment per query run."""
    mine = frame[frame["flow"] == flow]
    return [group[column] for _, group in mine.groupby("run_id", sort=False)]


def build_report(settings: Settings) -> str:
    """The report of the lake under ``settings`` as one HTML page."""
    progress = read_table(settings, "ops.stream_progress")
    runs = read_table(settings, "ops.runs")
    quality = read_table(settings, "ops.quality_results")
    declared = list(pipeline().flows)
    sections = [
        "<h3>Flow graph</h3>",
        flow_graph(declared),
        flow_table(declared, progress, settings),
        _progress_charts(progress),
        _quality_chart(quality),
        _marks_table(current_marks(settings)),
        _runs_table(runs),
    ]
    return _page(settings, sections)


def _progress_charts(progress: pd.DataFrame) -> str:
    """The charts of ops.stream_progress, or a note that no micro-batch is recorded yet."""
    if progress.empty:
        return "<p class='empty'>no micro-batch recorded yet: run a layer first</p>"
    batches = _batches(progress)
    flows = sorted(batches["flow"].unique())
    operators = progress.dropna(subset=["operator"]).set_index("timestamp").sort_index()
    return (
        _throughput_chart(batches, flows)
        + _duration_chart(batches, flows)
        + _state_chart(operators)
        + _lag_chart(batches, flows)
        + _drop_charts(operators)
    )


def _throughput_chart(batches: pd.DataFrame, flows: list[str]) -> str:
    """Rows per second of each flow, over the micro-batches that read rows."""
    with_rows = batches[batches["input_rows"] > 0]
    return line_chart(
        "Throughput per micro-batch that read rows",
        "rows/s",
        {f: _per_run(with_rows, f, "processed_rows_per_second") for f in flows},
    )


def _duration_chart(batches: pd.DataFrame, flows: list[str]) -> str:
    """Seconds each micro-batch of each flow took."""
    seconds = batches.assign(seconds=batches["batch_duration_ms"] / 1000)
    return line_chart(
        "Micro-batch duration", "seconds", {f: _per_run(seconds, f, "seconds") for f in flows}
    )


def _state_chart(operators: pd.DataFrame) -> str:
    """State rows of each stateful operator over time."""
    groups = operators.groupby(["flow", "operator_index", "operator"])
    return line_chart(
        "State rows per stateful operator",
        "rows",
        {
            f"{flow} #{int(index)} {name}": _per_run(group, flow, "state_rows")
            for (flow, index, name), group in groups
        },
    )


def _lag_chart(batches: pd.DataFrame, flows: list[str]) -> str:
    """How far each flow's event-time watermark is behind processing time, in minutes."""
    lag = (batches.index.to_series() - batches["watermark"]).dt.total_seconds() / 60
    watermarked = batches.assign(lag=lag)[batches["watermark"].dt.year > 1970]
    return line_chart(
        "Watermark lag (processing time minus event-time watermark)",
        "minutes",
        {f: _per_run(watermarked, f, "lag") for f in flows},
    )


def _drop_charts(operators: pd.DataFrame) -> str:
    """Per flow, the rows its stateful operators dropped as late, then as duplicates."""
    drops = operators.groupby("flow")[["rows_dropped_by_watermark", "duplicates_dropped"]].sum()
    late = bar_chart(
        "Rows dropped as late (behind the watermark), over every run",
        "rows",
        {f: float(r.rows_dropped_by_watermark) for f, r in drops.iterrows()},
    )
    duplicates = bar_chart(
        "Duplicates dropped, over every run",
        "rows",
        {f: float(r.duplicates_dropped) for f, r in drops.iterrows()},
    )
    return late + duplicates


def _quality_chart(quality: pd.DataFrame) -> str:
    """Per table and micro-batch, the share of (row, rule) checks that passed; "" when
    ops.quality_results is empty."""
    if quality.empty:
        return ""
    checks = quality.groupby(["table", "batch_id"], as_index=False).agg(
        at=("validated_at", "max"),
        checked=("element_count", "sum"),
        failed=("unexpected_count", "sum"),
    )
    checks = checks[checks["checked"] > 0]
    checks = checks.assign(passed=1 - checks["failed"] / checks["checked"])
    return line_chart(
        "Quality pass rate per table (checks of a row against a rule that passed)",
        "share",
        {t: g.set_index("at")["passed"] for t, g in checks.groupby("table")},
    )


def _cells(values: Sequence) -> str:
    """One HTML table row, each value as text."""
    return "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in values) + "</tr>"


def _marks_table(marks: pd.DataFrame) -> str:
    """Up to when each gold table's rows are final (:func:`current_marks`); "" when none is."""
    if marks.empty:
        return ""
    rows = "".join(
        _cells((r.table, r.column, f"{r.complete_through:%Y-%m-%d %H:%M:%S}", r.flow))
        for r in marks.itertuples()
    )
    return (
        "<h3>Gold rows final before (ops.completeness)</h3><table><tr><th>table</th>"
        "<th>rows whose</th><th>are before (UTC)</th><th>flow</th></tr>"
        f"{rows}</table>"
    )


def _runs_table(runs: pd.DataFrame) -> str:
    """The last run of each flow (ops.runs); "" when none is recorded."""
    if runs.empty:
        return ""
    rows = "".join(
        _cells(
            (
                r.flow,
                r.status,
                f"{r.started_at:%Y-%m-%d %H:%M:%S}",
                f"{(r.ended_at - r.started_at).total_seconds():.1f}",
                r.batches,
                f"{r.input_rows:,}",
                redact(r.error or ""),  # (rows recorded before secrets were redacted)
            )
        )
        for r in last_runs(runs).itertuples()
    )
    return (
        "<h3>Last run per flow</h3><table><tr><th>flow</th><th>status</th>"
        "<th>started (UTC)</th><th>seconds</th><th>batches</th><th>input rows</th>"
        f"<th>error</th></tr>{rows}</table>"
    )


def _page(settings: Settings, sections: Sequence[str]) -> str:
    """The HTML page around ``sections``: its style, title and when it was written."""
    now = dt.datetime.now(dt.UTC)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lakehouse report</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 820px; }}
h1 {{ font-size: 22px; }} h3 {{ margin: 28px 0 6px; font-size: 16px; }}
svg text {{ font-size: 11px; fill: #444; }} svg .unit {{ font-weight: bold; }}
svg .grid {{ stroke: #e4e4e4; }}
.legend span {{ margin-right: 14px; font-size: 12px; white-space: nowrap; }}
.legend i {{ display: inline-block; width: 10px; height: 10px; margin-right: 4px; }}
table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; }}
.empty {{ color: #888; }}
</style></head><body>
<h1>lakehouse report</h1>
<p>lake {html.escape(str(settings.root))}, written {now:%Y-%m-%d %H:%M:%S} UTC</p>
{"".join(sections)}
</body></html>
"""


def write_report(settings: Settings, output: Path) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(build_report(settings))
    return output
