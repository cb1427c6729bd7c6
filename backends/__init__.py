"""Sandbox backends: each decides only how the agent is started and reached."""
