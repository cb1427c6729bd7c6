"""Domains: one Gymnasium env family per folder, a shared base env beside them."""
