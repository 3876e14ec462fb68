"""The gold layer: transforms and stateful processors, no I/O."""
