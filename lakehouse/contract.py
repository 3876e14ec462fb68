"""The landing data contract (docs/architecture.md 7) in one place, for the code that parses it
(bronze), writes it (the generator) and checks it (verify, the oracle): the sources, each one's
fields and their JSON kinds, the fields it requires, its id and its event-time field, the event
types, and the name of the generator's manifest beside the landing files."""

from __future__ import annotations

SOURCES = ("events", "impressions", "clicks")
# name -> JSON kind, per source ("time": an ISO-8601 string)
FIELDS = {
    "events": {
        "event_id": "string",
        "user_id": "long",
        "event_type": "string",
        "page": "string",
        "amount": "double",
        "event_time": "time",
        "device": "string",
        "country": "string",
    },
    "impressions": {
        "impression_id": "string",
        "ad_id": "long",
        "campaign_id": "long",
        "user_id": "long",
        "impression_time": "time",
    },
    "clicks": {
        "click_id": "string",
        "impression_id": "string",
        "ad_id": "long",
        "user_id": "long",
        "click_time": "time",
    },
}
REQUIRED = {
    "events": ("event_id", "user_id", "event_time"),
    "impressions": ("impression_id", "ad_id", "campaign_id", "user_id", "impression_time"),
    "clicks": ("click_id", "impression_id", "ad_id", "user_id", "click_time"),
}
ID = {"events": "event_id", "impressions": "impression_id", "clicks": "click_id"}
# each source's event time: watermarks follow it, and its bronze table's files are in its order
EVENT_TIME = {"events": "event_time", "impressions": "impression_time", "clicks": "click_time"}
EVENT_TYPES = ("page_view", "search", "add_to_cart", "purchase")
MANIFEST = "_manifest.json"
