"""Proving the pipeline: every table checked against an independent batch computation
(verify), and the gold tables' batch reference (oracle), sharing no code with the flows."""
