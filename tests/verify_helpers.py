"""What ``lakehouse verify`` prints, for the tests that check a whole lake with it."""

from lakehouse.runner import declared_tables

# the last line when every table the flows declare equals its reference
ALL_EQUAL = f"verify: all {len(declared_tables())} tables equal the reference"
