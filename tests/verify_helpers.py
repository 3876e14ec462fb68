"""What ``lakehouse verify`` prints, for the tests that check a whole lake with it."""

from lakehouse.proof.verify import run_verify
from lakehouse.runner import declared_tables

# the last line when every table the flows declare equals its reference, none of them empty
ALL_EQUAL = f"verify: all {len(declared_tables())} tables equal the reference"


def verify_all_equal(settings, empty: tuple[str, ...] = ()) -> str:
    """Run verify on the lake of ``settings`` and fail unless every table equals its reference
    and holds rows, but the tables named in ``empty``, which must be empty on both sides (an
    empty table equals an empty reference and proves nothing, so a test names the ones it
    expects: silver.late_events on a lake with no late line). Verify's report."""
    import io

    report = io.StringIO()
    assert run_verify(settings, report) == 0, report.getvalue()
    text = report.getvalue()
    last = text.splitlines()[-1]
    head, _, names = last.partition(" of them empty on both sides, nothing compared: ")
    if empty:
        assert (head, sorted(names.split(", "))) == (f"{ALL_EQUAL}; {len(empty)}", sorted(empty)), (
            text
        )
    else:
        assert last == ALL_EQUAL, text
    return text


# A closing delivery starts this long after the last line of the lake's data arrived: past the
# longest watermark (watermarks.attribution, 5 hours) and its hour, so that it closes every
# window, hour, session and join of the data before it
CLOSING_GAP_HOURS = 7


def generate_closed(spark, settings, sink=None, **params) -> list[dict]:
    """Landing files (or Kafka records, with ``sink``) of ``params`` (lakehouse generate's, as
    gen.params_from_settings takes them), a third of the sessions of four or more events
    ending in purchases, then a closing delivery: 1,000 events and their ads
    CLOSING_GAP_HOURS after them, in one file per source, every session of four or more events
    a checkout (the bursts gold.purchase_alerts alerts on), a tenth of the records breaking a
    rule of silver's (for rows in silver.quarantine), nothing late. Its watermarks close everything
    before it, so every gold table has rows to compare, as :func:`verify_all_equal` requires.
    The two runs' manifest entries."""
    import copy
    import datetime as dt
    import io

    from lakehouse.progress import Progress
    from lakehouse.tools import generate as gen

    quiet = lambda label: Progress(label, io.StringIO())  # noqa: E731
    main = gen.params_from_settings(settings, **{"conversion": 0.3, **params})
    # (copied: a Kafka sink's books of a topic go on with its next run)
    entries = [copy.deepcopy(gen.generate(spark, settings.root, main, progress=quiet, sink=sink))]
    last = max(
        gen.parse_start(s["last_arrival"])
        for s in entries[0]["sources"].values()
        if s.get("last_arrival")
    )
    start = (last + dt.timedelta(hours=CLOSING_GAP_HOURS)).replace(
        minute=0, second=0, microsecond=0
    )
    closing = gen.params_from_settings(
        settings,
        # (about 400 impressions: clicks too, 1 to 6 a hundred, whose watermark the join
        # needs, and a few purchase bursts)
        events=1000,
        hours=0.5,
        start=start.isoformat().replace("+00:00", "Z"),
        file_minutes=24 * 60.0,
        seed=main.seed + 1,
        users=100,
        conversion=1.0,  # (every session of 4 or more events a checkout: purchase bursts)
        duplicate_fraction=0.0,
        disorder_fraction=0.0,
        late_fraction=0.0,
        malformed_fraction=0.0,
        invalid_fraction=0.1,
    )
    entries.append(gen.generate(spark, settings.root, closing, progress=quiet, sink=sink))
    return entries
