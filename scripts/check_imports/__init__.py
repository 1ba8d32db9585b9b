"""The import-circle check of `scripts/check-imports` (see its help)."""
