"""IR tests: text and bundle round-trips, malformed input, verifier, interpreter."""
