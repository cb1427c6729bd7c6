"""Toy domain: small, fast sandboxed tasks whose correct action is one short command."""
