"""The silver layer: transforms and stateful processors, no I/O."""
