"""Post-assessment: pluggable ASR off the hot path, and metrics that are numbers only."""
