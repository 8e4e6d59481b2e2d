"""Shared helpers of the test suite (rigs and the composed-job world); no tests here."""
