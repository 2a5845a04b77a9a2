"""Per-op numeric tests against torch eager; every case goes through `checks.check_torch`."""
