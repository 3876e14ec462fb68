"""``lakehouse report``: the HTML file drawn from ops.stream_progress and ops.runs."""

from __future__ import annotations

import datetime as dt
import re

from lakehouse.cli import main
from lakehouse.runner import PIPELINE, declared_tables, layer_flows
from lakehouse.runner.monitoring import ProgressRecorder, record_runs

UTC = dt.UTC
T = dt.datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _progress(flow, batch, seconds, rows, state=None, late=0):
    """A progress event as Spark's listener reports it."""
    operators = []
    if state is not None:
        operators = [
            {
                "operatorName": "dedupeWithinWatermark",
                "numRowsTotal": state,
                "numRowsUpdated": rows,
                "numRowsRemoved": 0,
                "memoryUsedBytes": 1024,
                "numRowsDroppedByWatermark": late,
                "customMetrics": {"numDroppedDuplicateRows": 2},
            }
        ]
    return {
        "name": flow,
        "id": f"q-{flow}",
        "runId": f"r-{flow}",
        "batchId": batch,
        "timestamp": (T + dt.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z"),
        "numInputRows": rows,
        "inputRowsPerSecond": 0.0,
        "processedRowsPerSecond": rows * 10.0,
        "batchDuration": 100 * (batch + 1),
        "durationMs": {"addBatch": 50},
        "eventTime": {"watermark": "2026-11-22T09:50:00.000Z"},
        "stateOperators": operators,
    }


def test_the_report_plots_every_flow_and_lists_the_last_runs(settings, tmp_path, capsys):
    recorder = ProgressRecorder(settings)
    for batch, (seconds, rows, state, late) in enumerate(
        [(0, 50, 10, 0), (5, 80, 20, 3), (9, 0, 15, 4)]
    ):
        recorder.record(_progress("silver.events", batch, seconds, rows, state, late))
    for batch, seconds in enumerate([1, 6]):
        recorder.record(_progress("bronze.events", batch, seconds, 100))
    record_runs(
        settings,
        [
            {
                "run_id": "r1",
                "flow": "silver.events",
                "started_at": T,
                "ended_at": T + dt.timedelta(seconds=10),
                "status": "failed",
                "batches": 2,
                "input_rows": 130,
                "error": "quality rule R (action fail) on silver.events: 1 row(s) break it",
            }
        ],
    )
    output = tmp_path / "out" / "report.html"
    assert main(["report", "--root", str(settings.root), "--output", str(output)]) == 0
    assert capsys.readouterr().out == f"report written to {output}\n"
    page = output.read_text()
    assert page.startswith("<!doctype html>") and "<script" not in page and "http" not in page
    charts = re.findall(r"<h3>([^<]+)</h3>", page)
    assert charts == [
        "Flow graph",
        "Throughput per micro-batch that read rows",
        "Micro-batch duration",
        "State rows per stateful operator",
        "Watermark lag (processing time minus event-time watermark)",
        "Rows dropped as late (behind the watermark), over every run",
        "Duplicates dropped, over every run",
        "Last run per flow",
    ]
    points = re.findall(r"<title>([^<]+)</title>", page)
    # the declared graph: a box per landing source and table, an arrow per input and output
    flows = [flow for layer in PIPELINE for flow in layer_flows(layer)]
    graph = re.search(r"<svg[^>]*aria-label='flow graph'>(.*?)</svg>", page).group(1)
    boxes = re.findall(r"<rect [^>]*/><text [^>]*>([^<]+)</text>", graph)
    assert sorted(boxes) == sorted(
        [*(t.split(".", 1)[1] for t in declared_tables()), "events", "impressions", "clicks"]
    )
    assert len(re.findall("<path ", graph)) == sum(len(f.inputs) * len(f.outputs) for f in flows)
    assert "silver.ad_attribution: bronze.clicks to silver.quarantine" in points
    # and per flow what it reads and writes, with its last micro-batch's state and watermark
    table = re.search(r"<table><tr><th>flow</th><th>reads</th>.*?</table>", page).group(0)
    rows = re.findall(r"<tr>((?:<td>[^<]*</td>)+)</tr>", table)
    cells = {r[0]: r for r in (re.findall(r"<td>([^<]*)</td>", row) for row in rows)}
    assert cells["silver.events"] == [
        "silver.events",
        "bronze.events",
        "silver.events, silver.quarantine, silver.late_events",
        "append",
        "dedupeWithinWatermark (15 state rows)",
        "2026-11-22 09:50:00",
        str(settings.checkpoint_path("silver", "events")),
    ]
    assert cells["bronze.events"][4:6] == ["none", "2026-11-22 09:50:00"]
    assert cells["gold.sessions"][4] == "no micro-batch recorded"
    assert cells["gold.user_activity_5m"][3] == "update, upserted by user_id, window_start"
    # throughput: only the micro-batches that read rows
    assert "silver.events 10:00:00: 500" in points and "silver.events 10:00:05: 800" in points
    assert "bronze.events 10:00:01: 1000" in points and "bronze.events 10:00:06: 1000" in points
    # duration of every micro-batch, in seconds
    assert "silver.events 10:00:09: 0.30" in points
    # state rows of the one operator, and the watermark lag (10:00:05 - 09:50 = 10.08 min)
    assert [p for p in points if p.startswith("silver.events #0 dedupeWithinWatermark")] == [
        "silver.events #0 dedupeWithinWatermark 10:00:00: 10",
        "silver.events #0 dedupeWithinWatermark 10:00:05: 20",
        "silver.events #0 dedupeWithinWatermark 10:00:09: 15",
    ]
    assert "silver.events 10:00:05: 10.08" in points
    assert ">7 rows</text>" in page  # 3 + 4 late rows
    assert ">6 rows</text>" in page  # 2 duplicates per micro-batch
    assert (
        "<td>silver.events</td><td>failed</td><td>2026-11-22 10:00:00</td><td>10.0</td>"
        "<td>2</td><td>130</td><td>quality rule R (action fail) on silver.events: 1 row(s) "
        "break it</td>"
    ) in page
