"""Harness definitions, one small module each (data: install, command, environment)."""
