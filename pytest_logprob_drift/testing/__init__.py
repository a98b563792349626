"""Test-only runtimes and operators (CPU smoke). Nothing here is imported by planning."""
