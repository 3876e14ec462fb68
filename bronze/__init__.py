"""The bronze layer: transforms and stateful processors, no I/O."""
