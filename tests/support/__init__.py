"""Helpers the tests share: fake servers, synthetic runs and trend histories, the study's
probe, requests to the simulated replicas, the project's paths, the processes a test
started (found from /proc)."""
