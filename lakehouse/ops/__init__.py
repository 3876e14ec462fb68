"""Operating a lake: its state read from the runner's books and the Delta logs (status, the
report), a flow's state health, and table maintenance."""
